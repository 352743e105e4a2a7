# Runs a program and checks how it ended, for ctest:
#   cmake -DEXPECT=failure|accuracy -DPATTERN=<regex> [-DMIN_ACCURACY=0.88
#         -DLOG=<json lines file>] -DCOMMAND=<program;args...> -P run_expecting.cmake
# failure:  the program must exit non-zero and print PATTERN (its message).
# accuracy: the program must exit 0 and the last JSON line of LOG must have
#           test_accuracy >= MIN_ACCURACY.
cmake_minimum_required(VERSION 3.19)  # string(JSON)
if(EXPECT STREQUAL "accuracy" AND DEFINED LOG)
  file(REMOVE "${LOG}")
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(EXPECT STREQUAL "failure")
  if(rc EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit, got 0")
  endif()
  if(NOT "${out}${err}" MATCHES "${PATTERN}")
    message(FATAL_ERROR "expected the output to match '${PATTERN}'")
  endif()
elseif(EXPECT STREQUAL "accuracy")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the program failed (exit ${rc})")
  endif()
  file(STRINGS "${LOG}" lines)
  list(GET lines -1 last)
  string(JSON accuracy GET "${last}" test_accuracy)
  message("final test accuracy: ${accuracy} (required: >= ${MIN_ACCURACY})")
  if(accuracy LESS MIN_ACCURACY)
    message(FATAL_ERROR "test accuracy ${accuracy} is below ${MIN_ACCURACY}")
  endif()
else()
  message(FATAL_ERROR "EXPECT must be failure or accuracy")
endif()
