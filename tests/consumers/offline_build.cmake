# The README's offline recipe: `cargo vendor` the crates, point cargo at them, and build with
# cargo's network off. Run by ctest as
#   cmake -DCARGO=<cargo> -DSOURCE_DIR=<repository> -DWORK=<dir> -DPROFILE=<cargo profile>
#         [-DFEATURES=<features>] -DCARGO_ENV=<VAR=value|...> -P offline_build.cmake
# The vendored crates come from cargo's own cache when it holds them all (as after any build of
# this tree), else from the network; when neither works the test is skipped (exit code 77),
# saying so. The build then runs with CARGO_HOME a fresh directory holding only the source
# replacement (no registry cache to fall back on) and CARGO_NET_OFFLINE=true, into a target
# directory of its own that is kept between runs.
cmake_minimum_required(VERSION 3.23)

set(vendor "${WORK}/vendor")
set(home "${WORK}/cargo-home")
file(REMOVE_RECURSE "${vendor}" "${home}")
file(MAKE_DIRECTORY "${home}")

# Vendoring: offline first (cargo's cache), then with the network.
foreach(net --offline "")
  execute_process(COMMAND "${CARGO}" vendor --locked ${net} --manifest-path "${SOURCE_DIR}/Cargo.toml" "${vendor}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE config ERROR_VARIABLE err)
  if(rc EQUAL 0)
    break()
  endif()
endforeach()
if(NOT rc EQUAL 0)
  message(STATUS "skipped: `cargo vendor` could not get the crates (none cached, no network):\n${err}")
  cmake_language(EXIT 77)
endif()
if(NOT config MATCHES "replace-with = \"vendored-sources\"")
  message(FATAL_ERROR "cargo vendor did not print the source replacement:\n${config}")
endif()
# What `cargo vendor` printed is the configuration the README tells users to save.
file(WRITE "${home}/config.toml" "${config}")

# The build's environment, but the generated headers go here (the build's own are in use).
string(REPLACE "|" ";" env "${CARGO_ENV}")
set(feature_args "")
if(FEATURES)
  set(feature_args --features "${FEATURES}")
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env ${env} "SAFETENSORS_CXX_INCLUDE_DIR=${WORK}/include" "CARGO_HOME=${home}"
          CARGO_NET_OFFLINE=true "${CARGO}" build --locked --lib
          --profile "${PROFILE}" --target-dir "${WORK}/target" --manifest-path "${SOURCE_DIR}/Cargo.toml" -p
          safetensors-ffi ${feature_args}
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the offline build from vendored crates failed:\n${out}${err}")
endif()
# With no registry cache and no network, every crate came from the vendored directory.
file(GLOB_RECURSE archive "${WORK}/target/*/libsafetensors_ffi.a")
if(NOT archive)
  message(FATAL_ERROR "the offline build made no libsafetensors_ffi.a under ${WORK}/target:\n${err}")
endif()
message(STATUS "built offline from ${vendor}: ${archive}")
