# The reading headers (safe_open.hpp and checkpoint.hpp: files, checkpoints, views, slices) leave
# out the standard headers that cost a translation unit most and that they do not need:
# <filesystem> (paths come in as `PathRef`, go out as `std::string`) and <chrono> (`RemoteOptions`
# lives in remote.hpp). The compiler's `-H` lists every header a file includes; a name in it that
# ends in one of those fails the test, naming the chain that brought it in.
# -DCXX=<compiler> -DINCLUDE=<our include dir> -DGENERATED=<bridge include dir> -DWORK=<scratch dir>
# (A source file, not -include: neither GCC nor Clang lists a forced include's headers.)
file(MAKE_DIRECTORY "${WORK}")
file(WRITE "${WORK}/reading.cpp" "#include <safetensors/safe_open.hpp>\n#include <safetensors/checkpoint.hpp>\n")
execute_process(
  COMMAND "${CXX}" -std=c++20 -fsyntax-only -H "-I${INCLUDE}" -isystem "${GENERATED}" "${WORK}/reading.cpp"
  RESULT_VARIABLE rc ERROR_VARIABLE listing)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the reading headers do not compile:\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(seen 0)
set(chain "")
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^(\\.+) (.*)$")
    continue()
  endif()
  string(LENGTH "${CMAKE_MATCH_1}" depth)
  set(path "${CMAKE_MATCH_2}")
  math(EXPR seen "${seen} + 1")
  # The chain of includes down to this one, for the message.
  list(LENGTH chain have)
  while(have GREATER_EQUAL depth)
    list(POP_BACK chain)
    list(LENGTH chain have)
  endwhile()
  list(APPEND chain "${path}")
  foreach(heavy IN ITEMS filesystem chrono)
    if(path MATCHES "/${heavy}$")
      list(JOIN chain "\n  includes " how)
      message(FATAL_ERROR "the reading headers include <${heavy}>:\n  ${how}")
    endif()
  endforeach()
endforeach()
if(seen LESS 10)
  message(FATAL_ERROR "the compiler's -H listed ${seen} headers; expected the standard library's:\n${listing}")
endif()
message(STATUS "the reading headers include ${seen} headers, none of them <filesystem> or <chrono>")
