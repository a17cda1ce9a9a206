#!/bin/bash
# Writes $PID_DIR/ready.<rank>, then waits. On SIGINT or SIGTERM it writes
# $PID_DIR/<signal>.<rank> and exits 0; with IGNORE_INT=1 it ignores SIGINT.
set -u
if [ "${IGNORE_INT:-0}" = 1 ]; then
  trap '' INT
else
  trap 'echo got > "$PID_DIR/INT.$RANK"; exit 0' INT
fi
trap 'echo got > "$PID_DIR/TERM.$RANK"; exit 0' TERM
echo $$ > "$PID_DIR/rank$RANK.pid"
touch "$PID_DIR/ready.$RANK"
while true; do
  sleep 1000 &
  wait $!
done
