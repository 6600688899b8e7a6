# The binary packages (`cpack`: .tar.gz and .deb) work for an engine without Rust. Run by ctest as
#   cmake -DBUILD=<build tree> -DWORK=<scratch dir> -DSOURCE=<tests/consumers> -DCXX=<c++>
#         -DGENERATOR=<generator> [-DMAKE_PROGRAM=<ninja>] -P binary_package.cmake
# It packages the build tree (what `cmake --install` installs, so nothing is rebuilt), then for
# each package: unpacks it into a fresh directory (the .tar.gz anywhere: it is relocatable; the
# .deb with dpkg-deb -x), checks that it holds both libraries, the headers, the CMake package,
# safetensors.pc, the tool, LICENSE and NOTICE, and builds and runs find_package consumers (of
# the archive, and from the .tar.gz of libsafetensors.so too) and a pkg-config consumer, with
# cargo and rustc replaced on PATH by programs that fail, and HOME elsewhere (so ~/.cargo is
# not found).
cmake_minimum_required(VERSION 3.23)

function(fail)
  string(JOIN "" msg ${ARGN})
  message(FATAL_ERROR "${msg}")
endfunction()

# run(<what> <command>...): runs it, stops with its output on failure; the output in `run_out`.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    fail("${what} failed (${rc}):\n${out}${err}")
  endif()
  set(run_out "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/packages")

