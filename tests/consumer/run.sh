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
  # The LibTorch, build type, debug information and compiler launcher of the ddp-cpp
  # build under test. The library compiles here once more, with the same commands: its
  # precompiled header and unity units sit in the top build folder (cmake/ddpBuildSpeed.cmake)
  # and this one sits beside the build under test (the same depth: the same relative
  # paths to the sources), with the cache settings scripts/build uses. So a compiler
  # cache answers for all of it.
  cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
  src=$(cd "$here/../.." && pwd)
  args=(-DDDP_SOURCE_DIR="$src" -DTorch_DIR="$(cache Torch_DIR)"
        -DCMAKE_BUILD_TYPE="$(cache CMAKE_BUILD_TYPE)"
        -DDDP_DEBUG_INFO="$(cache DDP_DEBUG_INFO)" -DDDP_PROGRAM_DEBUG_INFO="$(cache DDP_PROGRAM_DEBUG_INFO)")
  launcher=$(cache CMAKE_CXX_COMPILER_LAUNCHER)
  [[ -n $launcher ]] && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
  sub="$(dirname "$(cd "$build" && pwd)")/$(basename "$build")-subproject"
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$src} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  rm -rf "$sub"
  trap 'rm -rf "$sub" "$work"' EXIT
  echo "== as a subproject (FetchContent)"
  cmake -S "$here/subproject" -B "$sub" -G Ninja "${args[@]}" >"$work/configure.log" \
    || { cat "$work/configure.log"; exit 1; }
  ninja -C "$sub" consumer >"$work/build.log" || { tail -50 "$work/build.log"; exit 1; }
  "$sub/consumer"
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
