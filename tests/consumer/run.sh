#!/usr/bin/env bash
# Builds tests/consumer/project against ddp-cpp twice: from the build tree, and from an
# install prefix made with `cmake --install`. Usage: run.sh <ddp build dir> <work dir>
set -euo pipefail
build=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"

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
rm -rf "$work"
