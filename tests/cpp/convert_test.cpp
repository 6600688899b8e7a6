// safetensors::convert, Slice/Selection::read_as and the dequantizers, through the public header
// only: against the ml_dtypes oracle (tests/python/convert_oracle.py, the `convert` fixture),
// on unaligned data from a file with an unpadded header, and every refusal's error kind.
#include <safetensors/safetensors.hpp>

#include <cmath>
#include <cstring>
#include <sstream>

#include "support.hpp"

namespace st = safetensors;
using st::Dtype;
using st::ErrorKind;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string col; std::getline(in, col, sep);) out.push_back(col);
  return out;
}

std::vector<std::size_t> dims(const std::string& s) {
  std::vector<std::size_t> out;
  for (const auto& d : split(s, ',')) out.push_back(std::stoul(d));
  return out;
}

std::vector<std::byte> load(const test::fs::path& p) {
  auto raw = test::read_bytes(p);
  std::vector<std::byte> out(raw.size());
  if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

Dtype dtype(const std::string& s) {
  return st::dtype_from_string(s).value();
}

/// Number of elements whose values differ; any NaN equals any NaN.
std::size_t mismatches(const std::string& name, Dtype to, std::size_t numel, std::span<const std::byte> got,
                       std::span<const std::byte> want) {
  if (got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size()) == 0) return 0;
  auto g = st::as_f64(st::TensorView{to, {numel}, got, {}});
  auto w = st::as_f64(st::TensorView{to, {numel}, want, {}});
  std::size_t bad = 0;
  for (std::size_t i = 0; i < numel; ++i) {
    bool same = (std::isnan(g[i]) && std::isnan(w[i])) || std::memcmp(&g[i], &w[i], sizeof(double)) == 0;
    if (!same && ++bad <= 3)
      ADD_FAILURE() << name << ": element " << i << " got " << g[i] << " want " << w[i];
  }
  return bad;
}

/// A copy of `bytes` starting one byte past a 64-byte boundary.
struct Unaligned {
  explicit Unaligned(std::span<const std::byte> bytes) : storage(bytes.size() + 64) {
    std::memcpy(storage.data() + 1, bytes.data(), bytes.size());
    view = {storage.data() + 1, bytes.size()};
  }
  std::vector<std::byte> storage;
  std::span<const std::byte> view;
};

}  // namespace

TEST(ConvertOracle, EveryCaseEqualsMlDtypesBitForBit) {
  auto dir = test::fixture("convert", "manifest.tsv");
  if (!dir) return;
  std::ifstream in(*dir / "manifest.tsv");
  std::size_t cases = 0, elements = 0;
  for (std::string line; std::getline(in, line);) {
    auto c = split(line, '\t');
    if (c.at(0) != "case") continue;
    Dtype from = dtype(c.at(1)), to = dtype(c.at(2));
    std::size_t numel = std::stoul(c.at(3));
    auto input = load(*dir / c.at(4));
    auto want = load(*dir / c.at(5));
    Unaligned src(input);
    std::vector<std::byte> out(want.size() + 1);
    std::span<std::byte> dst(out.data() + 1, want.size());
    st::convert(st::TensorView{from, {numel}, src.view, {}}, to, dst);
    EXPECT_EQ(mismatches(c.at(6), to, numel, dst, want), 0u) << c.at(6);
    ++cases;
    elements += numel;
  }
  EXPECT_GT(cases, 250u);
  EXPECT_GT(elements, 20'000'000u);
}

