// Slicing: results equal NumPy slicing of the same tensors (expected values written by
// tests/python/interop.py), over every dtype, with both backends; only selected bytes are read.
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>

#include "support.hpp"

using safetensors::Backend;
using safetensors::Dtype;
using safetensors::ErrorKind;
using safetensors::Index;
using safetensors::SafeOpen;
using safetensors::TensorView;

namespace {

using test::kind_of;

/// "i:3,r:1::2" -> {3, Index::range(1, {}, 2)}
std::vector<Index> parse_spec(const std::string& spec) {
  std::vector<Index> out;
  std::istringstream parts(spec);
  for (std::string part; std::getline(parts, part, ',');) {
    std::vector<std::string> f;
    std::istringstream fields(part);
    for (std::string x; std::getline(fields, x, ':');) f.push_back(x);
    while (f.size() < 4) f.emplace_back();
    auto opt = [](const std::string& v) {
      return v.empty() ? std::nullopt : std::optional<std::int64_t>(std::stoll(v));
    };
    if (f[0] == "i") {
      out.emplace_back(std::stoll(f[1]));
    } else {
      out.push_back(Index::range(opt(f[1]), opt(f[2]), f[3].empty() ? 1 : std::stoll(f[3])));
    }
  }
  return out;
}

std::vector<std::size_t> parse_shape(const std::string& s) {
  std::vector<std::size_t> out;
  if (s == "-") return out;
  std::istringstream dims(s);
  for (std::string d; std::getline(dims, d, ',');) out.push_back(std::stoul(d));
  return out;
}

TEST(Slice, MatchesNumpySlicingForEveryDtypeWithBothBackends) {
  auto dir = test::fixture("slices", "slices.tsv");
  if (!dir) return;
  std::ifstream in(*dir / "slices.tsv");
  int checked = 0, refused = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream cols(line);
    std::string tag, name_hex, spec, shape, digest;
    std::getline(cols, tag, '\t');
    std::getline(cols, name_hex, '\t');
    std::getline(cols, spec, '\t');
    std::getline(cols, shape, '\t');
    std::getline(cols, digest, '\t');
    auto name = test::unhex(name_hex);
    auto indices = parse_spec(spec);
    for (auto backend : {Backend::Mmap, Backend::Read}) {
      SafeOpen f(*dir / "slices.safetensors", {backend});
      auto slice = f.get_slice(name);
      EXPECT_EQ(slice.dtype(), f.info(name).dtype);
      if (shape.rfind("ERR:", 0) == 0) {
        EXPECT_EQ(safetensors::to_string(kind_of([&] { (void)slice.select(indices); })), shape.substr(4))
            << name << " " << spec;
        ++refused;
        continue;
      }
      auto before = f.bytes_read();
      auto sel = slice.select(indices);
      EXPECT_EQ(f.bytes_read(), before) << "planning reads nothing";
      EXPECT_EQ(sel.shape(), parse_shape(shape)) << name << " " << spec;
      auto view = sel.read();
      EXPECT_EQ(view.data.size(), sel.byte_size());
      EXPECT_EQ(test::sha256_hex(view.data), digest) << name << " " << spec;
      if (backend == Backend::Read) {
        EXPECT_EQ(f.bytes_read() - before, sel.byte_size())
            << "only the selected bytes are read: " << name << " " << spec;
      }
      std::vector<std::byte> buffer(sel.byte_size());
      sel.read_into(buffer);
      EXPECT_EQ(test::sha256_hex(buffer), digest) << name << " " << spec;
      // Runs: inside the tensor, in order, never touching, and adding up to the slice.
      auto info = f.info(name);
      std::size_t total = 0, last_end = 0;
      bool first = true;
      for (auto r : sel.runs()) {
        EXPECT_GE(r.offset, info.data_offsets.first);
        EXPECT_LE(r.offset + r.length, info.data_offsets.second);
        if (!first) {
          EXPECT_GT(r.offset, last_end) << "runs must be merged";
        }
        first = false;
        last_end = r.offset + r.length;
        total += r.length;
      }
      EXPECT_EQ(total, sel.byte_size());
      ++checked;
    }
  }
  EXPECT_GT(checked, 500);
  EXPECT_GE(refused, 12);
}

class SliceRules : public ::testing::Test {
 protected:
  void SetUp() override {
    values_.resize(24);
    for (std::size_t i = 0; i < values_.size(); ++i) values_[i] = static_cast<float>(i);
    safetensors::save_file(path_,
                           {{"m", TensorView{Dtype::F32, {4, 6}, std::as_bytes(std::span(values_)), {}}}});
  }
  std::vector<float> read(const std::vector<Index>& idx, Backend b = Backend::Mmap) {
    auto view = SafeOpen(path_, {b}).get_slice("m").select(idx).read();
    auto f = view.as<float>();
    return {f.begin(), f.end()};
  }
  test::TempDir dir_;
  std::filesystem::path path_ = dir_ / "m.safetensors";
  std::vector<float> values_;
};

TEST_F(SliceRules, ColumnsForTensorParallelism) {
  EXPECT_EQ(read({Index::all(), Index::range(2, 4)}), (std::vector<float>{2, 3, 8, 9, 14, 15, 20, 21}));
  EXPECT_EQ(read({Index::all(), Index::range(2, 4)}, Backend::Read),
            (std::vector<float>{2, 3, 8, 9, 14, 15, 20, 21}));
}

