# What a new user meets first, checked without building anything. Run by ctest as
#   cmake -DMODE=<mode> -DSOURCE_DIR=<repository> -DWORK=<scratch dir> -DCXX=<c++>
#         -DGENERATED=<generated include dir> -DGENERATOR=<generator> -P first_contact.cmake
# MODE:
#   cxx17         a program compiled as C++17 stops at the headers' own "needs C++20" #error,
#                 the first error it reports
#   old-rust      configure stops on a cargo older than Cargo.toml's rust-version, naming both
#                 versions and how to get a newer one
#   no-rust       configure stops on a machine with no cargo, saying how to install it
#   plain         the plain `cmake -B build` with GoogleTest hidden: configures, builds Release,
#                 no -Werror, and says in one line what to install for the tests
cmake_minimum_required(VERSION 3.23)

function(fail)
  string(JOIN "" msg ${ARGN})
  message(FATAL_ERROR "${msg}")
endfunction()

# expect_output(<what> <text> <must-contain>...): CMake wraps long messages, so spaces and
# newlines count as one.
function(expect_output what text)
  string(REGEX REPLACE "[ \n]+" " " flat "${text}")
  foreach(want IN LISTS ARGN)
    string(FIND "${flat}" "${want}" at)
    if(at EQUAL -1)
      fail("${what}: expected the output to say `${want}`:\n${text}")
    endif()
  endforeach()
endfunction()

# configure(<out-var> <rc-var> <args>...): configures this repository in a fresh directory,
# outside CI's rules (CI=true turns missing test dependencies into errors).
function(configure out rc)
  set(build "${WORK}/${MODE}")
  file(REMOVE_RECURSE "${build}")
  unset(ENV{CI})
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${build}" -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}"
                          ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE o ERROR_VARIABLE e)
  set(${out} "${o}${e}" PARENT_SCOPE)
  set(${rc} "${code}" PARENT_SCOPE)
endfunction()

file(MAKE_DIRECTORY "${WORK}")
file(STRINGS "${SOURCE_DIR}/Cargo.toml" rust_version REGEX "^rust-version = ")
string(REGEX REPLACE "^rust-version = \"([0-9.]+)\"$" "\\1" rust_version "${rust_version}")