TEST(ConvertOracle, DequantizationEqualsTheNumpyReferences) {
  auto dir = test::fixture("convert", "manifest.tsv");
  if (!dir) return;
  std::ifstream in(*dir / "manifest.tsv");
  int fp8 = 0, mx = 0;
  for (std::string line; std::getline(in, line);) {
    auto c = split(line, '\t');
    if (c.at(0) == "fp8") {
      auto w = load(*dir / c.at(3));
      auto s = load(*dir / c.at(4));
      Unaligned wu(w), su(s);
      st::TensorView weight{Dtype::F8_E4M3, dims(c.at(1)), wu.view, {}};
      st::TensorView scale{Dtype::F32, dims(c.at(2)), su.view, {}};
      auto y = st::dequantize_fp8_blocks(weight, scale);
      EXPECT_EQ(y.shape, weight.shape);
      EXPECT_EQ(mismatches(c.at(7), Dtype::F32, y.numel(), y.data, load(*dir / c.at(5))), 0u);
      auto yb = st::dequantize_fp8_blocks(weight, scale, Dtype::BF16);
      EXPECT_EQ(mismatches(c.at(7), Dtype::BF16, yb.numel(), yb.data, load(*dir / c.at(6))), 0u);
      ++fp8;
    } else if (c.at(0) == "mxfp4") {
      auto b = load(*dir / c.at(3));
      auto s = load(*dir / c.at(4));
      st::TensorView blocks{Dtype::U8, dims(c.at(1)), b, {}};
      st::TensorView scales{Dtype::U8, dims(c.at(2)), s, {}};
      auto y = st::dequantize_mxfp4(blocks, scales);
      auto want_shape = scales.shape;
      want_shape.back() *= 32;
      EXPECT_EQ(y.shape, want_shape);
      EXPECT_EQ(mismatches(c.at(6), Dtype::F32, y.numel(), y.data, load(*dir / c.at(5))), 0u);
      ++mx;
    }
  }
  EXPECT_EQ(fp8, 2);
  EXPECT_EQ(mx, 2);
}

TEST(Convert, WorksOnUnalignedTensorsFromAFileWithAnUnpaddedHeader) {
  test::TempDir tmp;
  // An odd-length header (no padding) puts the data at an odd offset: misaligned for every type.
  std::string json = R"({"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})";
  if (json.size() % 2 == 0) json += ' ';
  std::vector<std::uint8_t> file(8 + json.size());
  std::uint64_t n = json.size();
  std::memcpy(file.data(), &n, 8);
  std::memcpy(file.data() + 8, json.data(), json.size());
  const std::uint16_t bf16[6] = {0x3F80, 0xC000, 0x0000, 0x8000, 0x7F80, 0x3E20};  // 1 -2 0 -0 inf 0.15625
  for (auto h : bf16) {
    file.push_back(static_cast<std::uint8_t>(h & 0xFF));
    file.push_back(static_cast<std::uint8_t>(h >> 8));
  }
  test::write_bytes(tmp / "u.safetensors", file);
  for (auto backend : {st::Backend::Mmap, st::Backend::Read}) {
    st::SafeOpen f(tmp / "u.safetensors", st::OpenOptions{.backend = backend});
    auto t = f.get_tensor("b");
    if (backend == st::Backend::Mmap) {
      ASSERT_NE(reinterpret_cast<std::uintptr_t>(t.data.data()) % 2, 0u);
      EXPECT_EQ(test::kind_of([&] { (void)t.as<std::uint16_t>(); }), ErrorKind::TypeMismatch);
    }
    auto v = st::as_f32(t);
    EXPECT_EQ(v, (std::vector<float>{1.0f, -2.0f, 0.0f, -0.0f, INFINITY, 0.15625f}));
    EXPECT_TRUE(std::signbit(v[3]));
    auto owned = st::convert(t, Dtype::F64);
    EXPECT_EQ(owned.shape, (std::vector<std::size_t>{2, 3}));
    EXPECT_EQ(owned.as<double>()[1], -2.0);
    // Fused slice + convert: row 1, and the whole tensor.
    std::vector<float> row(3);
    f.get_slice("b").select({1}).read_as(Dtype::F32, std::as_writable_bytes(std::span(row)));
    EXPECT_EQ(row, (std::vector<float>{-0.0f, INFINITY, 0.15625f}));
    std::vector<std::uint16_t> half(6);
    f.get_slice("b").read_as(Dtype::F16, std::as_writable_bytes(std::span(half)));
    EXPECT_EQ(half, (std::vector<std::uint16_t>{0x3C00, 0xC000, 0x0000, 0x8000, 0x7C00, 0x3100}));
  }
}

TEST(Convert, ColumnSliceReadAsEqualsConvertingTheSlice) {
  test::TempDir tmp;
  std::vector<std::uint8_t> codes(16 * 8);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 37);
  st::TensorView t{Dtype::F8_E5M2, {16, 8}, std::as_bytes(std::span(codes)), {}};
  st::save_file(tmp / "f.safetensors", std::map<std::string, st::TensorView>{{"w", t}});
  st::SafeOpen f(tmp / "f.safetensors");
  auto sel = f.get_slice("w").select({st::Index::all(), st::Index::range(2, 5)});
  auto direct = sel.read_as(Dtype::F32);
  auto viaCopy = st::as_f32(sel.read());
  ASSERT_EQ(direct.numel(), 48u);
  auto got = direct.as<float>();
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i] == viaCopy[i] || (std::isnan(got[i]) && std::isnan(viaCopy[i]))) << i;
  }
  // Row 3, column 2 is code (3*8+2)*37 mod 256 = 194: E5M2 0b1'10000'10 = -3.
  EXPECT_EQ(got[3 * 3 + 0], -3.0f);
}

