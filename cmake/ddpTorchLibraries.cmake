# Note [Two LibTorches on one machine]
# TorchConfig.cmake finds its libraries with find_library(... PATHS <torch>/lib), and
# PATHS come after the system directories. On a machine that also has Debian's
# libtorch-dev, a pip torch build therefore links /usr/lib/.../libtorch.so and libc10.so
# (1.13) beside pip torch's own libraries; and its find_dependency(Caffe2 PATHS ...)
# takes Debian's Caffe2 targets unless CMAKE_PREFIX_PATH says otherwise.
# ddp_pin_torch_libraries() looks both up in the given LibTorch alone first, so that
# TorchConfig's own lookups find them already set.
function(ddp_pin_torch_libraries torch_cmake_dir)
  get_filename_component(_lib "${torch_cmake_dir}/../../../lib" ABSOLUTE)
  if(NOT EXISTS "${_lib}")
    return()
  endif()
  if(NOT Caffe2_DIR AND EXISTS "${torch_cmake_dir}/../Caffe2/Caffe2Config.cmake")
    get_filename_component(_caffe2 "${torch_cmake_dir}/../Caffe2" ABSOLUTE)
    set(Caffe2_DIR "${_caffe2}" CACHE PATH "Caffe2's CMake files, beside Torch's")
  endif()
  find_library(TORCH_LIBRARY torch PATHS "${_lib}" NO_DEFAULT_PATH)
  find_library(c10_LIBRARY c10 PATHS "${_lib}" NO_DEFAULT_PATH)
  find_library(C10_CUDA_LIBRARY c10_cuda PATHS "${_lib}" NO_DEFAULT_PATH)
  find_library(kineto_LIBRARY kineto PATHS "${_lib}" NO_DEFAULT_PATH)
endfunction()
