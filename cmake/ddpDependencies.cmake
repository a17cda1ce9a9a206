# Finds what ddp-cpp builds against. Works with Debian's CPU LibTorch 1.13 and with a
# CUDA LibTorch 2.x (pip torch: -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;
# print(torch.utils.cmake_prefix_path)')).
#
# Header-only CLI11 and nlohmann-json, and the GoogleTest sources, are taken from the
# system where present, else from third_party/ (filled by scripts/vendor-deps, for
# machines without a package registry).

include(ddpTorchLibraries)
set(_ddp_torch_dir "${Torch_DIR}")
if(NOT _ddp_torch_dir)
  foreach(_p IN LISTS CMAKE_PREFIX_PATH)
    if(EXISTS "${_p}/Torch/TorchConfig.cmake")
      set(_ddp_torch_dir "${_p}/Torch")
      break()
    endif()
  endforeach()
endif()
if(_ddp_torch_dir)
  ddp_pin_torch_libraries("${_ddp_torch_dir}")
endif()
find_package(Torch REQUIRED)
message(STATUS "ddp: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
get_filename_component(_ddp_torch_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
get_filename_component(_ddp_torch_lib_expected "${Torch_DIR}/../../../lib" ABSOLUTE)
if(EXISTS "${_ddp_torch_lib_expected}/libtorch.so" AND
   NOT _ddp_torch_lib_dir STREQUAL _ddp_torch_lib_expected)
  message(FATAL_ERROR "ddp: Torch_DIR is ${Torch_DIR}, but its library resolved to "
                      "${TORCH_LIBRARY}, another LibTorch. Configure in a fresh build "
                      "directory, or set TORCH_LIBRARY.")
endif()

# c10d's Gloo header includes <gloo/...>. Debian's LibTorch pairs with libgloo-dev. pip
# torch links Gloo in statically and ships no Gloo headers, so its build uses
# libgloo-dev's too: Note [Gloo headers] in src/distributed/backends/c10d_comm.cpp says why that is sound.
find_path(DDP_GLOO_INCLUDE_DIR gloo/rendezvous/store.h
  HINTS ${TORCH_INCLUDE_DIRS} ${PROJECT_SOURCE_DIR}/third_party/include)
message(STATUS "ddp: Gloo headers from ${DDP_GLOO_INCLUDE_DIR} (docs/libtorch.md: which and why)")
if(NOT DDP_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "ddp: gloo headers not found (gloo/rendezvous/store.h). "
                      "On Debian: apt-get install libgloo-dev")
endif()

# CUDA and NCCL: only where LibTorch itself was built with them.
# Note [NCCL versions]: nccl.h must be the one torch was built with. pip torch takes its
# NCCL from the nvidia-nccl wheel in the same site-packages, so that folder is searched
# first; a system nccl.h (the CUDA toolkit's) is a last resort and is reported as one.
set(DDP_WITH_CUDA OFF)
set(DDP_WITH_NCCL OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda OR CAFFE2_USE_CUDA)
  set(DDP_WITH_CUDA ON)
  get_filename_component(_ddp_site "${Torch_DIR}/../../../.." ABSOLUTE)
  find_path(DDP_NCCL_INCLUDE_DIR nccl.h
    HINTS ${_ddp_site}/nvidia/nccl/include $ENV{NCCL_INCLUDE_DIR} ${DDP_NCCL_HINTS}
    NO_DEFAULT_PATH)
  set(_ddp_nccl_origin "the nvidia-nccl wheel beside torch")
  if(NOT DDP_NCCL_INCLUDE_DIR)
    find_path(DDP_NCCL_INCLUDE_DIR nccl.h HINTS ${TORCH_INCLUDE_DIRS} PATH_SUFFIXES include)
    set(_ddp_nccl_origin "a system copy, not torch's own wheel; check it matches")
  endif()
  if(DDP_NCCL_INCLUDE_DIR)
    set(DDP_WITH_NCCL ON)
    file(STRINGS "${DDP_NCCL_INCLUDE_DIR}/nccl.h" _v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*"
           "\\1.\\2.\\3" DDP_NCCL_VERSION "${_v}")
    message(STATUS "ddp: NCCL ${DDP_NCCL_VERSION} headers from ${DDP_NCCL_INCLUDE_DIR} "
                   "(${_ddp_nccl_origin})")
  else()
    message(WARNING "ddp: LibTorch has CUDA but nccl.h was not found; the 'nccl' backend "
                    "is left out. Set NCCL_INCLUDE_DIR to the folder holding nccl.h.")
  endif()
endif()
# pip torch finds its CUDA libraries (NCCL among them) through RPATHs into the nvidia
# wheels. The linker, resolving libtorch_cuda's own dependencies, would otherwise take the
# first libnccl.so.2 that ldconfig knows (a CUDA toolkit's, older), and fail on symbols
# only torch's NCCL has. The run-time loader follows the RPATHs and needs nothing.
set(DDP_TORCH_LINK_OPTIONS "")
if(DDP_WITH_CUDA)
  file(GLOB _ddp_nvidia_libs LIST_DIRECTORIES true "${_ddp_site}/nvidia/*/lib")
  foreach(_dir IN LISTS _ddp_nvidia_libs)
    list(APPEND DDP_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${_dir}")
  endforeach()
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

# As a part of another project, the targets imported above (torch_cpu, torch_cuda, CUDA's,
# ...) would be visible in this directory only, yet every user of ddp::ddp links them:
# make them global.
if(NOT DDP_TOP_LEVEL)
  if(CMAKE_VERSION VERSION_LESS 3.21)
    message(FATAL_ERROR "ddp: building ddp-cpp as a subproject needs CMake 3.21 or newer "
                        "(this is ${CMAKE_VERSION}); or install it and use find_package(ddp).")
  endif()
  get_directory_property(_ddp_imported IMPORTED_TARGETS)
  foreach(_t IN LISTS _ddp_imported)
    get_target_property(_ddp_global ${_t} IMPORTED_GLOBAL)
    if(NOT _ddp_global)
      set_target_properties(${_t} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()
