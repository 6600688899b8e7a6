# libsafetensors.so: the Rust archive (the bridge, cxx's runtime, the core, Rust's std) linked
# whole into one shared library that exports only what the public headers call
# (cmake/safetensors.map) and binds its own references (-Bsymbolic). Programs that also link
# another cxx-based Rust library, or a second Rust standard library, then see no duplicate or
# interposed symbols of ours.
#
# SOVERSION: while the major version is 0, every minor release may change the bridge, so the
# soname carries MAJOR.MINOR (libsafetensors.so.0.1); from 1.0 on it is MAJOR.
if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
  message(FATAL_ERROR "SAFETENSORS_SHARED: the shared library is built for Linux only")
endif()
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_st_soversion "${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")
else()
  set(_st_soversion "${PROJECT_VERSION_MAJOR}")
endif()

# A shared library needs a source of its own; everything else comes from the archive.
set(_st_shared_source "${PROJECT_BINARY_DIR}/safetensors_shared.cpp")
file(CONFIGURE OUTPUT "${_st_shared_source}" CONTENT "// libsafetensors.so: its code is the Rust archive, linked whole.\n")
add_library(safetensors_shared SHARED "${_st_shared_source}")
set(_st_map "${PROJECT_SOURCE_DIR}/cmake/safetensors.map")
target_link_options(
  safetensors_shared PRIVATE "LINKER:--whole-archive" "${SAFETENSORS_RUST_STATICLIB}" "LINKER:--no-whole-archive"
  "LINKER:--version-script=${_st_map}" "LINKER:-Bsymbolic" "LINKER:--no-undefined")
target_link_libraries(safetensors_shared PRIVATE Threads::Threads ${CMAKE_DL_LIBS} m rt)
if(TARGET safetensors_cargo_build)
  add_dependencies(safetensors_shared safetensors_cargo_build)
else()
  add_dependencies(safetensors_shared cargo-build_safetensors_ffi)  # Corrosion's build target
endif()
# Usable on its own (`safetensors::safetensors_shared` of an installed package): the headers and
# C++20 come with it, as with safetensors::safetensors.
target_compile_features(safetensors_shared INTERFACE cxx_std_20)
target_include_directories(
  safetensors_shared INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                               $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_include_directories(safetensors_shared SYSTEM INTERFACE $<BUILD_INTERFACE:${SAFETENSORS_GENERATED_INCLUDE_DIR}>)
set_target_properties(
  safetensors_shared PROPERTIES OUTPUT_NAME safetensors VERSION "${PROJECT_VERSION}" SOVERSION "${_st_soversion}"
                                LINK_DEPENDS "${_st_map};${SAFETENSORS_RUST_STATICLIB}")
