# Finds what ddp-cpp builds against. Works with Debian's CPU LibTorch 1.13 and with a
# CUDA LibTorch 2.x (pip torch: -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;
# print(torch.utils.cmake_prefix_path)')).
#
# Header-only CLI11 and nlohmann-json, and the GoogleTest sources, are taken from the
# system where present, else from third_party/ (filled by scripts/vendor-deps, for
# machines without a package registry).

find_package(Torch REQUIRED)
message(STATUS "ddp: LibTorch ${Torch_VERSION} from ${Torch_DIR}")

# c10d's Gloo header includes <gloo/...>. Debian ships those headers in libgloo-dev;
# pip torch ships them inside torch/include.
find_path(DDP_GLOO_INCLUDE_DIR gloo/rendezvous/store.h
  HINTS ${TORCH_INCLUDE_DIRS} ${PROJECT_SOURCE_DIR}/third_party/include)
if(NOT DDP_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "ddp: gloo headers not found (gloo/rendezvous/store.h). "
                      "On Debian: apt-get install libgloo-dev")
endif()

# CUDA and NCCL: only where LibTorch itself was built with them.
set(DDP_WITH_CUDA OFF)
set(DDP_WITH_NCCL OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda OR CAFFE2_USE_CUDA)
  set(DDP_WITH_CUDA ON)
  find_path(DDP_NCCL_INCLUDE_DIR nccl.h
    HINTS ${TORCH_INCLUDE_DIRS} $ENV{NCCL_INCLUDE_DIR} ${DDP_NCCL_HINTS}
    PATH_SUFFIXES include)
  if(DDP_NCCL_INCLUDE_DIR)
    set(DDP_WITH_NCCL ON)
  else()
    message(WARNING "ddp: LibTorch has CUDA but nccl.h was not found; the 'nccl' backend "
                    "is left out. Set NCCL_INCLUDE_DIR to the folder holding nccl.h.")
  endif()
endif()
message(STATUS "ddp: CUDA ${DDP_WITH_CUDA}, NCCL ${DDP_WITH_NCCL}")

find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND AND EXISTS ${PROJECT_SOURCE_DIR}/third_party/include/CLI/CLI.hpp)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  set_target_properties(CLI11::CLI11 PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${PROJECT_SOURCE_DIR}/third_party/include)
  set(CLI11_FOUND ON)
endif()

find_package(nlohmann_json CONFIG QUIET)
if(NOT nlohmann_json_FOUND AND EXISTS ${PROJECT_SOURCE_DIR}/third_party/include/nlohmann/json.hpp)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${PROJECT_SOURCE_DIR}/third_party/include)
  set(nlohmann_json_FOUND ON)
endif()

find_package(ZLIB)
find_package(Threads REQUIRED)