# ---- an environment without Rust --------------------------------------------------------------
set(stubs "${WORK}/no-rust-bin")
file(MAKE_DIRECTORY "${stubs}")
foreach(tool cargo rustc rustup)
  file(WRITE "${stubs}/${tool}" "#!/bin/sh\necho '${tool} was run, but a binary package must not need Rust' >&2\nexit 1\n")
  file(CHMOD "${stubs}/${tool}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
endforeach()

# ---- the packages -------------------------------------------------------------------------------
# The generators the build's CPackConfig names (TGZ and DEB), from the build tree as installed.
run("cpack" ${CMAKE_CPACK_COMMAND} --config "${BUILD}/CPackConfig.cmake" -B "${WORK}/packages")
file(GLOB tgz "${WORK}/packages/*.tar.gz")
file(GLOB deb "${WORK}/packages/*.deb")
list(LENGTH tgz ntgz)
list(LENGTH deb ndeb)
if(NOT ntgz EQUAL 1 OR NOT ndeb EQUAL 1)
  fail("cpack made ${ntgz} .tar.gz and ${ndeb} .deb files, expected one each:\n${run_out}")
endif()

# The rest runs without Rust: cargo, rustc and rustup on PATH fail, and ~/.cargo/bin is gone.
set(path "${stubs}")
string(REPLACE ":" ";" dirs "$ENV{PATH}")
foreach(dir IN LISTS dirs)
  if(NOT dir MATCHES "/\\.cargo/bin/?$" AND NOT dir MATCHES "/\\.rustup/")
    string(APPEND path ":${dir}")
  endif()
endforeach()
set(ENV{PATH} "${path}")
set(ENV{HOME} "${WORK}/home")
foreach(var CARGO CARGO_HOME RUSTC RUSTUP_HOME RUSTUP_TOOLCHAIN)
  unset(ENV{${var}})
endforeach()
execute_process(COMMAND cargo --version RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(rc EQUAL 0)
  fail("cargo still runs with PATH=${path}")
endif()

set(generator_args -G "${GENERATOR}")
if(MAKE_PROGRAM)
  list(APPEND generator_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

# check_prefix(<name> <prefix> <targets>...): what is in the unpacked package, find_package
# consumers of each target, and a pkg-config consumer.
function(check_prefix name prefix)
  file(GLOB_RECURSE config "${prefix}/*/safetensorsConfig.cmake")
  file(GLOB_RECURSE pc "${prefix}/*/pkgconfig/safetensors.pc")
  file(GLOB_RECURSE archive "${prefix}/*/libsafetensors_rust.a")
  file(GLOB_RECURSE shared "${prefix}/*/libsafetensors.so")
  foreach(what config pc archive shared)
    list(LENGTH ${what} n)
    if(NOT n EQUAL 1)
      fail("${name}: expected one ${what} file in the package, found ${n}: ${${what}}")
    endif()
  endforeach()
  foreach(f include/safetensors/safetensors.hpp include/safetensors/ffi/src/file.rs.h include/safetensors/ffi/src/rust/cxx.h
            bin/safetensors share/doc/safetensors/LICENSE share/doc/safetensors/NOTICE)
    if(NOT EXISTS "${prefix}/${f}")
      fail("${name}: the package has no ${f}")
    endif()
  endforeach()
  run("${name}: safetensors --version" "${prefix}/bin/safetensors" --version)
  message(STATUS "${name}: ${run_out}")

  foreach(target IN LISTS ARGN)
    string(REPLACE "::" "-" dir "${name}-${target}")
    set(build "${WORK}/${dir}")
    run("${name}: configuring a find_package consumer of ${target}" ${CMAKE_COMMAND} -S "${SOURCE}/find_package" -B
        "${build}" ${generator_args} "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${prefix}"
        "-DSAFETENSORS_TARGET=${target}")
    run("${name}: building the find_package consumer of ${target}" ${CMAKE_COMMAND} --build "${build}")
    run("${name}: running the find_package consumer of ${target}" "${build}/consumer")
    message(STATUS "${name}, find_package, ${target}: ${run_out}")
  endforeach()

  find_program(PKG_CONFIG pkg-config REQUIRED)
  get_filename_component(pcdir "${pc}" DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} "${pcdir}")
  run("${name}: pkg-config --cflags --libs safetensors" ${PKG_CONFIG} --cflags --libs safetensors)
  string(STRIP "${run_out}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run("${name}: c++ main.cpp $(pkg-config --cflags --libs safetensors)" "${CXX}" "${SOURCE}/main.cpp" ${flags} -o
      "${WORK}/${name}-pkg-config-consumer")
  run("${name}: running the pkg-config consumer" "${WORK}/${name}-pkg-config-consumer")
  message(STATUS "${name}, pkg-config: ${run_out}")
endfunction()

# The archive, unpacked somewhere its build never saw: relocatable.
file(MAKE_DIRECTORY "${WORK}/tgz")
execute_process(COMMAND ${CMAKE_COMMAND} -E tar xzf "${tgz}" WORKING_DIRECTORY "${WORK}/tgz" RESULT_VARIABLE rc)
get_filename_component(top "${tgz}" NAME)
string(REGEX REPLACE "\\.tar\\.gz$" "" top "${top}")
if(NOT rc EQUAL 0 OR NOT IS_DIRECTORY "${WORK}/tgz/${top}")
  fail("cannot unpack ${tgz} into ${WORK}/tgz/${top}")
endif()
check_prefix(tgz "${WORK}/tgz/${top}" safetensors::safetensors safetensors::safetensors_shared)

# The Debian package, unpacked as dpkg would install it, under a fresh directory.
find_program(DPKG_DEB dpkg-deb)
if(NOT DPKG_DEB)
  message(STATUS "deb: not unpacked: no dpkg-deb on this machine")
else()
  run("dpkg-deb --info" ${DPKG_DEB} --info "${deb}")
  if(NOT run_out MATCHES "Package: safetensors" OR NOT run_out MATCHES "Depends: ")
    fail("the .deb's control file lacks its name or dependencies:\n${run_out}")
  endif()
  run("dpkg-deb -x" ${DPKG_DEB} -x "${deb}" "${WORK}/deb")
  # The same files as the archive: the static library's consumer is enough here.
  check_prefix(deb "${WORK}/deb/usr" safetensors::safetensors)
endif()
