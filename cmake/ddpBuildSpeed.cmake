# How ddp-cpp's own targets compile in minutes rather than in a quarter of an hour
# (docs/building.md, "Build time"). Every translation unit that touches LibTorch parses
# about 300,000 lines of its headers before a line of ours; on a 2-core machine that was
# most of the build. Three things, each measured there:
#
#   precompiled headers  LibTorch's headers parsed once per kind of target (the library's
#                        position-independent objects, the programs' objects), not once per
#                        source file. DDP_PCH.
#   unity builds         several sources compiled as one translation unit, so that the
#                        templates they share are instantiated and emitted once.
#                        DDP_UNITY_BATCH sources to a unit (0 turns it off).
#   less debug info      DDP_DEBUG_INFO for the library, DDP_PROGRAM_DEBUG_INFO for the
#                        tests, examples, tools and benchmarks: a -g option that replaces
#                        the build type's -g, or empty to keep it.
#
# ddp_speed_up(<target> LIBRARY|PROGRAM) applies them to one target. A compiler cache
# (ccache) serves precompiled headers too, given scripts/build's settings, so a second
# clone on the same machine compiles nothing.

option(DDP_PCH "Precompile LibTorch's headers for ddp-cpp's own targets" ON)
option(DDP_PCH_ONE "One precompiled header for the library and the programs" ON)
set(DDP_UNITY_BATCH 8 CACHE STRING
    "Sources per unity translation unit in ddp-cpp's own targets (0: none)")
if(DDP_TOP_LEVEL)
  set(_ddp_g -g1)
else()
  set(_ddp_g "")  # a part of another project: that project's build type decides
endif()
set(DDP_DEBUG_INFO "${_ddp_g}" CACHE STRING
    "Debug information of the library in RelWithDebInfo: a -g option (-g, -g1, -g0) or empty for the build type's")
set(DDP_PROGRAM_DEBUG_INFO "${_ddp_g}" CACHE STRING
    "Debug information of the tests, examples, tools and benchmarks in RelWithDebInfo: a -g option or empty")
foreach(_v DDP_DEBUG_INFO DDP_PROGRAM_DEBUG_INFO)
  if(NOT "${${_v}}" STREQUAL "" AND NOT "${${_v}}" MATCHES "^-g[0-3]?$")
    message(FATAL_ERROR "ddp: ${_v} is '${${_v}}'; expected -g, -g0, -g1, -g2, -g3 or empty")
  endif()
endforeach()
if(NOT DDP_UNITY_BATCH MATCHES "^[0-9]+$")
  message(FATAL_ERROR "ddp: DDP_UNITY_BATCH is '${DDP_UNITY_BATCH}'; expected a count >= 0")
endif()

# The headers each precompiled header holds: what most sources of that kind include.
# They must exist in every LibTorch ddp-cpp supports (1.13 and 2.x).
set(DDP_PCH_LIBRARY_HEADERS
  <ATen/ATen.h> <ATen/core/ivalue.h> <ATen/core/Dict.h> <c10/util/Exception.h>
  <torch/nn/module.h> <torch/nn/modules/container/sequential.h> <torch/optim/optimizer.h>
  <torch/csrc/autograd/function.h> <torch/csrc/autograd/variable.h>
  <functional> <map> <memory> <string> <unordered_map> <vector>
  CACHE INTERNAL "")  # INTERNAL: seen from the top-level folder too (_ddp_pch_holder)
set(DDP_PCH_PROGRAM_HEADERS <torch/torch.h> ${DDP_PCH_LIBRARY_HEADERS} CACHE INTERNAL "")

