// The version: the linked library reports the headers' version, which is the project's.
#include <gtest/gtest.h>
#include <safetensors/safetensors.hpp>

#include <string>

TEST(Version, LibraryReportsTheHeadersVersion) {
  EXPECT_EQ(safetensors::version(), safetensors::header_version);
  EXPECT_EQ(safetensors::version().to_string(), SAFETENSORS_VERSION_STRING);
}

TEST(Version, MatchesTheProjectVersion) {
  // SAFETENSORS_TEST_PROJECT_VERSION is CMake's PROJECT_VERSION, read from version.hpp.
  EXPECT_EQ(std::string(SAFETENSORS_VERSION_STRING), SAFETENSORS_TEST_PROJECT_VERSION);
  EXPECT_EQ(safetensors::header_version.major, SAFETENSORS_VERSION_MAJOR);
  EXPECT_EQ(safetensors::header_version.minor, SAFETENSORS_VERSION_MINOR);
  EXPECT_EQ(safetensors::header_version.patch, SAFETENSORS_VERSION_PATCH);
}
