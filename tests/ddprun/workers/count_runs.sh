#!/bin/bash
# Appends "<rank> <restart count> <rendezvous dir>" to $COUNT_FILE. Rank 1
# fails with $FAIL_CODE while TORCHELASTIC_RESTART_COUNT < $SUCCEED_FROM
# (never succeeds when SUCCEED_FROM=never).
set -u
echo "$RANK $TORCHELASTIC_RESTART_COUNT ${DDP_RENDEZVOUS_DIR:-none}" >> "$COUNT_FILE"
echo "rank $RANK attempt $TORCHELASTIC_RESTART_COUNT"
if [ "$RANK" = 1 ]; then
  sleep 0.2
  if [ "$SUCCEED_FROM" = never ] || [ "$TORCHELASTIC_RESTART_COUNT" -lt "$SUCCEED_FROM" ]; then
    echo "rank 1 fails in attempt $TORCHELASTIC_RESTART_COUNT" >&2
    exit "$FAIL_CODE"
  fi
fi
sleep 0.5
