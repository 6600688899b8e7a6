# Runs both builds of hostile_kinds over the corpus and requires the same outcome, line by line,
# from the nothrow API as from the throwing one; that the program built without exceptions
# references no `__cxa_throw` (nothing in it, or in what it links from the library, throws); and
# that mixed_modes, one program of files built with and without exceptions, works in both.
# -DBUILD=<consumer build dir> -DCORPUS=<hostile corpus dir> -DNM=<nm>
foreach(api nothrow throwing)
  execute_process(COMMAND "${BUILD}/hostile_kinds_${api}" "${CORPUS}" RESULT_VARIABLE rc OUTPUT_VARIABLE out_${api}
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "hostile_kinds_${api} failed (${rc}): ${err}")
  endif()
  message(STATUS "${err}")
endforeach()
if(NOT out_nothrow STREQUAL out_throwing)
  file(WRITE "${BUILD}/nothrow.txt" "${out_nothrow}")
  file(WRITE "${BUILD}/throwing.txt" "${out_throwing}")
  message(FATAL_ERROR "the nothrow API and the throwing API disagree: diff ${BUILD}/nothrow.txt ${BUILD}/throwing.txt")
endif()
string(REGEX MATCHALL "\n" lines "${out_nothrow}")
list(LENGTH lines count)
string(REGEX MATCHALL "\t(HeaderTooSmall|InvalidHeaderDeserialization|Io|Cuda|Internal|TypeMismatch|InvalidSlice)\n" kinds
       "${out_nothrow}")
list(LENGTH kinds errors)
if(count LESS 500 OR errors LESS 100)
  message(FATAL_ERROR "too few outcomes (${count} lines, ${errors} of the expected kinds):\n${out_nothrow}")
endif()
message(STATUS "both APIs agree on ${count} outcomes")
execute_process(COMMAND "${NM}" "${BUILD}/hostile_kinds_nothrow" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on hostile_kinds_nothrow")
endif()
if(symbols MATCHES "__cxa_throw")
  message(FATAL_ERROR "hostile_kinds_nothrow, built with -fno-exceptions, references __cxa_throw")
endif()
message(STATUS "hostile_kinds_nothrow references no __cxa_throw")
execute_process(COMMAND "${BUILD}/mixed_modes" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mixed_modes (files built with and without exceptions in one program) failed (${rc}): "
                      "${out}${err}")
endif()
message(STATUS "${out}")