TEST(Convert, NonsensicalConversionsAreTypeMismatches) {
  std::vector<std::byte> src(16), dst(16);
  auto attempt = [&](Dtype from, Dtype to) {
    return test::kind_of([&] {
      st::convert(st::TensorView{from, {1}, {src.data(), bit_size(from) / 8}, {}}, to,
                  {dst.data(), bit_size(to) / 8});
    });
  };
  EXPECT_EQ(attempt(Dtype::C64, Dtype::F16), ErrorKind::TypeMismatch);
  EXPECT_EQ(attempt(Dtype::C64, Dtype::F32), ErrorKind::TypeMismatch);
  EXPECT_EQ(attempt(Dtype::F32, Dtype::BOOL), ErrorKind::TypeMismatch);
  EXPECT_EQ(attempt(Dtype::BOOL, Dtype::BOOL), ErrorKind::TypeMismatch);
  EXPECT_EQ(attempt(Dtype::F16, Dtype::I32), ErrorKind::TypeMismatch);
  EXPECT_EQ(attempt(Dtype::F32, static_cast<Dtype>(99)), ErrorKind::TypeMismatch);
  EXPECT_EQ(test::kind_of([&] {
              (void)st::convert(st::TensorView{Dtype::C64, {1}, {src.data(), 8}, {}}, Dtype::F32);
            }),
            ErrorKind::TypeMismatch);
  try {
    (void)st::convert(st::TensorView{Dtype::F32, {1}, {src.data(), 4}, {}}, Dtype::U8);
    ADD_FAILURE() << "no error";
  } catch (const st::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot convert F32 to U8"), std::string::npos) << e.what();
  }
}

