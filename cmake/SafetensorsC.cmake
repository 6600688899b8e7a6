# The C API: include/safetensors.h (generated from rust/capi, committed) over the same library
# as the C++ API (the Rust archive, or libsafetensors.so with SAFETENSORS_SHARED), as the target
# safetensors::c; with SAFETENSORS_INSTALL, the header beside the C++ headers and a pkg-config
# file of its own, safetensors-c.pc (safetensors.pc asks for C++20, which a C compiler refuses).
add_library(safetensors_c INTERFACE)
add_library(safetensors::c ALIAS safetensors_c)
set_target_properties(safetensors_c PROPERTIES EXPORT_NAME c)
target_include_directories(safetensors_c INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                                   $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
if(SAFETENSORS_SHARED)
  target_link_libraries(safetensors_c INTERFACE safetensors_shared)
else()
  target_link_libraries(safetensors_c INTERFACE $<BUILD_INTERFACE:safetensors_rust> $<INSTALL_INTERFACE:safetensors::rust>)
endif()

if(SAFETENSORS_INSTALL)
  install(FILES "${PROJECT_SOURCE_DIR}/include/safetensors.h" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
  install(TARGETS safetensors_c EXPORT safetensorsTargets)
  # The same libraries and relocatable prefix as safetensors.pc (cmake/SafetensorsInstall.cmake).
  configure_file("${PROJECT_SOURCE_DIR}/cmake/safetensors-c.pc.in" "${PROJECT_BINARY_DIR}/safetensors-c.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/safetensors-c.pc" DESTINATION "${SAFETENSORS_INSTALL_PKGCONFIGDIR}")
endif()
