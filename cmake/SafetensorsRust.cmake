# Builds the Rust staticlib (rust/ffi: rust/cxx's C++ bridge and rust/capi's C API) and provides:
#   safetensors_rust                    INTERFACE target linking it, with its system libraries
#   SAFETENSORS_GENERATED_INCLUDE_DIR   where the generated bridge headers and cxx.h land
#   SAFETENSORS_BRIDGE_HEADERS          those headers (safetensors/ffi/src/<area>.rs.h, one per
#                                       bridge of rust/cxx/build.rs, and rust/cxx.h beside them)
#   SAFETENSORS_RUST_STATICLIB          the built archive (for install)
#   SAFETENSORS_CARGO_BUILD             (cargo step only) the `cargo build` command for a package
#                                       of the workspace, as this build runs it
#   SAFETENSORS_CARGO_ENV               the environment every cargo run of this build gets
#                                       (VAR=value items), tests' `cargo test` included
#   SAFETENSORS_CARGO                   the cargo program (Corrosion's, when it builds the crate)
#
# Rust (cargo and rustc) at least the workspace's rust-version is required; configure stops
# saying which version was found and how to get a newer one.
#
# Corrosion is used when find_package(Corrosion) finds it, when FETCHCONTENT_SOURCE_DIR_CORROSION
# points to a checkout, or when SAFETENSORS_FETCH_CORROSION=ON (pinned tag); otherwise a plain
# cargo step builds the same archive. Both paths give the same targets.

set(SAFETENSORS_CORROSION_TAG "v0.6.1" CACHE STRING "Corrosion tag fetched when SAFETENSORS_FETCH_CORROSION=ON")
set(SAFETENSORS_CARGO_PROFILE "" CACHE STRING "Cargo profile for the Rust core (default: dev for Debug builds, release otherwise)")
set(SAFETENSORS_CARGO_TARGET_DIR "${PROJECT_BINARY_DIR}/cargo" CACHE PATH "Cargo target directory for the plain cargo step (presets share one)")
set(SAFETENSORS_CARGO_RUSTFLAGS "" CACHE STRING "RUSTFLAGS for the cargo step (the fuzz preset adds coverage instrumentation)")
set(SAFETENSORS_CARGO_TARGET "" CACHE STRING "Cargo --target triple (needed with RUSTFLAGS, so they do not reach build scripts)")

if(SAFETENSORS_CARGO_PROFILE)
  set(_st_profile "${SAFETENSORS_CARGO_PROFILE}")
elseif(CMAKE_BUILD_TYPE STREQUAL "Debug")
  set(_st_profile dev)
else()
  set(_st_profile release)
endif()

# The bridges of rust/cxx/build.rs (BRIDGES), whose generated headers the C++ API includes.
set(SAFETENSORS_BRIDGE_AREAS status file checkpoint writer convert stream cuda memory distributed remote)

# SAFETENSORS_BRIDGE_HEADERS for the SAFETENSORS_GENERATED_INCLUDE_DIR just chosen.
macro(_st_list_bridge_headers)
  set(SAFETENSORS_BRIDGE_HEADERS "${SAFETENSORS_GENERATED_INCLUDE_DIR}/safetensors/ffi/src/rust/cxx.h")
  foreach(_st_area IN LISTS SAFETENSORS_BRIDGE_AREAS)
    list(APPEND SAFETENSORS_BRIDGE_HEADERS "${SAFETENSORS_GENERATED_INCLUDE_DIR}/safetensors/ffi/src/${_st_area}.rs.h")
  endforeach()
endmacro()

set(_st_features "")
if(SAFETENSORS_CUDA)
  list(APPEND _st_features cuda)
endif()
if(SAFETENSORS_REMOTE)
  list(APPEND _st_features remote)
endif()
# As cargo's --features takes them (a comma-separated list), for every command that runs cargo.
list(JOIN _st_features "," SAFETENSORS_CARGO_FEATURES)