# The targets that own each kind's precompiled header; every other target of the kind
# reuses it. A PCH is valid only with the flags it was made with, so each holder is
# compiled like the targets that reuse it.
function(_ddp_pch_holder kind)
  get_property(known GLOBAL PROPERTY DDP_PCH_HOLDERS)
  if(kind IN_LIST known)
    return()
  endif()
  set_property(GLOBAL APPEND PROPERTY DDP_PCH_HOLDERS ${kind})
  # The holder lives in the top-level folder of the build, also where ddp-cpp is a part of
  # another project: commands then name its PCH by the same path relative to the build
  # folder as in ddp-cpp's own build, and a compiler cache serves either from the other.
  if(CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_SOURCE_DIR)
    _ddp_make_pch_holder(${kind} "${TORCH_LIBRARIES}")
  else()
    cmake_language(EVAL CODE "cmake_language(DEFER DIRECTORY [[${CMAKE_SOURCE_DIR}]] CALL
                              _ddp_make_pch_holder [[${kind}]] [[${TORCH_LIBRARIES}]])")
  endif()
endfunction()

function(_ddp_make_pch_holder kind torch_libraries)
  set(holder ddp_pch_${kind})
  set(stub ${CMAKE_BINARY_DIR}/ddp_pch_stub.cpp)
  if(NOT EXISTS ${stub})
    file(WRITE ${stub} "// The precompiled header's owner (cmake/ddpBuildSpeed.cmake) compiles this.\n")
  endif()
  add_library(${holder} OBJECT ${stub})
  # ddp-cpp's own language settings (CMakeLists.txt), which its folder's targets get from
  # there and the holder may not (it may be made in another project's top folder).
  set_target_properties(${holder} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                        CXX_EXTENSIONS OFF)
  target_link_libraries(${holder} PRIVATE ${torch_libraries})
  if(kind STREQUAL "library")
    set_target_properties(${holder} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_precompile_headers(${holder} PRIVATE ${DDP_PCH_LIBRARY_HEADERS})
  else()
    target_precompile_headers(${holder} PRIVATE ${DDP_PCH_PROGRAM_HEADERS})
  endif()
  _ddp_debug_info(${holder} ${kind})
endfunction()

function(_ddp_debug_info target kind)
  if(kind STREQUAL "library")
    set(g "${DDP_DEBUG_INFO}")
  else()
    set(g "${DDP_PROGRAM_DEBUG_INFO}")
  endif()
  if(NOT g STREQUAL "")
    # After the build type's flags on the command line, so this -g is the one that counts;
    # RelWithDebInfo only (a Debug build keeps its full -g).
    target_compile_options(${target} PRIVATE $<$<CONFIG:RelWithDebInfo>:${g}>)
  endif()
endfunction()

# Unity units of our own rather than CMake's UNITY_BUILD: CMake 3.25 writes each source's
# absolute path into the unit, so a unit differs from clone to clone and a compiler cache
# never serves it to a second clone. Ours name each source by its path relative to the
# unit's own folder (the same in every clone whose build folder sits at the same place
# in it, as scripts/build's do). A source with compile properties of its own, or marked
# SKIP_UNITY_BUILD_INCLUSION, compiles alone, as with CMake's.
#
# With a batch size of its own (ddp_speed_up's UNITY_BATCH), a target's sources are split
# into units of even size instead: 26 sources at 16 make two units of 13, not 16 and 10.
function(_ddp_unity target per_unit)
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(unit_dir ${CMAKE_BINARY_DIR}/ddp_unity/${target})  # the top build folder: see _ddp_pch_holder
  if(per_unit GREATER 0)
    set(count 0)
    foreach(src IN LISTS sources)
      if(src MATCHES "\\.(cpp|cc|cxx)$")
        math(EXPR count "${count} + 1")
      endif()
    endforeach()
    math(EXPR n_units "(${count} + ${per_unit} - 1) / ${per_unit}")
    if(n_units GREATER 0)
      math(EXPR per_unit "(${count} + ${n_units} - 1) / ${n_units}")
    endif()
  else()
    set(per_unit ${DDP_UNITY_BATCH})
  endif()
  set(batch)
  set(units)
  set(n 0)
  foreach(src IN LISTS sources)
    if(NOT src MATCHES "\\.(cpp|cc|cxx)$")
      continue()
    endif()
    get_filename_component(abs ${src} ABSOLUTE BASE_DIR ${source_dir})
    set(alone OFF)
    foreach(prop COMPILE_OPTIONS COMPILE_DEFINITIONS COMPILE_FLAGS INCLUDE_DIRECTORIES
                 SKIP_UNITY_BUILD_INCLUSION GENERATED)
      get_source_file_property(v ${src} ${prop})
      if(v)
        set(alone ON)
      endif()
    endforeach()
    if(alone)
      continue()
    endif()
    list(APPEND batch ${abs})
    list(LENGTH batch len)
    if(len EQUAL per_unit)
      _ddp_unity_unit(${unit_dir} ${n} "${batch}")
      list(APPEND units ${unit_dir}/unit_${n}.cpp)
      math(EXPR n "${n} + 1")
      set(batch)
    endif()
  endforeach()
  list(LENGTH batch len)
  if(len GREATER 0)
    _ddp_unity_unit(${unit_dir} ${n} "${batch}")
    list(APPEND units ${unit_dir}/unit_${n}.cpp)
  endif()
  target_sources(${target} PRIVATE ${units})
  # A type of one source that uses another's anonymous namespace is fine in a unit (the
  # warning is for headers, which is what an included source looks like to GCC).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
endfunction()

# One unit: its sources #included by relative path, and taken out of the target's own
# compile (HEADER_FILE_ONLY: still listed, for IDEs). Written only when its text changes,
# so that configuring again rebuilds nothing.
function(_ddp_unity_unit unit_dir n batch)
  set(text "// A unity unit of ddp-cpp's build (cmake/ddpBuildSpeed.cmake); generated.\n")
  foreach(abs IN LISTS batch)
    file(RELATIVE_PATH rel ${unit_dir} ${abs})
    string(APPEND text "#include \"${rel}\"\n")
    set_source_files_properties(${abs} PROPERTIES HEADER_FILE_ONLY ON)
  endforeach()
  set(unit ${unit_dir}/unit_${n}.cpp)
  set(old "")
  if(EXISTS ${unit})
    file(READ ${unit} old)
  endif()
  if(NOT old STREQUAL text)
    file(WRITE ${unit} "${text}")
  endif()
endfunction()

# ddp_speed_up(<target> LIBRARY|PROGRAM [NO_PCH] [NO_UNITY] [UNITY_BATCH <sources per unit>])
function(ddp_speed_up target)
  cmake_parse_arguments(S "LIBRARY;PROGRAM;NO_PCH;NO_UNITY" "UNITY_BATCH" "" ${ARGN})
  if(S_LIBRARY)
    set(kind library)
  elseif(S_PROGRAM)
    set(kind program)
  else()
    message(FATAL_ERROR "ddp_speed_up(${target}): say LIBRARY or PROGRAM")
  endif()
  _ddp_debug_info(${target} ${kind})
  if(DDP_UNITY_BATCH GREATER 0 AND NOT S_NO_UNITY)
    if(NOT S_UNITY_BATCH)
      set(S_UNITY_BATCH 0)
    endif()
    _ddp_unity(${target} ${S_UNITY_BATCH})
  endif()
  if(DDP_PCH AND NOT S_NO_PCH)
    if(kind STREQUAL "program" AND DDP_PCH_ONE AND DDP_DEBUG_INFO STREQUAL DDP_PROGRAM_DEBUG_INFO)
      # The library's PCH, which was made with -fPIC: a PCH is used only with the code
      # model it was made with.
      target_compile_options(${target} PRIVATE -fPIC)
      set(kind library)
    endif()
    _ddp_pch_holder(${kind})
    if(TARGET ddp_pch_${kind})
      target_precompile_headers(${target} REUSE_FROM ddp_pch_${kind})
    else()  # made later, at the end of the top-level folder: reuse it from there
      cmake_language(EVAL CODE "cmake_language(DEFER DIRECTORY [[${CMAKE_SOURCE_DIR}]] CALL
                                target_precompile_headers [[${target}]] REUSE_FROM [[ddp_pch_${kind}]])")
    endif()
  endif()
endfunction()
