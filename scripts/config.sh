# Sourced by the scripts: which LibTorch to build against, and where things live.
#
#   DDP_LIBTORCH=pip     (default) PyPI's torch, in a virtual environment that every clone
#                        on this machine shares: ${DDP_VENV}
#   DDP_LIBTORCH=debian  Debian's libtorch-dev 1.13 (CPU) and python3-torch
#
# Each configuration has its own build directory (build/ and build-debian/), so both can
# be built side by side. DDP_BUILD_DIR overrides it.

# The one place the pip torch version is pinned.
DDP_TORCH_VERSION=2.15.0

ddp_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DDP_LIBTORCH=${DDP_LIBTORCH:-pip}
case "$DDP_LIBTORCH" in
  pip)
    DDP_VENV=${DDP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ddp-cpp/torch-$DDP_TORCH_VERSION}
    DDP_PY=$DDP_VENV/bin/python
    ddp_default_build=$ddp_root/build
    ;;
  debian)
    DDP_PY=/usr/bin/python3
    ddp_default_build=$ddp_root/build-debian
    ;;
  *)
    echo "DDP_LIBTORCH=$DDP_LIBTORCH is not a LibTorch this project knows." >&2
    echo "Valid values: pip (PyPI's torch $DDP_TORCH_VERSION, the default) or debian (Debian's libtorch-dev 1.13)." >&2
    exit 2
    ;;
esac
# DDP_SANITIZE=address,undefined (docs/sanitizers.md): ddp-cpp's own code under the
# sanitizers, in a build directory of its own (build-asan/, build-debian-asan/).
if [ -n "${DDP_SANITIZE:-}" ]; then
  ddp_default_build=$ddp_default_build-asan
  export DDP_SANITIZE
fi
DDP_BUILD_DIR=${DDP_BUILD_DIR:-$ddp_default_build}
export DDP_LIBTORCH DDP_BUILD_DIR DDP_PY