# The C++ half of the bridge never throws (every call reports through a status; see
# rust/cxx/src/lib.rs), so cxx's C++ runtime is compiled without exceptions too: then a program
# built with -fno-exceptions links no exception machinery from this library at all. rust/cxx's
# build script compiles the generated bridge with -fno-exceptions on its own; cxx's runtime
# (cxx.cc) takes its flags from CXXFLAGS.
set(SAFETENSORS_CARGO_ENV "SAFETENSORS_CXX_INCLUDE_DIR=${PROJECT_BINARY_DIR}/generated/include"
                          "CXX=${CMAKE_CXX_COMPILER}" "CXXFLAGS=$ENV{CXXFLAGS} -fno-exceptions")

# The oldest Rust the crates build with: Cargo.toml's rust-version, written once there.
file(STRINGS "${PROJECT_SOURCE_DIR}/Cargo.toml" _st_rust_version REGEX "^rust-version = \"[0-9.]+\"$")
string(REGEX REPLACE "^rust-version = \"([0-9.]+)\"$" "\\1" SAFETENSORS_RUST_VERSION "${_st_rust_version}")
string(CONCAT _st_get_rust "install Rust with rustup (https://rustup.rs: curl --proto '=https' --tlsv1.2 -sSf "
              "https://sh.rustup.rs | sh), or update it with `rustup update`")

# safetensors_check_cargo(<cargo>): stops unless `<cargo> --version` is at least rust-version.
function(safetensors_check_cargo cargo)
  execute_process(COMMAND "${cargo}" --version RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "^cargo ([0-9]+\\.[0-9]+(\\.[0-9]+)?)")
    message(FATAL_ERROR "safetensors: `${cargo} --version` failed (${out}${err}): it needs Rust >= "
                        "${SAFETENSORS_RUST_VERSION}; ${_st_get_rust}")
  endif()
  if(CMAKE_MATCH_1 VERSION_LESS SAFETENSORS_RUST_VERSION)
    message(FATAL_ERROR "safetensors: Rust ${CMAKE_MATCH_1} found (${cargo}), Rust >= ${SAFETENSORS_RUST_VERSION} "
                        "needed: ${_st_get_rust}")
  endif()
endfunction()

find_package(Threads REQUIRED)
set(_st_system_libs Threads::Threads ${CMAKE_DL_LIBS} m rt)

# The `corrosion` preset must test Corrosion, not fall back to the cargo step unnoticed.
option(SAFETENSORS_REQUIRE_CORROSION "Stop unless the Rust core is built with Corrosion" OFF)

set(_st_use_corrosion OFF)
if(SAFETENSORS_FETCH_CORROSION OR FETCHCONTENT_SOURCE_DIR_CORROSION)
  include(FetchContent)
  FetchContent_Declare(
    Corrosion
    GIT_REPOSITORY https://github.com/corrosion-rs/corrosion.git
    GIT_TAG ${SAFETENSORS_CORROSION_TAG})
  FetchContent_MakeAvailable(Corrosion)
  set(_st_use_corrosion ON)
else()
  find_package(Corrosion QUIET)
  if(Corrosion_FOUND)
    set(_st_use_corrosion ON)
  endif()
endif()
if(SAFETENSORS_REQUIRE_CORROSION AND NOT _st_use_corrosion)
  message(FATAL_ERROR "SAFETENSORS_REQUIRE_CORROSION=ON but no Corrosion: set the environment variable "
                      "SAFETENSORS_CORROSION_DIR (or FETCHCONTENT_SOURCE_DIR_CORROSION) to a Corrosion checkout")
endif()

if(_st_use_corrosion)
  message(STATUS "safetensors: building the Rust core with Corrosion (cargo profile ${_st_profile})")
  set(SAFETENSORS_GENERATED_INCLUDE_DIR "${PROJECT_BINARY_DIR}/generated/include")
  _st_list_bridge_headers()
  corrosion_import_crate(
    MANIFEST_PATH "${PROJECT_SOURCE_DIR}/Cargo.toml"
    CRATES safetensors-ffi
    CRATE_TYPES staticlib
    PROFILE ${_st_profile}
    FEATURES ${_st_features}
    LOCKED)
  corrosion_set_env_vars(safetensors_ffi ${SAFETENSORS_CARGO_ENV})
  # The cargo Corrosion found, for everything else that runs cargo (the tests' `cargo test`).
  set(SAFETENSORS_CARGO "${Rust_CARGO_CACHED}")
  safetensors_check_cargo("${SAFETENSORS_CARGO}")
  set(SAFETENSORS_RUST_STATICLIB "$<TARGET_PROPERTY:safetensors_ffi-static,IMPORTED_LOCATION>")
  add_library(safetensors_rust INTERFACE)
  target_link_libraries(safetensors_rust INTERFACE safetensors_ffi ${_st_system_libs})
