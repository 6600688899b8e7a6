// Helpers shared by the C++ tests: temporary directories, hand-built files, SHA-256, and the
// TSV manifests written by tests/python/interop.py.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <safetensors/error.hpp>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace test {

namespace fs = std::filesystem;

/// The error `f` throws, as a value (`ok()` when it throws none).
template <class F>
safetensors::Status thrown(F&& f) {
  try {
    f();
  } catch (const safetensors::Error& e) {
    return e.status();
  }
  return {};
}

/// The kind of the `safetensors::Error` that `f` throws (a test failure if it throws none).
template <class F>
safetensors::ErrorKind kind_of(F&& f) {
  auto status = thrown(std::forward<F>(f));
  if (status.ok()) ADD_FAILURE() << "no safetensors::Error thrown";
  return status.kind();
}

/// Both faces of one call agree: the nothrow status equals what the throwing call throws.
inline void expect_same(const safetensors::Status& nothrow, const safetensors::Status& throwing) {
  EXPECT_EQ(nothrow.ok(), throwing.ok()) << nothrow.message() << " | " << throwing.message();
  EXPECT_EQ(nothrow.kind(), throwing.kind());
  EXPECT_EQ(nothrow.message(), throwing.message());
}

/// A fresh directory removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("safetensors-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const fs::path& path() const { return path_; }
  [[nodiscard]] fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline void write_bytes(const fs::path& path, std::span<const std::uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::vector<std::uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The length prefix, `json` padded with spaces to a multiple of 8 (as writers do, so the data
/// is aligned), then `data_len` bytes counting up from 0 (mod 251).
inline std::vector<std::uint8_t> raw_file(std::string_view json, std::size_t data_len, bool pad = true) {
  std::string text(json);
  if (pad) text.resize((text.size() + 7) / 8 * 8, ' ');
  json = text;
  // Sized once and filled in place: GCC 12 at -O3 reports a false -Warray-bounds for inserting
  // into the 8-byte vector this used to start from.
  std::vector<std::uint8_t> out(8 + json.size() + data_len);
  std::uint64_t n = json.size();
  for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, json.data(), json.size());
  for (std::size_t i = 0; i < data_len; ++i) out[8 + json.size() + i] = static_cast<std::uint8_t>(i % 251);
  return out;
}

// ---- memory bounds, measured by the kernel ---------------------------------------------------

/// Whether this build can run code under an address-space limit: the sanitizers reserve
/// terabytes of shadow memory up front, so a limit makes them fail before the code runs.
inline constexpr bool address_space_limits_work =
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    false;
#else
    true;
#endif
#else
    true;
#endif

/// The process's address space now (`VmSize`), in bytes.
inline std::uint64_t address_space_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}

/// Runs `body` in a child process whose address space may grow by at most `extra` bytes
/// (`RLIMIT_AS`): the child's exit code is what `body` returns, 99 for an escaped exception.
/// Returns the child's wait status: a memory bound that is exceeded shows as a signal (an
/// abort on a failed allocation) or a code other than 0, never as a crash of the test itself.
template <class F>
int with_address_space(std::uint64_t extra, F&& body) {
  const std::uint64_t limit = address_space_bytes() + extra;
  std::cout.flush();
  pid_t child = ::fork();
  if (child == 0) {
    rlimit rl{limit, limit};
    if (::setrlimit(RLIMIT_AS, &rl) != 0) _exit(98);
    int code = 99;
    try {
      code = body();
    } catch (...) {
    }
    std::cout.flush();
    _exit(code);
  }
  int status = -1;
  if (child > 0) ::waitpid(child, &status, 0);
  return status;
}

/// A wait status as words, for a failed expectation.
inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

// ---- SHA-256 (FIPS 180-4), to compare tensor bytes with digests computed by Python ----------

class Sha256 {
 public:
  void update(std::span<const std::byte> data) {
    for (auto b : data) {
      block_[fill_++] = static_cast<std::uint8_t>(b);
      if (fill_ == 64) {
        compress();
        fill_ = 0;
      }
    }
    bits_ += static_cast<std::uint64_t>(data.size()) * 8;
  }

  std::string hex() {
    std::uint64_t bits = bits_;
    std::array<std::byte, 1> one{std::byte{0x80}};
    update(one);
    std::array<std::byte, 1> zero{std::byte{0}};
    while (fill_ != 56) update(zero);
    std::array<std::byte, 8> len{};
    for (int i = 0; i < 8; ++i)
      len[static_cast<std::size_t>(i)] = static_cast<std::byte>(bits >> (56 - 8 * i));
    update(len);
    std::ostringstream s;
    for (auto h : h_) s << std::hex << std::setw(8) << std::setfill('0') << h;
    return s.str();
  }

