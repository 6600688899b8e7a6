# Install rules: headers (ours, the generated bridge headers and cxx.h, all under
# include/safetensors/), the Rust archive and libsafetensors.so (where built), the CMake package (with a `cuda` component), a
# pkg-config file, LICENSE and NOTICE, and the command-line tool.
include(CMakePackageConfigHelpers)

set(SAFETENSORS_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/safetensors"
    CACHE STRING "Where safetensorsConfig.cmake is installed")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/safetensors" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(DIRECTORY "${SAFETENSORS_GENERATED_INCLUDE_DIR}/safetensors/ffi/src"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/safetensors/ffi" FILES_MATCHING PATTERN "*.h")
# Both libraries where the shared one is built: safetensors::safetensors links the archive
# (or, with SAFETENSORS_SHARED, the .so); safetensors::safetensors_shared is the .so either way.
install(FILES "${SAFETENSORS_RUST_STATICLIB}" DESTINATION "${CMAKE_INSTALL_LIBDIR}" RENAME "libsafetensors_rust.a")
if(TARGET safetensors_shared)
  install(TARGETS safetensors_shared EXPORT safetensorsTargets LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
endif()
if(SAFETENSORS_SHARED)
  set(_st_pc_libs "-lsafetensors")
else()
  set(_st_pc_libs "-lsafetensors_rust -lpthread -ldl -lm -lrt")
endif()

install(TARGETS safetensors EXPORT safetensorsTargets)
install(EXPORT safetensorsTargets NAMESPACE safetensors:: DESTINATION "${SAFETENSORS_INSTALL_CMAKEDIR}")

# The optional MPI target in its own export set, loaded by the package config only when the
# consumer's CMake finds MPI too.
set(SAFETENSORS_MPI OFF)
if(TARGET safetensors_mpi)
  set(SAFETENSORS_MPI ON)
  install(TARGETS safetensors_mpi EXPORT safetensorsMpiTargets)
  install(EXPORT safetensorsMpiTargets NAMESPACE safetensors:: DESTINATION "${SAFETENSORS_INSTALL_CMAKEDIR}")
endif()

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/safetensorsConfig.cmake.in" "${PROJECT_BINARY_DIR}/safetensorsConfig.cmake"
  INSTALL_DESTINATION "${SAFETENSORS_INSTALL_CMAKEDIR}"
  PATH_VARS CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/safetensorsConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/safetensorsConfig.cmake" "${PROJECT_BINARY_DIR}/safetensorsConfigVersion.cmake"
        DESTINATION "${SAFETENSORS_INSTALL_CMAKEDIR}")

if(TARGET safetensors_cli)
  install(TARGETS safetensors_cli RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
endif()

# pkg-config, for builds without CMake. Relative to its own directory, so the tree is relocatable.
set(SAFETENSORS_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig"
    CACHE STRING "Where safetensors.pc is installed")
file(RELATIVE_PATH _st_pc_prefix_from_pcdir "/prefix/${SAFETENSORS_INSTALL_PKGCONFIGDIR}" "/prefix")
configure_file("${PROJECT_SOURCE_DIR}/cmake/safetensors.pc.in" "${PROJECT_BINARY_DIR}/safetensors.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/safetensors.pc" DESTINATION "${SAFETENSORS_INSTALL_PKGCONFIGDIR}")

install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" "${PROJECT_SOURCE_DIR}/NOTICE"
        DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/safetensors")