else()
  find_program(SAFETENSORS_CARGO cargo HINTS "$ENV{CARGO_HOME}/bin" "$ENV{HOME}/.cargo/bin")
  if(NOT SAFETENSORS_CARGO)
    message(FATAL_ERROR "safetensors: no cargo found (on PATH, in $CARGO_HOME/bin or ~/.cargo/bin): the Rust core "
                        "needs Rust >= ${SAFETENSORS_RUST_VERSION}; ${_st_get_rust}. Or set SAFETENSORS_CARGO to it.")
  endif()
  safetensors_check_cargo("${SAFETENSORS_CARGO}")
  message(STATUS "safetensors: building the Rust core with cargo (${SAFETENSORS_CARGO}, profile ${_st_profile}); "
                 "Corrosion not found")
  if(_st_profile STREQUAL "dev")
    set(_st_profile_dir debug)
  else()
    set(_st_profile_dir ${_st_profile})
  endif()
  set(_st_out_dir "${SAFETENSORS_CARGO_TARGET_DIR}")
  set(_st_target_args "")
  if(SAFETENSORS_CARGO_TARGET)
    set(_st_out_dir "${SAFETENSORS_CARGO_TARGET_DIR}/${SAFETENSORS_CARGO_TARGET}")
    set(_st_target_args --target ${SAFETENSORS_CARGO_TARGET})
  endif()
  set(SAFETENSORS_GENERATED_INCLUDE_DIR "${SAFETENSORS_CARGO_TARGET_DIR}/include")
  _st_list_bridge_headers()
  list(TRANSFORM SAFETENSORS_CARGO_ENV REPLACE "^SAFETENSORS_CXX_INCLUDE_DIR=.*$"
                                               "SAFETENSORS_CXX_INCLUDE_DIR=${SAFETENSORS_GENERATED_INCLUDE_DIR}")
  set(SAFETENSORS_RUST_STATICLIB "${_st_out_dir}/${_st_profile_dir}/libsafetensors_ffi.a")
  set(_st_feature_args "")
  if(_st_features)
    set(_st_feature_args --features ${SAFETENSORS_CARGO_FEATURES})
  endif()
  # `cargo build` of a library of this workspace as this build wants it (environment, profile,
  # target directory and triple); callers add `-p <package>`. One command for every package, so
  # that they share the target directory without rebuilding each other's dependencies.
  set(SAFETENSORS_CARGO_BUILD
      ${CMAKE_COMMAND} -E env ${SAFETENSORS_CARGO_ENV} "RUSTFLAGS=${SAFETENSORS_CARGO_RUSTFLAGS}" ${SAFETENSORS_CARGO}
      build --locked --lib
      --profile ${_st_profile} --target-dir ${SAFETENSORS_CARGO_TARGET_DIR} ${_st_target_args}
      --manifest-path ${PROJECT_SOURCE_DIR}/Cargo.toml)
  # Always runs: cargo decides what is stale. The byproducts let Ninja know who makes them.
  add_custom_target(
    safetensors_cargo_build ALL
    COMMAND ${SAFETENSORS_CARGO_BUILD} -p safetensors-ffi ${_st_feature_args}
    BYPRODUCTS "${SAFETENSORS_RUST_STATICLIB}" ${SAFETENSORS_BRIDGE_HEADERS}
    WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
    USES_TERMINAL
    COMMENT "Building the safetensors Rust core with cargo"
    VERBATIM)
  add_library(safetensors_rust INTERFACE)
  target_link_libraries(safetensors_rust INTERFACE "${SAFETENSORS_RUST_STATICLIB}" ${_st_system_libs})
  add_dependencies(safetensors_rust safetensors_cargo_build)
endif()
