#!/usr/bin/env bash
# Builds tests/consumer/project against ddp-cpp twice: from the build tree, and from an
# install prefix made with `cmake --install`. With --subproject, builds
# tests/consumer/subproject instead, which pulls ddp-cpp's sources in with FetchContent.
# Usage: run.sh [--subproject] <ddp build dir> <work dir>
set -euo pipefail
subproject=0
if [[ ${1:-} == --subproject ]]; then subproject=1; shift; fi
build=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"

if (( subproject )); then
  # The LibTorch, build type and compiler launcher of the ddp-cpp build under test.
  cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
  args=(-DDDP_SOURCE_DIR="$(cd "$here/../.." && pwd)" -DTorch_DIR="$(cache Torch_DIR)"
        -DCMAKE_BUILD_TYPE="$(cache CMAKE_BUILD_TYPE)")
  launcher=$(cache CMAKE_CXX_COMPILER_LAUNCHER)
  [[ -n $launcher ]] && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
  echo "== as a subproject (FetchContent)"
  cmake -S "$here/subproject" -B "$work/subproject" -G Ninja "${args[@]}" >"$work/configure.log" \
    || { cat "$work/configure.log"; exit 1; }
  ninja -C "$work/subproject" consumer >/dev/null
  "$work/subproject/consumer"
  rm -rf "$work"
  exit 0
fi

echo "== from the build tree"
cmake -S "$here/project" -B "$work/from-build" -G Ninja -Dddp_DIR="$build" >/dev/null
ninja -C "$work/from-build" >/dev/null
"$work/from-build/consumer"

echo "== from an install prefix"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$here/project" -B "$work/from-install" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
ninja -C "$work/from-install" >/dev/null
"$work/from-install/consumer"
test -f "$work/prefix/include/ddp/ddp.h"
test -f "$work/prefix/include/ddp/data/distributed_sampler.h"
test -f "$work/prefix/include/ddp/sampler.h"
rm -rf "$work"
