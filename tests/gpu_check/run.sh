#!/usr/bin/env bash
# run.sh <ddprun> <gpu_check> cpu|cuda <nproc> [gpu_check args...]
set -euo pipefail
ddprun=$1 prog=$2 kind=$3 nproc=$4
shift 4
if [ "$kind" = cuda ] && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU is visible on this machine (/dev/nvidia0 missing); run scripts/gpu-check on one"
  exit 77
fi
OMP_NUM_THREADS=1 exec "$ddprun" --nproc-per-node "$nproc" -- "$prog" "$@"
