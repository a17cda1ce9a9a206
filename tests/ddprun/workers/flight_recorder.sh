#!/bin/bash
# Appends "<rank> <restart count> <flight recorder dir> <dir|missing>" to $COUNT_FILE: the
# DDP_FLIGHT_RECORDER_DIR this rank was given and whether that folder exists. Ranks in
# $WRITE_RANKS write flight_recorder.rank<RANK>.json there with one collective, ranks in
# $EMPTY_RANKS one without any, as the library writes it at shutdown (in attempts before
# $SUCCEED_FROM, default every one); rank $FAIL_RANK exits 3 in those attempts once every
# rank of the attempt has reported.
set -u
: "${WRITE_RANKS:=}" "${EMPTY_RANKS:=}" "${FAIL_RANK:=-1}" "${SUCCEED_FROM:=1000000}"
attempt=$TORCHELASTIC_RESTART_COUNT
dir=${DDP_FLIGHT_RECORDER_DIR-unset}
if [ "$attempt" -lt "$SUCCEED_FROM" ]; then
  for r in $WRITE_RANKS; do
    [ "$r" = "$RANK" ] && echo '{"entries": [{"seq": 1, "op": "all_reduce"}]}' > "$dir/flight_recorder.rank$RANK.json"
  done
  for r in $EMPTY_RANKS; do
    [ "$r" = "$RANK" ] && printf '{"rank": %s, "reason": "shutdown",\n "entries": [\n]}\n' "$RANK" > "$dir/flight_recorder.rank$RANK.json"
  done
fi
[ -d "$dir" ] && state=dir || state=missing
echo "$RANK $attempt ${dir:-empty} $state" >> "$COUNT_FILE"
if [ "$RANK" = "$FAIL_RANK" ] && [ "$attempt" -lt "$SUCCEED_FROM" ]; then
  for _ in $(seq 400); do
    [ "$(awk -v a="$attempt" '$2 == a' "$COUNT_FILE" | wc -l)" -ge "$WORLD_SIZE" ] && break
    sleep 0.05
  done
  echo "rank $RANK fails in attempt $attempt" >&2
  exit 3
fi
