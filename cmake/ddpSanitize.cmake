# DDP_SANITIZE: ddp-cpp's own code under GCC's (or clang's) sanitizers (docs/sanitizers.md).
#
#   cmake -DDDP_SANITIZE=address,undefined ...     (scripts/build and scripts/test do this,
#                                                   into build-asan/, when the environment
#                                                   variable DDP_SANITIZE is set)
#
# Every target that the top-level folder and its subfolders make from here on compiles and
# links with -fsanitize=<list>: the library's parts, ddprun, the examples, the benchmarks,
# the tests, GoogleTest and the precompiled headers' holders (a PCH is used only with the
# flags it was made with). LibTorch itself is not instrumented: its shared libraries are
# PyPI's (or Debian's). Linking the executables with -fsanitize=address puts libasan first
# in their list of libraries, as ASan requires; LibTorch's allocations then go through
# ASan's malloc too, so a heap error of ours on a LibTorch tensor's storage is still found.
#
# Empty (the default) changes nothing.
set(DDP_SANITIZE "" CACHE STRING
    "Sanitizers for ddp-cpp's own targets, as -fsanitize= takes them (e.g. address,undefined); empty: none")

if(NOT DDP_SANITIZE STREQUAL "")
  if(NOT DDP_SANITIZE MATCHES "^[a-z,-]+$")
    message(FATAL_ERROR "ddp: DDP_SANITIZE is '${DDP_SANITIZE}'; expected a list such as address,undefined")
  endif()
  if(DDP_SANITIZE MATCHES "thread" AND DDP_SANITIZE MATCHES "address")
    message(FATAL_ERROR "ddp: DDP_SANITIZE=${DDP_SANITIZE}: ThreadSanitizer and AddressSanitizer do not mix")
  endif()
  set(_ddp_san_flags -fsanitize=${DDP_SANITIZE} -fno-omit-frame-pointer)
  if(DDP_SANITIZE MATCHES "undefined")
    # A UBSan report fails the test instead of scrolling past.
    list(APPEND _ddp_san_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${_ddp_san_flags})
  add_link_options(-fsanitize=${DDP_SANITIZE})
  message(STATUS "ddp: sanitizers ${DDP_SANITIZE} (docs/sanitizers.md)")

  set(DDP_SANITIZE_SUPPRESSIONS ${CMAKE_CURRENT_LIST_DIR}/../scripts/sanitize-suppressions)
  get_filename_component(DDP_SANITIZE_SUPPRESSIONS ${DDP_SANITIZE_SUPPRESSIONS} ABSOLUTE)

  # The sanitizers' options for every test, set in CTest's own environment (which each test
  # inherits) when it reads the build's test list; a variable already set is kept. Running a
  # test binary by hand: source build-asan/ddp_sanitize_env.sh first.
  set(_asan "detect_leaks=1:check_initialization_order=1")
  set(_lsan "suppressions=${DDP_SANITIZE_SUPPRESSIONS}/lsan.supp:print_suppressions=0")
  set(_ubsan "print_stacktrace=1:halt_on_error=1:suppressions=${DDP_SANITIZE_SUPPRESSIONS}/ubsan.supp")
  string(APPEND _asan ":suppressions=${DDP_SANITIZE_SUPPRESSIONS}/asan.supp")
  file(WRITE ${CMAKE_BINARY_DIR}/ddp_sanitize_env.cmake
"# The sanitizers' options for CTest's tests (cmake/ddpSanitize.cmake); generated.
foreach(_v ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS)
  if(NOT DEFINED ENV{\${_v}})
    if(_v STREQUAL ASAN_OPTIONS)
      set(ENV{ASAN_OPTIONS} [==[${_asan}]==])
    elseif(_v STREQUAL LSAN_OPTIONS)
      set(ENV{LSAN_OPTIONS} [==[${_lsan}]==])
    else()
      set(ENV{UBSAN_OPTIONS} [==[${_ubsan}]==])
    endif()
  endif()
endforeach()
")
  file(WRITE ${CMAKE_BINARY_DIR}/ddp_sanitize_env.sh
"# The sanitizers' options for a test binary run by hand (cmake/ddpSanitize.cmake); generated.
export ASAN_OPTIONS='${_asan}'
export LSAN_OPTIONS='${_lsan}'
export UBSAN_OPTIONS='${_ubsan}'
")
  set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY TEST_INCLUDE_FILES
               ${CMAKE_BINARY_DIR}/ddp_sanitize_env.cmake)

  # The tests that cannot run in this configuration (docs/sanitizers.md says why): CTest
  # skips them (CTestCustom.cmake, read from the build folder when CTest starts).
  #   ConsumerInstallTest.*  builds a separate project against the installed, instrumented
  #                          static libraries without -fsanitize: its link fails on __asan_*.
  file(WRITE ${CMAKE_BINARY_DIR}/CTestCustom.cmake
"# Tests left out under DDP_SANITIZE (cmake/ddpSanitize.cmake, docs/sanitizers.md); generated.
list(APPEND CTEST_CUSTOM_TESTS_IGNORE
  ConsumerInstallTest.FindPackageFromBuildTreeAndPrefix
  ConsumerInstallTest.FetchContentAsASubproject)
")

  # shm_transport_test is built under ThreadSanitizer (tests/CMakeLists.txt), which does not
  # mix with ASan: it keeps its own sanitizer and leaves out ours.
  function(_ddp_sanitize_fixups)
    if(TARGET shm_transport_test)
      foreach(prop COMPILE_OPTIONS LINK_OPTIONS)
        get_target_property(opts shm_transport_test ${prop})
        if(opts)
          list(REMOVE_ITEM opts ${ARGN} -fsanitize=${DDP_SANITIZE})
          set_property(TARGET shm_transport_test PROPERTY ${prop} ${opts})
        endif()
      endforeach()
    endif()
  endfunction()
  cmake_language(EVAL CODE "cmake_language(DEFER DIRECTORY [[${CMAKE_SOURCE_DIR}]] CALL
                            _ddp_sanitize_fixups ${_ddp_san_flags})")
endif()
