# The reading headers (safe_open.hpp and checkpoint.hpp: files, checkpoints, views, slices) leave
# out the standard headers that cost a translation unit most and that they do not need:
# <filesystem> (paths come in as `PathRef`, go out as `std::string`), <chrono> (`RemoteOptions`
# lives in remote.hpp), and <ranges> and <algorithm>, which `rust/cxx.h` and the bridge headers
# that use `rust::Slice` or `rust::Vec` bring (the reading bridges take pointer-and-length spans;
# see detail/bridge.hpp). The compiler's `-H` lists every header a file includes; a name in it that
# ends in one of those, or `rust/cxx.h` itself, fails the test, naming the chain that brought it in.
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
  foreach(heavy IN ITEMS filesystem chrono ranges algorithm rust/cxx.h)
    if(path MATCHES "/${heavy}$")
      list(JOIN chain "\n  includes " how)
      message(FATAL_ERROR "the reading headers include <${heavy}>:\n  ${how}")
    endif()
  endforeach()
endforeach()
if(seen LESS 10)
  message(FATAL_ERROR "the compiler's -H listed ${seen} headers; expected the standard library's:\n${listing}")
endif()
message(STATUS "the reading headers include ${seen} headers, none of them <filesystem>, <chrono>, <ranges>, <algorithm> or rust/cxx.h")