if(MODE STREQUAL "cxx17")
  file(WRITE "${WORK}/cxx17.cpp" "#include <safetensors/safetensors.hpp>\nint main() { return 0; }\n")
  execute_process(COMMAND "${CXX}" -std=c++17 -fsyntax-only "-I${SOURCE_DIR}/include" -isystem "${GENERATED}"
                          "${WORK}/cxx17.cpp" RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
  if(rc EQUAL 0)
    fail("the headers compiled as C++17")
  endif()
  string(REGEX MATCH "[^\n]*error[^\n]*" first "${err}${out}")
  if(NOT first MATCHES "safetensors needs C\\+\\+20: compile with -std=c\\+\\+20")
    fail("the first error is not the headers' own: ${first}\n${err}")
  endif()
  message(STATUS "C++17: ${first}")
elseif(MODE STREQUAL "old-rust")
  set(fake "${WORK}/old-cargo")
  file(WRITE "${fake}" "#!/bin/sh\necho 'cargo 1.70.0 (ec8a8a0ca 2023-04-25)'\n")
  file(CHMOD "${fake}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
  configure(out rc "-DSAFETENSORS_CARGO=${fake}" -DSAFETENSORS_BUILD_TESTS=OFF)
  if(rc EQUAL 0)
    fail("configure accepted cargo 1.70.0:\n${out}")
  endif()
  expect_output("old Rust" "${out}" "Rust 1.70.0 found" "Rust >= ${rust_version} needed" "rustup update")
  message(STATUS "cargo 1.70.0: refused, naming ${rust_version} and rustup")
elseif(MODE STREQUAL "no-rust")
  # PATH without the directories that hold cargo, HOME and CARGO_HOME elsewhere.
  set(path "")
  string(REPLACE ":" ";" dirs "$ENV{PATH}")
  foreach(dir IN LISTS dirs)
    if(EXISTS "${dir}/cargo")
      if(EXISTS "${dir}/cmake" OR EXISTS "${dir}/c++" OR EXISTS "${dir}/sh")
        message(STATUS "skipped: cargo is installed beside the system's tools (${dir}), so no PATH lacks it")
        return()
      endif()
    else()
      list(APPEND path "${dir}")
    endif()
  endforeach()
  list(JOIN path ":" path)
  set(ENV{PATH} "${path}")
  set(ENV{HOME} "${WORK}/home")
  unset(ENV{CARGO_HOME})
  configure(out rc -DSAFETENSORS_BUILD_TESTS=OFF)
  if(rc EQUAL 0)
    fail("configure succeeded with no cargo on PATH=${path}:\n${out}")
  endif()
  expect_output("no Rust" "${out}" "no cargo found" "needs Rust >= ${rust_version}" "https://rustup.rs")
  message(STATUS "no cargo: refused, saying how to install Rust ${rust_version}")
elseif(MODE STREQUAL "plain")
  configure(out rc -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON)
  if(NOT rc EQUAL 0)
    fail("the plain configure failed without GoogleTest:\n${out}")
  endif()
  expect_output("plain configure" "${out}" "no CMAKE_BUILD_TYPE given: building Release"
                "tests are not built: they need GoogleTest (apt-get install libgtest-dev)")
  file(STRINGS "${WORK}/${MODE}/CMakeCache.txt" cache REGEX "^(CMAKE_BUILD_TYPE|SAFETENSORS_WERROR):")
  if(NOT "CMAKE_BUILD_TYPE:STRING=Release" IN_LIST cache OR NOT "SAFETENSORS_WERROR:BOOL=OFF" IN_LIST cache)
    fail("the plain configure should build Release without -Werror, its cache says: ${cache}")
  endif()
  if(NOT EXISTS "${WORK}/${MODE}/CPackConfig.cmake")
    fail("the plain configure wrote no CPackConfig.cmake: `cpack` would not package it")
  endif()
  message(STATUS "plain configure without GoogleTest: Release, no -Werror, one line for the tests")
elseif(MODE STREQUAL "setup")
  # A bare machine: PATH holds only the shell and the tools a minimal Debian has.
  set(bare "${WORK}/bare-bin")
  file(REMOVE_RECURSE "${bare}")
  file(MAKE_DIRECTORY "${bare}")
  foreach(tool bash sh sed sort head grep id cut dirname env cat)
    find_program(path_of_${tool} ${tool} REQUIRED)
    file(CREATE_LINK "${path_of_${tool}}" "${bare}/${tool}" SYMBOLIC)
  endforeach()
  set(ENV{HOME} "${WORK}/home")
  unset(ENV{CXX})
  unset(ENV{SAFETENSORS_PYTHON})
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "PATH=${bare}" bash "${SOURCE_DIR}/.ci/setup" tests --dry-run
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    fail(".ci/setup --dry-run failed (${rc}):\n${out}${err}")
  endif()
  expect_output("setup on a bare machine" "${out}${err}" "would install with apt-get: cmake (the build) ninja-build"
                "g++ (the C++20 compiler)" "python3-venv" "clang (the C++ fuzz target)" "openmpi-bin"
                "Rust is missing: safetensors needs Rust >= ${rust_version}" "https://sh.rustup.rs")
  # The same machine with its tools and an old Rust.
  set(old "${WORK}/old-rust-bin")
  file(MAKE_DIRECTORY "${old}")
  file(WRITE "${old}/cargo" "#!/bin/sh\necho 'cargo 1.70.0 (ec8a8a0ca 2023-04-25)'\n")
  file(CHMOD "${old}/cargo" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "PATH=${old}:$ENV{PATH}" bash "${SOURCE_DIR}/.ci/setup" bench --dry-run
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  expect_output("setup with an old Rust" "${out}${err}" "Rust 1.70.0 is too old: safetensors needs Rust >= ${rust_version}"
                "rustup update")
  message(STATUS ".ci/setup names what a bare machine lacks, and an old Rust")
else()
  fail("unknown MODE `${MODE}`")
endif()
