# Runs lamp_bench --profile on the CPU and checks what it wrote, for ctest:
#   cmake -DCOMMAND=<lamp_bench> -DTRACE=<dir/name.json> [-DPRECISIONS=fp32;bf16]
#         -P check_profile.cmake
# It must exit 0, print a table with every class row for each precision, and
# write one Chrome trace per precision (TRACE itself for one, TRACE with
# "-PRECISION" before ".json" for several) that parses as JSON and holds
# events.
cmake_minimum_required(VERSION 3.19)  # string(JSON)
if(NOT DEFINED PRECISIONS)
  set(PRECISIONS fp32)
endif()
list(LENGTH PRECISIONS count)
string(REPLACE ";" "," precision_flag "${PRECISIONS}")
set(traces)
foreach(precision IN LISTS PRECISIONS)
  if(count EQUAL 1)
    set(trace "${TRACE}")
  else()
    string(REGEX REPLACE "\\.json$" "-${precision}.json" trace "${TRACE}")
  endif()
  file(REMOVE "${trace}")
  list(APPEND traces "${trace}")
endforeach()

execute_process(
  COMMAND ${COMMAND} --model cnn --batch-size 16 --precision ${precision_flag}
          --device cpu --warmup 1 --steps 2 --profile ${TRACE} --profile-steps 2
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "lamp_bench --profile failed (exit ${rc})")
endif()

# Each class row: its name, ms/step and share.
foreach(row "conv forward" "conv dgrad" "conv wgrad" "conv backward" "matmul"
            "attention" "batchnorm" "other norms" "softmax, loss" "elementwise"
            "optimizer" "copies" "other" "outside ops" "step")
  string(REGEX MATCHALL "\n${row} +[0-9]+\\.[0-9]+ +[0-9]+\\.[0-9]%" found "\n${out}")
  list(LENGTH found rows)
  if(NOT rows EQUAL count)
    message(FATAL_ERROR "expected ${count} table row(s) '${row}', found ${rows}")
  endif()
endforeach()
# The CNN's convolutions: their time and FLOP rate are known on the CPU.
if(NOT out MATCHES "\nconv forward +[0-9]+\\.[0-9]+ +[0-9]+\\.[0-9]% +[0-9]+\\.[0-9]+ ")
  message(FATAL_ERROR "the conv forward row has no TFLOP/s")
endif()

foreach(trace IN LISTS traces)
  if(NOT EXISTS "${trace}")
    message(FATAL_ERROR "no trace at ${trace}")
  endif()
  file(READ "${trace}" json)
  string(JSON events ERROR_VARIABLE problem LENGTH "${json}" traceEvents)
  if(problem)
    message(FATAL_ERROR "${trace} is not a Chrome trace: ${problem}")
  endif()
  if(events LESS 10)
    message(FATAL_ERROR "${trace} holds only ${events} events")
  endif()
  message("${trace}: ${events} trace events")
endforeach()
