# Every public header, alone, compiles with -fno-exceptions -fno-rtti (syntax only), so that no
# header grows a `throw` or `try` that would break engines built that way. Headers that need
# mpi.h or dlpack.h are checked where those were found (their -I flags given), else skipped.
# -DCXX=<compiler> -DINCLUDE=<our include dir> -DGENERATED=<bridge include dir>
# -DMPI_FLAGS=<flags or empty> -DDLPACK_FLAGS=<flags or empty>
file(GLOB headers RELATIVE "${INCLUDE}" "${INCLUDE}/safetensors/*.hpp")
set(checked 0)
foreach(header IN LISTS headers)
  set(extra "")
  if(header STREQUAL "safetensors/mpi.hpp")
    if(NOT MPI_FLAGS)
      message(STATUS "skipped ${header}: no mpi.h")
      continue()
    endif()
    separate_arguments(extra UNIX_COMMAND "${MPI_FLAGS}")
  elseif(header STREQUAL "safetensors/dlpack.hpp")
    if(NOT DLPACK_FLAGS)
      message(STATUS "skipped ${header}: no dlpack.h")
      continue()
    endif()
    separate_arguments(extra UNIX_COMMAND "${DLPACK_FLAGS}")
  endif()
  execute_process(
    COMMAND "${CXX}" -std=c++20 -fsyntax-only -fno-exceptions -fno-rtti -Wall -Wextra -Werror "-I${INCLUDE}"
            -isystem "${GENERATED}" ${extra} -include "${header}" -x c++ /dev/null
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${header} does not compile with -fno-exceptions -fno-rtti:\n${err}")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
message(STATUS "${checked} headers compile with -fno-exceptions -fno-rtti")