TEST(Convert, BuffersOfTheWrongSizeAreTypedErrors) {
  std::vector<std::byte> src(8), dst(16);
  st::TensorView t{Dtype::F32, {2}, src, {}};
  EXPECT_EQ(test::kind_of([&] {
              st::convert(t, Dtype::F64, {dst.data(), 15});
            }),
            ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(test::kind_of([&] {
              st::convert(t, Dtype::F16, {dst.data(), 2});
            }),
            ErrorKind::TensorInvalidInfo);
  st::TensorView short_src{Dtype::F32, {3}, src, {}};
  EXPECT_EQ(test::kind_of([&] {
              st::convert(short_src, Dtype::F16, {dst.data(), 6});
            }),
            ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(test::kind_of([&] {
              (void)st::convert(st::TensorView{Dtype::F32, {3}, {src.data(), 12}, {}}, Dtype::F4);
            }),
            ErrorKind::MisalignedSlice);
  st::TensorView huge{Dtype::F32, {std::size_t{1} << 40, std::size_t{1} << 40}, src, {}};
  EXPECT_EQ(test::kind_of([&] { (void)st::convert(huge, Dtype::F64); }), ErrorKind::ValidationOverflow);
}

/// The error `f` throws, checked to be `TensorInvalidInfo` naming `what` and its 4 bytes.
template <class F>
void expect_refused_view(const std::string& what, F&& f) {
  auto st = test::thrown(std::forward<F>(f));
  EXPECT_EQ(st.kind(), ErrorKind::TensorInvalidInfo) << what << ": " << st.message();
  EXPECT_NE(st.message().find("`" + what + "`"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("but 4 bytes are given"), std::string::npos) << st.message();
}

TEST(Convert, AViewWhoseBytesDisagreeWithItsShapeIsNamedBeforeAnythingIsSized) {
  // 4 bytes claiming a huge shape: every call that sizes its output from the shape checks the
  // view first, so the error is the disagreement, never an allocation of the shape's size (an
  // `Io` "cannot allocate", or an abort under ASan) nor an overflow of the output's size.
  std::vector<std::byte> four(4);
  const std::size_t big = std::size_t{1} << 40;
  for (std::size_t n : {big, std::size_t{1} << 60}) {  // 2^60 F8 elements: 2^62 F32 bytes
    st::TensorView liar{Dtype::F8_E4M3, {n}, four};
    expect_refused_view("the source tensor", [&] { (void)st::convert(liar, Dtype::F32); });
    expect_refused_view("the source tensor", [&] { (void)st::as_f32(liar); });
  }
  // fp8 blocks: a [2^30, 2^30] weight makes 2^62 F32 bytes; a [2^20, 2^20] one 4 TiB.
  st::TensorView small_weight{Dtype::F8_E4M3, {1, 4}, four};
  for (std::size_t side : {std::size_t{1} << 20, std::size_t{1} << 30}) {
    st::TensorView weight{Dtype::F8_E4M3, {side, side}, four};
    st::TensorView scale{Dtype::F32, {side / 128, side / 128}, four};
    expect_refused_view("the weight", [&] { (void)st::dequantize_fp8_blocks(weight, scale); });
    // A valid weight with a lying scale: the scale is checked before anything too.
    expect_refused_view("the scale", [&] { (void)st::dequantize_fp8_blocks(small_weight, scale); });
  }
  // MXFP4: [2^56, 16] blocks and [2^56] scales make [2^61] values, whose F32 bytes overflow.
  for (std::size_t groups : {big, std::size_t{1} << 56}) {
    st::TensorView blocks{Dtype::U8, {groups, 16}, four};
    st::TensorView scales{Dtype::U8, {groups}, four};
    expect_refused_view("the MXFP4 blocks", [&] { (void)st::dequantize_mxfp4(blocks, scales); });
  }
  // The nothrow face reports the same error.
  st::TensorView liar{Dtype::F32, {big}, four};
  test::expect_same(st::nothrow::convert(liar, Dtype::F16).status(),
                    test::thrown([&] { (void)st::convert(liar, Dtype::F16); }));
}

TEST(Convert, AnOutputOverlappingTheSourceIsRefusedBeforeAnyByteIsWritten) {
  // F16 -> F32 in place (the output twice the input, starting at the same byte) used to return
  // success with most elements wrong; the core would also have been handed aliasing slices.
  std::vector<std::uint16_t> halves{0x3C00, 0x4000, 0x4200, 0x4400};  // 1, 2, 3, 4
  std::vector<std::byte> buf(64);
  std::memcpy(buf.data(), halves.data(), 8);
  const std::vector<std::byte> before = buf;
  st::TensorView h{Dtype::F16, {4}, std::span<const std::byte>(buf).first(8)};
  auto whole = std::span<std::byte>(buf);
  for (auto dst : {whole.first(16), whole.subspan(4, 16), whole.subspan(7, 16)}) {
    auto st_ = st::nothrow::convert(h, Dtype::F32, dst);
    EXPECT_EQ(st_.kind(), ErrorKind::InvalidSlice) << st_.message();
    EXPECT_NE(st_.message().find("overlaps the bytes it reads"), std::string::npos) << st_.message();
    EXPECT_EQ(test::kind_of([&] { st::convert(h, Dtype::F32, dst); }), ErrorKind::InvalidSlice);
  }
  // Same size (F16 -> BF16) in place is refused too.
  EXPECT_EQ(test::kind_of([&] { st::convert(h, Dtype::BF16, whole.first(8)); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(buf, before) << "nothing was written";
  // Right after the source (touching, not overlapping) is a separate buffer.
  st::convert(h, Dtype::F32, whole.subspan(8, 16));
  std::vector<float> got(4);
  std::memcpy(got.data(), buf.data() + 8, 16);
  EXPECT_EQ(got, (std::vector<float>{1, 2, 3, 4}));
}

TEST(Convert, DequantizersRefuseMismatchedScales) {
  std::vector<std::byte> w(200 * 3), s(8);
  st::TensorView weight{Dtype::F8_E4M3, {200, 3}, w, {}};
  st::TensorView wrong_scale{Dtype::F32, {1, 2}, s, {}};
  EXPECT_EQ(test::kind_of([&] { (void)st::dequantize_fp8_blocks(weight, wrong_scale); }),
            ErrorKind::TypeMismatch);
  std::vector<std::byte> b(2 * 3 * 16), sc(6);
  st::TensorView blocks{Dtype::U8, {2, 3, 16}, b, {}};
  st::TensorView bad_scales{Dtype::U8, {3, 2}, sc, {}};
  EXPECT_EQ(test::kind_of([&] { (void)st::dequantize_mxfp4(blocks, bad_scales); }), ErrorKind::TypeMismatch);
  st::TensorView scales{Dtype::U8, {2, 3}, sc, {}};
  EXPECT_EQ(test::kind_of([&] { (void)st::dequantize_mxfp4(blocks, scales, Dtype::I8); }),
            ErrorKind::TypeMismatch);
  auto y = st::dequantize_mxfp4(blocks, scales);  // all zero codes, scale 2^-127
  EXPECT_EQ(y.shape, (std::vector<std::size_t>{2, 96}));
  for (float v : y.as<float>()) EXPECT_EQ(v, 0.0f);
}

// ---- one input, one error, whoever owns the output ------------------------------------------

namespace {

/// A caller's tensor of the table: dtype, shape, and how many bytes it really holds (zeros).
struct Given {
  Dtype dtype;
  std::vector<std::size_t> shape;
  std::size_t bytes;
};

constexpr std::size_t kHuge = std::size_t{1} << 40;
/// Destinations of every length: none fits a bad input.
constexpr std::size_t kLengths[] = {0, 1, 7, 12, 64};

/// A bad conversion, and the kind it must give.
struct BadConversion {
  const char* what;
  Given src;
  Dtype to;
  ErrorKind kind;
};

const std::vector<BadConversion>& bad_conversions() {
  using enum Dtype;
  static const std::vector<BadConversion> table{
      {"3 values into F4", {F32, {3}, 12}, F4, ErrorKind::MisalignedSlice},
      {"3 values into F6_E2M3", {F32, {3}, 12}, F6_E2M3, ErrorKind::MisalignedSlice},
      {"2 values into F6_E3M2", {F32, {2}, 8}, F6_E3M2, ErrorKind::MisalignedSlice},
      {"3 F4 values", {F4, {3}, 2}, F32, ErrorKind::MisalignedSlice},
      {"elements overflow", {F32, {kHuge, kHuge}, 8}, F64, ErrorKind::ValidationOverflow},
      {"bits overflow", {F64, {SIZE_MAX / 4}, 8}, F32, ErrorKind::ValidationOverflow},
      {"short source", {F32, {3}, 8}, F16, ErrorKind::TensorInvalidInfo},
      {"lying source", {F8_E4M3, {kHuge}, 4}, F32, ErrorKind::TensorInvalidInfo},
      {"complex source, lying", {C64, {kHuge}, 4}, F32, ErrorKind::TypeMismatch},
      {"integer target", {F32, {1}, 4}, I32, ErrorKind::TypeMismatch},
      {"no such dtype", {F32, {1}, 4}, static_cast<Dtype>(99), ErrorKind::TypeMismatch},
  };
  return table;
}

/// A message the table allows: not empty, and quoting no wrapped size.
void expect_sane(const std::string& what, const st::Status& st) {
  EXPECT_FALSE(st.message().empty()) << what;
  EXPECT_EQ(st.message().find("18446744073709551615"), std::string::npos) << what << ": " << st.message();
}

}  // namespace

TEST(ConvertKinds, EveryBadInputIsTheSameErrorAllocatingAndIntoACallersBuffer) {
  std::vector<std::byte> zeros(64);
  for (const auto& c : bad_conversions()) {
    st::TensorView src{c.src.dtype, c.src.shape, {zeros.data(), c.src.bytes}, {}};
    auto allocated = st::nothrow::convert(src, c.to);
    ASSERT_FALSE(allocated) << c.what;
    EXPECT_EQ(allocated.status().kind(), c.kind) << c.what << ": " << allocated.status().message();
    expect_sane(c.what, allocated.status());
    for (std::size_t len : kLengths) {
      std::vector<std::byte> dst(64, std::byte{0xAB});
      auto into = st::nothrow::convert(src, c.to, {dst.data(), len});
      EXPECT_EQ(into.kind(), c.kind) << c.what << ", into " << len << " bytes: " << into.message();
      EXPECT_EQ(into.message(), allocated.status().message()) << c.what;
      EXPECT_EQ(dst, std::vector<std::byte>(64, std::byte{0xAB})) << c.what << ": nothing written";
    }
    // The throwing faces and the vector conversions say the same.
    test::expect_same(allocated.status(), test::thrown([&] { (void)st::convert(src, c.to); }));
    if (c.to == Dtype::F32) {
      EXPECT_EQ(st::nothrow::as_f32(src).status().kind(), c.kind) << c.what;
    }
    if (c.to == Dtype::F64) {
      EXPECT_EQ(st::nothrow::as_f64(src).status().kind(), c.kind) << c.what;
    }
  }
}

/// The dequantizers allocate their output: for each bad input they give the kind the C API's
/// calls into a buffer give (tests/c/convert_kinds_test.c has the same rows).
TEST(ConvertKinds, DequantizersGiveTheKindsOfTheCallsIntoABuffer) {
  using enum Dtype;
  std::vector<std::byte> z(64);
  auto view = [&](Dtype d, std::vector<std::size_t> shape, std::size_t bytes) {
    return st::TensorView{d, std::move(shape), {z.data(), bytes}, {}};
  };
  auto fp8 = [&](const st::TensorView& w, const st::TensorView& s, Dtype to) {
    auto r = st::nothrow::dequantize_fp8_blocks(w, s, to);
    expect_sane("fp8", r.status());
    return r.status().kind();
  };
  auto mx = [&](const st::TensorView& b, const st::TensorView& s, Dtype to) {
    auto r = st::nothrow::dequantize_mxfp4(b, s, to);
    expect_sane("mxfp4", r.status());
    return r.status().kind();
  };
  const auto weight = view(F8_E4M3, {1, 4}, 4);
  const auto scale = view(F32, {1, 1}, 4);
  // A target under 8 bits is refused as such, whether or not its count fills whole bytes.
  EXPECT_EQ(fp8(view(F8_E4M3, {1, 3}, 3), scale, F4), ErrorKind::TypeMismatch);
  EXPECT_EQ(fp8(weight, scale, F4), ErrorKind::TypeMismatch);
  EXPECT_EQ(fp8(weight, scale, F6_E3M2), ErrorKind::TypeMismatch);
  EXPECT_EQ(fp8(view(F8_E4M3, {1 << 20, 1 << 20}, 4), view(F32, {8192, 8192}, 4), F32),
            ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(fp8(weight, view(F32, {8192, 8192}, 4), F32), ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(fp8(weight, view(F4, {1, 1}, 1), F32), ErrorKind::MisalignedSlice);
  EXPECT_EQ(fp8(weight, view(F32, {2, 2}, 16), F32), ErrorKind::TypeMismatch);
  const auto blocks = view(U8, {1, 16}, 16);
  EXPECT_EQ(mx(blocks, view(U8, {1}, 1), F4), ErrorKind::TypeMismatch);
  EXPECT_EQ(mx(view(F32, {kHuge, 16}, 4), view(U8, {1}, 1), F32), ErrorKind::TypeMismatch);
  EXPECT_EQ(mx(view(U8, {kHuge, 16}, 4), view(U8, {kHuge}, 4), F32), ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(mx(blocks, view(U8, {kHuge}, 4), F32), ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(mx(view(U8, {1, 15}, 15), view(U8, {1}, 1), F32), ErrorKind::TypeMismatch);
}

/// A file's tensor converted by `get_tensor_as` and a selection's `read_as`: the same kinds
/// whether the output is allocated or the caller's.
TEST(ConvertKinds, FileReadsConvertedGiveOneKindForBothFaces) {
  test::TempDir tmp;
  std::vector<float> three{1, 2, 3};
  st::save_file(tmp / "f.safetensors",
                std::map<std::string, st::TensorView>{
                    {"x", st::TensorView{Dtype::F32, {3}, std::as_bytes(std::span(three)), {}}}});
  st::SafeOpen f(tmp / "f.safetensors");
  st::Checkpoint ckpt(tmp / "f.safetensors");
  std::vector<std::byte> dst(64);
  auto into = std::span(dst).first(2);
  for (Dtype to : {Dtype::F4, Dtype::F6_E2M3}) {
    auto allocated = st::nothrow::get_tensor_as(f, "x", to);
    ASSERT_FALSE(allocated);
    EXPECT_EQ(allocated.status().kind(), ErrorKind::MisalignedSlice) << allocated.status().message();
    EXPECT_EQ(st::nothrow::get_tensor_as(f, "x", to, into).kind(), ErrorKind::MisalignedSlice);
    EXPECT_EQ(st::nothrow::get_tensor_as(ckpt, "x", to).status().kind(), ErrorKind::MisalignedSlice);
    EXPECT_EQ(st::nothrow::get_tensor_as(ckpt, "x", to, into).kind(), ErrorKind::MisalignedSlice);
    auto sel = f.get_slice("x").select({st::Index::range(0, 3)});
    EXPECT_EQ(st::nothrow::read_as(sel, to).status().kind(), ErrorKind::MisalignedSlice);
    auto st_ = st::nothrow::read_as(sel, to, into);
    EXPECT_EQ(st_.kind(), ErrorKind::MisalignedSlice) << st_.message();
    expect_sane("read_as", st_);
  }
}
