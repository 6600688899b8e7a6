// `safetensors stats`, run as a program: its figures against NumPy's on the real
// all-MiniLM-L6-v2 file (tests/python/stats_oracle.py), special values counted, tensor
// selection, and its exit codes.
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdio>
#include <limits>

#include "program.hpp"

using safetensors::Dtype;
using safetensors::TensorView;

namespace {

using test::cli;

/// The number after `"key": ` in one line of --json output (NaN for null).
double field(const std::string& line, const std::string& key) {
  auto at = line.find("\"" + key + "\": ");
  if (at == std::string::npos) {
    ADD_FAILURE() << key << " missing in " << line;
    return 0;
  }
  std::size_t value = at + key.size() + 4;
  if (line.compare(value, 4, "null") == 0) return std::numeric_limits<double>::quiet_NaN();
  return std::strtod(line.c_str() + value, nullptr);
}

/// The --json line of tensor `name`.
std::string line_of(const std::string& out, const std::string& name) {
  auto at = out.find("{\"name\": \"" + name + "\"");
  if (at == std::string::npos) return {};
  return out.substr(at, out.find('\n', at) - at);
}

}  // namespace

TEST(CliStats, MatchesNumpyOnTheRealMiniLmFile) {
  auto dir = test::fixture("minilm_stats", "stats.tsv", /*needs_network=*/true);
  if (!dir) return;
  auto model = test::fs::path(SAFETENSORS_TEST_MODEL_CACHE) / "model.safetensors";
  auto r = cli({"stats", model.string(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(*dir / "stats.tsv");
  int tensors = 0;
  for (std::string row; std::getline(in, row);) {
    std::vector<std::string> c;
    std::istringstream cols(row);
    for (std::string col; std::getline(cols, col, '\t');) c.push_back(col);
    ASSERT_EQ(c.size(), 9u) << row;
    auto line = line_of(r.out, c[0]);
    ASSERT_FALSE(line.empty()) << c[0];
    const char* keys[] = {"min", "max", "mean", "std"};
    for (int k = 0; k < 4; ++k) {
      double want = std::stod(c[static_cast<std::size_t>(k) + 1]);
      double got = field(line, keys[k]);
      // min and max are values of the tensor: exact. Sums may differ in the last bits.
      double tol = k < 2 ? 0.0 : 1e-9 * std::max(1.0, std::fabs(want));
      EXPECT_NEAR(got, want, tol) << c[0] << " " << keys[k];
    }
    const char* counts[] = {"nan", "pos_inf", "neg_inf", "zeros"};
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(field(line, counts[k]), std::stod(c[static_cast<std::size_t>(k) + 5]))
          << c[0] << " " << counts[k];
    }
    ++tensors;
  }
  EXPECT_EQ(tensors, 104);
}

TEST(CliStats, CountsSpecialValuesOfNarrowFloatsAndSelectsTensors) {
  test::TempDir tmp;
  // BF16: 1, -3, 0, -0, +inf, -inf, NaN, 2.
  std::vector<std::uint16_t> bf16 = {0x3F80, 0xC040, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x4000};
  std::vector<std::uint8_t> e4m3 = {0x38, 0x7F, 0x40, 0x00};  // 1, NaN, 2, 0
  std::vector<std::complex<float>> c = {{1, 2}};
  safetensors::save_file(tmp / "m.safetensors",
                         std::map<std::string, TensorView>{
                             {"b", TensorView{Dtype::BF16, {2, 4}, std::as_bytes(std::span(bf16)), {}}},
                             {"e", TensorView{Dtype::F8_E4M3, {4}, std::as_bytes(std::span(e4m3)), {}}},
                             {"c", TensorView{Dtype::C64, {1}, std::as_bytes(std::span(c)), {}}}});
  auto r = cli({"stats", (tmp / "m.safetensors").string(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto b = line_of(r.out, "b");
  EXPECT_EQ(field(b, "min"), -3.0);
  EXPECT_EQ(field(b, "max"), 2.0);
  EXPECT_EQ(field(b, "mean"), 0.0);
  EXPECT_NEAR(field(b, "std"), std::sqrt(14.0 / 5.0), 1e-15);  // finite: 1 -3 0 0 2
  EXPECT_EQ(field(b, "nan"), 1);
  EXPECT_EQ(field(b, "pos_inf"), 1);
  EXPECT_EQ(field(b, "neg_inf"), 1);
  EXPECT_EQ(field(b, "zeros"), 2);
  auto e = line_of(r.out, "e");
  EXPECT_EQ(field(e, "mean"), 1.0);
  EXPECT_EQ(field(e, "nan"), 1);
  EXPECT_NE(line_of(r.out, "c").find("skipped"), std::string::npos) << r.out;

  auto only = cli({"stats", (tmp / "m.safetensors").string(), "e"});
  EXPECT_EQ(only.code, 0) << only.err;
  EXPECT_NE(only.out.find("F8_E4M3"), std::string::npos) << only.out;
  EXPECT_EQ(only.out.find("BF16"), std::string::npos) << only.out;

  auto missing = cli({"stats", (tmp / "m.safetensors").string(), "nope"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("TensorNotFound"), std::string::npos) << missing.err;
  EXPECT_EQ(cli({"stats"}).code, 2);
  EXPECT_EQ(cli({"stats", (tmp / "m.safetensors").string(), "--bogus"}).code, 2);
  EXPECT_EQ(cli({"stats", (tmp / "absent.safetensors").string()}).code, 1);
}

// Through F64, 2^53 + 1 and the 64-bit extremes would print rounded (9007199254740992,
// 9223372036854775808, 18446744073709551616): integers are read as integers.
TEST(CliStats, IntegerExtremesAreExact) {
  test::TempDir tmp;
  std::vector<std::int64_t> i64 = {std::numeric_limits<std::int64_t>::min(), 0,
                                   std::numeric_limits<std::int64_t>::max()};
  std::vector<std::uint64_t> u64 = {(std::uint64_t{1} << 53) + 1, std::numeric_limits<std::uint64_t>::max()};
  std::vector<std::int8_t> i8 = {-128, 127, 0, 0};
  safetensors::save_file(tmp / "ints.safetensors",
                         std::map<std::string, TensorView>{
                             {"i64", TensorView{Dtype::I64, {3}, std::as_bytes(std::span(i64)), {}}},
                             {"u64", TensorView{Dtype::U64, {2}, std::as_bytes(std::span(u64)), {}}},
                             {"i8", TensorView{Dtype::I8, {4}, std::as_bytes(std::span(i8)), {}}}});
  auto r = cli({"stats", (tmp / "ints.safetensors").string(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto i = line_of(r.out, "i64");
  EXPECT_TRUE(test::has(i, R"("min": -9223372036854775808, "max": 9223372036854775807,)")) << i;
  EXPECT_NEAR(field(i, "mean"), -1.0 / 3.0, 1e-15);  // the sum, -1, is exact
  EXPECT_EQ(field(i, "zeros"), 1);
  auto u = line_of(r.out, "u64");
  EXPECT_TRUE(test::has(u, R"("min": 9007199254740993, "max": 18446744073709551615,)")) << u;
  auto b = line_of(r.out, "i8");
  EXPECT_TRUE(test::has(b, R"("min": -128, "max": 127, "mean": -0.25,)")) << b;
  EXPECT_EQ(field(b, "zeros"), 2);

  auto table = cli({"stats", (tmp / "ints.safetensors").string()});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_TRUE(test::has(table.out, " -9223372036854775808 9223372036854775807 ")) << table.out;
  EXPECT_TRUE(test::has(table.out, " 9007199254740993 18446744073709551615 ")) << table.out;
}
