# Run by CTest before the tests (ddp_gtest_tests in tests/CMakeLists.txt): lists a test
# binary's GoogleTest cases and writes CTest tests for them. A test process pays LibTorch's
# start-up (about 0.5 s on 2 cores) before its first line, so cases share processes:
# - the instances of a parametrized test (Suite.Name/0, Suite.Name/1, ...) become one test,
#   Suite.Name, that runs them all in one process;
# - with LABELS "unit" (cases of well under a second each), the cases of 8 suites run in
#   one test, named by its positive --gtest_filter: "A.*:B.*:C.*"
#   (ctest -R B still finds it). Per case, the start-up was about 40% of the unit tests'
#   time; per suite, still 80 processes and 35 s of 2 cores in a full run. A failure names
#   its case in the test's output.
#
# -D: EXE, FILTER (a --gtest_filter), LABELS, TIMEOUT (seconds, one case), OUT (the file
# written), WORKDIR.
execute_process(COMMAND "${EXE}" --gtest_list_tests "--gtest_filter=${FILTER}"
                WORKING_DIRECTORY "${WORKDIR}" OUTPUT_VARIABLE listing ERROR_VARIABLE err
                RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ddp: ${EXE} --gtest_list_tests failed (${rc}):\n${listing}\n${err}")
endif()

string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(names)  # in order of appearance: a case, or a parametrized test's base name
set(suite "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([^ ]+)")
    set(test "${CMAKE_MATCH_1}")
    if(test MATCHES "^DISABLED_" OR suite MATCHES "^DISABLED_")
      continue()
    endif()
    if(LABELS STREQUAL "unit" AND FILTER MATCHES "^-")
      set(name "${suite}.*")
      set(filter "${name}${FILTER}")  # the suite, less what FILTER leaves out (batched below)
    elseif(test MATCHES "^([^/]+)/.+$")
      set(name "${suite}.${CMAKE_MATCH_1}")
      set(filter "${name}/*")
    else()
      set(name "${suite}.${test}")
      set(filter "${name}")
    endif()
    string(MAKE_C_IDENTIFIER "${name}" key)
    if(NOT DEFINED count_${key})
      set(count_${key} 0)
      set(filter_${key} "${filter}")
      list(APPEND names "${name}")
    endif()
    math(EXPR count_${key} "${count_${key}} + 1")
  endif()
endforeach()

# Unit suites, 8 to a test, in the listing's order: suite i goes to batch i / 8.
if(LABELS STREQUAL "unit" AND FILTER MATCHES "^-")
  set(batches)
  set(i 0)
  foreach(name IN LISTS names)
    string(MAKE_C_IDENTIFIER "${name}" key)
    math(EXPR b "${i} / 8")
    if(NOT DEFINED batch_${b})
      list(APPEND batches ${b})
      set(batch_${b} "${name}")
      set(batch_count_${b} 0)
    else()
      string(APPEND batch_${b} ":${name}")
    endif()
    math(EXPR batch_count_${b} "${batch_count_${b}} + ${count_${key}}")
    math(EXPR i "${i} + 1")
  endforeach()
  set(names)
  foreach(b IN LISTS batches)
    string(MAKE_C_IDENTIFIER "${batch_${b}}" key)
    set(count_${key} ${batch_count_${b}})
    set(filter_${key} "${batch_${b}}${FILTER}")
    list(APPEND names "${batch_${b}}")
  endforeach()
endif()

set(script "")
foreach(name IN LISTS names)
  string(MAKE_C_IDENTIFIER "${name}" key)
  # A timeout for the instances together, up to 10 minutes.
  math(EXPR timeout "${TIMEOUT} * ${count_${key}}")
  if(timeout GREATER 600 AND TIMEOUT LESS 600)
    set(timeout 600)
  endif()
  string(APPEND script
    "add_test([==[${name}]==] [==[${EXE}]==] [==[--gtest_filter=${filter_${key}}]==])\n"
    "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY [==[${WORKDIR}]==]"
    " TIMEOUT ${timeout} LABELS [==[${LABELS}]==] SKIP_RETURN_CODE 77"
    " ENVIRONMENT DDP_TEST_ALL_SKIPPED_EXIT=77)\n")
endforeach()
file(WRITE "${OUT}" "${script}")
