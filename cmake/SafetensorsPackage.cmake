# Binary packages for engines whose build machines have no Rust: `cpack` in a build tree makes
#   safetensors-<version>-Linux-<arch>.tar.gz   relocatable: unpack anywhere, point CMAKE_PREFIX_PATH
#                                              (or PKG_CONFIG_PATH=<dir>/lib/pkgconfig) at it
#   safetensors_<version>_<arch>.deb            the same files under /usr
# from what `cmake --install` installs (SafetensorsInstall.cmake): the static and shared
# libraries, the headers, the CMake package, safetensors.pc, the `safetensors` tool, LICENSE
# and NOTICE. The package config and the .pc file find their prefix from their own place, so
# both work wherever they are unpacked (tests/consumers/binary_package.cmake checks each one,
# with no cargo or rustc on PATH).
set(CPACK_PACKAGE_NAME "safetensors")
set(CPACK_PACKAGE_VENDOR "the safetensors for C++ authors")
set(CPACK_PACKAGE_CONTACT "the safetensors for C++ authors")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_GENERATOR "TGZ;DEB" CACHE STRING "Package formats `cpack` makes")
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages" CACHE PATH "Where `cpack` writes the packages")

# safetensors-<version>-Linux-<arch>.tar.gz, with one top directory named like the file.
set(CPACK_SYSTEM_NAME "${CMAKE_SYSTEM_NAME}-${CMAKE_SYSTEM_PROCESSOR}")
set(CPACK_ARCHIVE_COMPONENT_INSTALL OFF)
set(CPACK_INCLUDE_TOPLEVEL_DIRECTORY ON)

# Debian: /usr, the default file name (name_version_arch.deb), and what the tool and the
# shared library run on: dpkg-shlibdeps computes it where installed (dpkg-dev), else the
# C and C++ runtimes are named without versions.
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "libdevel")
find_program(_st_shlibdeps dpkg-shlibdeps)
if(_st_shlibdeps)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libgcc-s1, libstdc++6")
endif()

include(CPack)