TEST_F(SliceRules, NegativePositionsCountFromTheEnd) {
  EXPECT_EQ(read({-1, Index::range(-2, {})}), (std::vector<float>{22, 23}));
}

TEST_F(SliceRules, StartAfterStopIsEmptyAsInNumpy) {
  auto sel = SafeOpen(path_).get_slice("m").select({Index::range(3, 1)});
  EXPECT_EQ(sel.shape(), (std::vector<std::size_t>{0, 6}));
  EXPECT_EQ(sel.byte_size(), 0u);
  EXPECT_TRUE(sel.runs().empty());
  EXPECT_TRUE(sel.read().data.empty());
}

TEST_F(SliceRules, OutOfRangeIsAnErrorNotClamped) {
  auto s = SafeOpen(path_).get_slice("m");
  EXPECT_EQ(kind_of([&] { (void)s.select({4}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)s.select({-5}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)s.select({Index::range(0, 5)}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] {
              (void)s.select({Index::all(), Index::all(), Index::all()});
            }),
            ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)s.select({Index::range({}, {}, 0)}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)SafeOpen(path_).get_slice("nope"); }), ErrorKind::TensorNotFound);
}

TEST_F(SliceRules, AContiguousSelectionOfAMappedFileIsNotCopied) {
  SafeOpen f(path_);
  auto whole = f.get_tensor("m");
  auto rows = f.get_slice("m").select({Index::range(1, 3)}).read();
  EXPECT_EQ(rows.data.data(), whole.data.data() + 6 * sizeof(float));
  EXPECT_EQ(rows.as<float>()[0], 6.0f);
  auto runs = f.get_slice("m").select({Index::range(1, 3)}).runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], (safetensors::ByteRun{24, 48}));
}

TEST_F(SliceRules, ReadIntoRefusesABufferOfTheWrongSize) {
  auto sel = SafeOpen(path_).get_slice("m").select({0});
  std::vector<std::byte> small(sel.byte_size() - 1);
  EXPECT_EQ(kind_of([&] { sel.read_into(small); }), ErrorKind::InvalidSlice);
}

TEST_F(SliceRules, SelectionsOutliveTheirFile) {
  std::optional<safetensors::Selection> sel;
  {
    SafeOpen f(path_, {Backend::Read});
    sel = f.get_slice("m").select({Index::all(), 5});
  }
  auto view = sel->read();
  auto v = view.as<float>();
  EXPECT_EQ(std::vector<float>(v.begin(), v.end()), (std::vector<float>{5, 11, 17, 23}));
}

TEST_F(SliceRules, IntegersBeyondInt64AreInvalidSliceNeverWrapped) {
  SafeOpen f(path_);
  auto s = f.get_slice("m");
  // SIZE_MAX cast to int64 is -1, which would select the last row.
  EXPECT_EQ(kind_of([&] { (void)s.select({SIZE_MAX}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)s.select({std::uint64_t{1} << 63}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)s.select({Index::all(), std::size_t(-2)}); }), ErrorKind::InvalidSlice);
  // As range bounds and steps: 0:SIZE_MAX would be 0:-1, all rows but the last.
  EXPECT_EQ(kind_of([&] { (void)s.select({Index::range(0, SIZE_MAX)}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)s.select({Index::range(SIZE_MAX, {})}); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)s.select({Index::range({}, {}, SIZE_MAX)}); }), ErrorKind::InvalidSlice);
  try {
    (void)s.select({SIZE_MAX});
  } catch (const safetensors::Error& e) {
    EXPECT_NE(std::string(e.what()).find("`m`"), std::string::npos) << e.what();
  }
  // Unsigned values that fit, and optional bounds of any integer type, still work.
  EXPECT_EQ(read({std::size_t{3}, std::uint8_t{5}}), (std::vector<float>{23}));
  EXPECT_EQ(read({Index::range(std::size_t{1}, std::optional<unsigned>(2))}),
            (std::vector<float>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(read({Index::range(std::nullopt, 1), Index::range(4, {}, std::size_t{1})}),
            (std::vector<float>{4, 5}));
}

TEST_F(SliceRules, MovedFromSlicesAndSelectionsThrowInsteadOfCrashing) {
  auto s = SafeOpen(path_).get_slice("m");
  auto moved = std::move(s);
  EXPECT_EQ(kind_of([&] { (void)s.select({0}); }), ErrorKind::Internal);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(kind_of([&] { (void)s.select({}); }), ErrorKind::Internal);   // the whole tensor too
  EXPECT_EQ(s.name(), "");
  EXPECT_EQ(moved.name(), "m");
  auto sel = moved.select({0});
  auto other = std::move(sel);
  EXPECT_EQ(kind_of([&] { (void)sel.byte_size(); }), ErrorKind::Internal);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(kind_of([&] { (void)sel.runs(); }), ErrorKind::Internal);
  EXPECT_EQ(kind_of([&] { (void)sel.read(); }), ErrorKind::Internal);
  std::vector<std::byte> buf(24);
  EXPECT_EQ(kind_of([&] { sel.read_into(buf); }), ErrorKind::Internal);
  try {
    (void)sel.read();
  } catch (const safetensors::Error& e) {
    EXPECT_NE(std::string(e.what()).find("moved from"), std::string::npos) << e.what();
  }
  EXPECT_EQ(other.byte_size(), 24u);
}

}  // namespace
