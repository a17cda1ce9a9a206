#!/bin/bash
# Every rank records its pid and that of a background grandchild in $PID_DIR.
# Rank $FAIL_RANK (if set) waits until all ranks are up, prints $FAIL_LINES
# lines to stderr and exits $FAIL_CODE; the others sleep. A rank listed in
# $IGNORE_TERM_RANKS ignores SIGTERM (so only SIGKILL ends it); with
# ESCAPE=1 each rank also starts, in a new session, a shell with a child.
set -u
: "${FAIL_RANK:=-1}" "${FAIL_CODE:=3}" "${FAIL_LINES:=12}" "${IGNORE_TERM_RANKS:=}" "${ESCAPE:=0}"
sleep 1000 &
echo $! > "$PID_DIR/grandchild$RANK.pid"
if [ "$ESCAPE" = 1 ]; then
  setsid bash -c 'sleep 1000 & echo $! > "$PID_DIR/escapedchild$RANK.pid"; wait' </dev/null >/dev/null 2>&1 &
  echo $! > "$PID_DIR/escaped$RANK.pid"
fi
echo $$ > "$PID_DIR/rank$RANK.pid"
echo "rank $RANK is up"
if [ "$RANK" = "$FAIL_RANK" ]; then
  want=$(( WORLD_SIZE * (2 * ESCAPE + 2) ))
  for _ in $(seq 400); do
    [ "$(ls "$PID_DIR" | grep -c '\.pid$')" -ge "$want" ] && break
    sleep 0.05
  done
  for i in $(seq "$FAIL_LINES"); do echo "rank $RANK error line $i" >&2; done
  date +%s.%N > "$PID_DIR/fail_time"
  exit "$FAIL_CODE"
fi
for r in $IGNORE_TERM_RANKS; do
  [ "$r" = "$RANK" ] && trap '' TERM
done
sleep 1000