 private:
  static std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress() {
    static constexpr std::array<std::uint32_t, 64> k = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::array<std::uint32_t, 64> w{};
    for (std::size_t i = 0; i < 16; ++i) {
      w[i] = static_cast<std::uint32_t>(block_[4 * i]) << 24 |
             static_cast<std::uint32_t>(block_[4 * i + 1]) << 16 |
             static_cast<std::uint32_t>(block_[4 * i + 2]) << 8 | block_[4 * i + 3];
    }
    for (std::size_t i = 16; i < 64; ++i) {
      auto s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      auto s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    auto v = h_;
    for (std::size_t i = 0; i < 64; ++i) {
      auto s1 = rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25);
      auto ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
      auto t1 = v[7] + s1 + ch + k[i] + w[i];
      auto s0 = rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22);
      auto maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
      v = {t1 + s0 + maj, v[0], v[1], v[2], v[3] + t1, v[4], v[5], v[6]};
    }
    for (std::size_t i = 0; i < 8; ++i) h_[i] += v[i];
  }

  std::array<std::uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<std::uint8_t, 64> block_{};
  std::size_t fill_ = 0;
  std::uint64_t bits_ = 0;
};

inline std::string sha256_hex(std::span<const std::byte> data) {
  Sha256 h;
  h.update(data);
  return h.hex();
}

// ---- manifests -------------------------------------------------------------------------------

struct ExpectedTensor {
  std::string dtype;
  std::vector<std::size_t> shape;
  std::size_t begin = 0, end = 0;
  std::string sha256;
};

struct ExpectedFile {
  bool has_metadata = false;
  std::size_t tensor_count = 0;
  std::map<std::string, std::string> metadata;
  std::map<std::string, ExpectedTensor> tensors;
};

inline std::string unhex(const std::string& h) {
  if (h == "-") return {};
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

/// Reads a manifest.tsv (format in tests/python/interop.py).
inline std::map<std::string, ExpectedFile> read_manifest(const fs::path& path) {
  std::map<std::string, ExpectedFile> files;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string tag, file;
    std::getline(f, tag, '\t');
    std::getline(f, file, '\t');
    std::vector<std::string> rest;
    for (std::string col; std::getline(f, col, '\t');) rest.push_back(col);
    auto& e = files[file];
    if (tag == "F") {
      e.has_metadata = rest.at(0) == "1";
      e.tensor_count = std::stoul(rest.at(1));
    } else if (tag == "M") {
      e.metadata[unhex(rest.at(0))] = unhex(rest.at(1));
    } else if (tag == "T") {
      ExpectedTensor t;
      t.dtype = rest.at(1);
      if (rest.at(2) != "-") {
        std::istringstream dims(rest.at(2));
        for (std::string d; std::getline(dims, d, ',');) t.shape.push_back(std::stoul(d));
      }
      t.begin = std::stoul(rest.at(3));
      t.end = std::stoul(rest.at(4));
      t.sha256 = rest.at(5);
      e.tensors[unhex(rest.at(0))] = t;
    }
  }
  return files;
}

/// A fixture directory prepared by ctest (see tests/CMakeLists.txt), or nullopt with the reason
/// already reported: a skip, or, for fixtures that need only Python (not the network), a
/// failure when SAFETENSORS_REQUIRE_PYTHON=1.
/// `name` is a folder under $SAFETENSORS_FIXTURES, or, for "minilm", $SAFETENSORS_MODEL_CACHE.
inline std::optional<fs::path> fixture(const std::string& name, const std::string& manifest,
                                       bool needs_network = false) {
  const bool model = name == "minilm";
  const char* root = std::getenv(model ? "SAFETENSORS_MODEL_CACHE" : "SAFETENSORS_FIXTURES");
#if defined(SAFETENSORS_TEST_FIXTURES) && defined(SAFETENSORS_TEST_MODEL_CACHE)
  if (!root) root = model ? SAFETENSORS_TEST_MODEL_CACHE : SAFETENSORS_TEST_FIXTURES;
#endif
  fs::path dir = root ? (model ? fs::path(root) : fs::path(root) / name) : fs::path();
  if (root && fs::exists(dir / manifest)) return dir;
  const char* require = std::getenv("SAFETENSORS_REQUIRE_PYTHON");
  std::string why = "fixture " + name + "/" + manifest + " is missing (needs Python with numpy and " +
                    "safetensors==0.8.0" + (needs_network ? " and access to PyPI" : "") +
                    "; run through ctest)";
  if (!needs_network && require && std::string_view(require) == "1") {
    ADD_FAILURE() << why;
  } else {
    std::cout << "[  SKIPPED ] " << why << "\n";
  }
  return std::nullopt;
}

}  // namespace test
