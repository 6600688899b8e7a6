// The non-throwing API (`safetensors::nothrow`): each call gives, as a value, exactly the error
// (kind and message) its throwing twin throws, and the value its twin returns; `Expected` and
// `Status` behave as documented. (tests/consumers/no_exceptions runs the hostile corpus through
// it in a program built with -fno-exceptions -fno-rtti.)
#include <safetensors/safetensors.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support.hpp"

namespace nt = safetensors::nothrow;
using safetensors::Dtype;
using safetensors::Error;
using safetensors::ErrorKind;
using safetensors::Expected;
using safetensors::Index;
using safetensors::Status;

namespace {

using test::expect_same;
using test::thrown;

class Nothrow : public ::testing::Test {
 protected:
  void SetUp() override {
    std::map<std::string, safetensors::TensorView> tensors{
        {"w", {Dtype::F32, {2, 2}, std::as_bytes(std::span(values_))}},
        {"flags", {Dtype::BOOL, {3}, std::as_bytes(std::span(flags_))}}};
    safetensors::save_file(file_, tensors, {{"format", "pt"}});
  }

  test::TempDir dir_;
  std::filesystem::path file_ = dir_ / "a.safetensors";
  float values_[4] = {1, 2, 3, 4};
  std::uint8_t flags_[3] = {0, 1, 7};
};

TEST_F(Nothrow, OpeningGivesTheFileOrTheSameErrorAsTheConstructor) {
  auto ok = nt::open(file_);
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok.status().ok());
  EXPECT_EQ(nt::keys(*ok).value(), (std::vector<std::string>{"flags", "w"}));
  EXPECT_EQ(nt::metadata(*ok).value().at("format"), "pt");

  for (const auto& path : {dir_ / "missing.safetensors", dir_.path()}) {
    auto bad = nt::open(path);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.status().kind(), ErrorKind::Io);
    expect_same(bad.status(), thrown([&] { safetensors::SafeOpen f(path); }));
  }
  test::write_bytes(dir_ / "short.safetensors", std::vector<std::uint8_t>{1, 2, 3});
  auto short_file = nt::open(dir_ / "short.safetensors", {safetensors::Backend::Read});
  EXPECT_EQ(short_file.status().kind(), ErrorKind::HeaderTooSmall);
  expect_same(short_file.status(), thrown([&] { safetensors::SafeOpen f(dir_ / "short.safetensors"); }));
}

TEST_F(Nothrow, LookupsReportWhatTheirThrowingTwinsThrow) {
  safetensors::SafeOpen f(file_);
  auto w = nt::get_tensor(f, "w");
  ASSERT_TRUE(w);
  EXPECT_EQ(nt::as<float>(*w).value()[3], 4.0f);
  EXPECT_EQ(nt::info(f, "w").value().shape, (std::vector<std::size_t>{2, 2}));

  expect_same(nt::get_tensor(f, "nope").status(), thrown([&] { (void)f.get_tensor("nope"); }));
  expect_same(nt::info(f, "nope").status(), thrown([&] { (void)f.info("nope"); }));
  expect_same(nt::get_slice(f, "nope").status(), thrown([&] { (void)f.get_slice("nope"); }));
  EXPECT_EQ(nt::get_tensor(f, "nope").status().kind(), ErrorKind::TensorNotFound);

  auto flags = f.get_tensor("flags");
  expect_same(nt::as<bool>(flags).status(), thrown([&] { (void)flags.as<bool>(); }));
  EXPECT_EQ(nt::as<bool>(flags).status().kind(), ErrorKind::TypeMismatch);
  expect_same(nt::as<double>(*w).status(), thrown([&] { (void)w->as<double>(); }));
  EXPECT_EQ(nt::as<std::uint8_t>(flags).value()[2], 7);

  std::vector<std::byte> small(3);
  expect_same(nt::read_data(f, 0, small), thrown([&] { f.read_data(0, small); }));
  std::vector<std::byte> past(8);
  expect_same(nt::read_data(f, 1000, past), thrown([&] { f.read_data(1000, past); }));
  // Past the end is the caller's mistake (InvalidSlice), not a failed read of the file.
  EXPECT_EQ(nt::read_data(f, 1000, past).kind(), ErrorKind::InvalidSlice);
}

TEST_F(Nothrow, SlicesReportWhatTheirThrowingTwinsThrow) {
  for (auto backend : {safetensors::Backend::Mmap, safetensors::Backend::Read}) {
    safetensors::SafeOpen f(file_, {backend});
    auto slice = nt::get_slice(f, "w");
    ASSERT_TRUE(slice);
    auto col = nt::select(*slice, {Index::all(), 1});
    ASSERT_TRUE(col);
    auto read = nt::read(*col);
    ASSERT_TRUE(read);
    EXPECT_EQ(nt::as<float>(*read).value()[1], 4.0f);
    std::vector<float> out(2);
    EXPECT_TRUE(nt::read_into(*col, std::as_writable_bytes(std::span(out))).ok());
    EXPECT_EQ(out[0], 2.0f);
    std::vector<float> wrong(3);
    expect_same(nt::read_into(*col, std::as_writable_bytes(std::span(wrong))),
                thrown([&] { col->read_into(std::as_writable_bytes(std::span(wrong))); }));
    std::vector<double> as64(2);
    EXPECT_TRUE(nt::read_as(*col, Dtype::F64, std::as_writable_bytes(std::span(as64))).ok());
    EXPECT_EQ(as64[1], 4.0);

    for (std::vector<Index> bad : {std::vector<Index>{5}, std::vector<Index>{0, 0, 0},
                                   std::vector<Index>{Index::range(0, 2, 0)}, std::vector<Index>{SIZE_MAX}}) {
      auto planned = nt::select(*slice, bad);
      ASSERT_FALSE(planned);
      EXPECT_EQ(planned.status().kind(), ErrorKind::InvalidSlice);
      expect_same(planned.status(), thrown([&] { (void)slice->select(bad); }));
    }
  }
}

TEST_F(Nothrow, ANulInANameReadsTheSameInBothFaces) {
  safetensors::SafeOpen f(file_);
  const std::string name("a\0b", 3);
  auto missing = nt::get_tensor(f, name);
  EXPECT_NE(missing.status().message().find("a\\0b"), std::string::npos) << missing.status().message();
  expect_same(missing.status(), thrown([&] { (void)f.get_tensor(name); }));
}

TEST_F(Nothrow, MovedFromObjectsAreInternalErrorsNotCrashes) {
  safetensors::SafeOpen f(file_);
  safetensors::SafeOpen g = std::move(f);
  EXPECT_EQ(nt::keys(f).status().kind(), ErrorKind::Internal);  // NOLINT: use after move
  expect_same(nt::get_tensor(f, "w").status(), thrown([&] { (void)f.get_tensor("w"); }));
  auto slice = g.get_slice("w");
  auto moved = std::move(slice);
  expect_same(nt::select(slice, {}).status(), thrown([&] { (void)slice.select({}); }));  // NOLINT
  auto sel = moved.select({});
  auto sel2 = std::move(sel);
  expect_same(nt::read(sel).status(), thrown([&] { (void)sel.read(); }));  // NOLINT
  safetensors::Checkpoint c(file_);
  auto c2 = std::move(c);
  expect_same(nt::keys(c).status(), thrown([&] { (void)c.keys(); }));  // NOLINT
  EXPECT_EQ(nt::keys(c).status().kind(), ErrorKind::Internal);
}

TEST_F(Nothrow, CheckpointsReportWhatTheirThrowingTwinsThrow) {
  std::ofstream(dir_ / "m.safetensors.index.json")
      << R"({"weight_map": {"w": "a.safetensors", "gone": "a.safetensors"}})";
  auto strict = nt::open_checkpoint(dir_ / "m.safetensors.index.json");
  ASSERT_TRUE(strict);
  expect_same(nt::get_tensor(*strict, "gone").status(), thrown([&] {
                (void)safetensors::Checkpoint(dir_ / "m.safetensors.index.json").get_tensor("gone");
              }));
  EXPECT_EQ(nt::get_tensor(*strict, "gone").status().kind(), ErrorKind::ShardMissing);

  auto lenient = nt::open_checkpoint(dir_ / "m.safetensors.index.json", {.lenient = true});
  ASSERT_TRUE(lenient);
  EXPECT_EQ(nt::missing(*lenient).value(), std::vector<std::string>{"gone"});
  EXPECT_TRUE(nt::get_tensor(*lenient, "w"));
  EXPECT_EQ(nt::shard_of(*lenient, "w").value(), dir_ / "a.safetensors");
  EXPECT_TRUE(nt::trailing_bytes(*lenient).value().empty());

  std::ofstream(dir_ / "bad.index.json") << R"({"weight_map": {"w": "../a.safetensors"}})";
  auto bad = nt::open_checkpoint(dir_ / "bad.index.json");
  EXPECT_EQ(bad.status().kind(), ErrorKind::InvalidShardPath);
  expect_same(bad.status(), thrown([&] { safetensors::Checkpoint c(dir_ / "bad.index.json"); }));
}

TEST_F(Nothrow, WritingReportsWhatTheThrowingWriterThrows) {
  safetensors::TensorView w{Dtype::F32, {2, 2}, std::as_bytes(std::span(values_))};
  auto bytes = nt::serialize({{"w", w}}, {{"k", "v"}});
  ASSERT_TRUE(bytes);
  EXPECT_EQ(*bytes, safetensors::serialize({{"w", w}}, {{"k", "v"}}));
  // A braced list takes a loop of its own, not the range templates: the same bytes as a range,
  // with any layout option.
  using Tensors = std::map<std::string, safetensors::TensorView>;
  EXPECT_EQ(*bytes, safetensors::serialize(Tensors{{"w", w}}, {{"k", "v"}}));
  EXPECT_EQ(safetensors::serialize({{"w", w}}, {}, {.empty_metadata = true, .alignment = 64}),
            safetensors::serialize(Tensors{{"w", w}}, {}, {.empty_metadata = true, .alignment = 64}));
  EXPECT_TRUE(nt::save_file(dir_ / "b.safetensors", {{"w", w}}).ok());
  auto written = safetensors::SafeOpen(dir_ / "b.safetensors").get_tensor("w");
  EXPECT_EQ(written.as<float>()[2], 3.0f);

  safetensors::TensorView short_view{Dtype::F32, {3, 2}, std::as_bytes(std::span(values_))};
  safetensors::TensorView bad_dtype{static_cast<Dtype>(99), {4}, std::as_bytes(std::span(values_))};
  // Not a structured binding: clang before 16 cannot capture one in a lambda.
  for (const auto& entry : std::vector<std::pair<std::string, safetensors::TensorView>>{
           {"w", short_view}, {"__metadata__", w}, {"x", bad_dtype}, {std::string("\xff"), w}}) {
    const std::string& name = entry.first;
    const safetensors::TensorView& view = entry.second;
    auto s = nt::serialize({{name, view}});
    ASSERT_FALSE(s) << name;
    expect_same(s.status(), nt::serialize(Tensors{{name, view}}).status());
    expect_same(s.status(), thrown([&] { (void)safetensors::serialize({{name, view}}); }));
    auto saved = nt::save_file(dir_ / "c.safetensors", {{name, view}});
    EXPECT_EQ(saved.kind(), s.status().kind());
    expect_same(saved, thrown([&] { safetensors::save_file(dir_ / "c.safetensors", {{name, view}}); }));
  }
  auto to_dir = nt::save_file(dir_ / "nowhere" / "d.safetensors", {{"w", w}});
  EXPECT_EQ(to_dir.kind(), ErrorKind::Io);
  expect_same(to_dir, thrown([&] {
                safetensors::save_file(dir_ / "nowhere" / "d.safetensors", {{"w", w}});
              }));
}

TEST_F(Nothrow, ConversionsReportWhatTheirThrowingTwinsThrow) {
  safetensors::SafeOpen f(file_);
  auto w = f.get_tensor("w");
  auto half = nt::convert(w, Dtype::F16);
  ASSERT_TRUE(half);
  EXPECT_EQ(nt::as_f32(*half).value(), (std::vector<float>{1, 2, 3, 4}));
  expect_same(nt::convert(w, Dtype::I32).status(),
              thrown([&] { (void)safetensors::convert(w, Dtype::I32); }));
  EXPECT_EQ(nt::convert(w, Dtype::I32).status().kind(), ErrorKind::TypeMismatch);
  safetensors::TensorView odd{Dtype::U8, {3}, std::as_bytes(std::span(flags_))};
  expect_same(nt::convert(odd, Dtype::F4).status(),
              thrown([&] { (void)safetensors::convert(odd, Dtype::F4); }));
  EXPECT_EQ(nt::convert(odd, Dtype::F4).status().kind(), ErrorKind::MisalignedSlice);
  std::vector<std::byte> wrong(5);
  expect_same(nt::convert(w, Dtype::F32, wrong), thrown([&] { safetensors::convert(w, Dtype::F32, wrong); }));
  // A view whose bytes disagree with its (huge) shape is named as such before its shape sizes
  // anything: never std::bad_alloc, never an out-of-memory Io error.
  safetensors::TensorView bogus{Dtype::F4, {std::size_t{1} << 40}, std::as_bytes(std::span(values_))};
  EXPECT_EQ(nt::as_f64(bogus).status().kind(), ErrorKind::TensorInvalidInfo);
  EXPECT_EQ(nt::as_f32(bogus).status().kind(), ErrorKind::TensorInvalidInfo);
  expect_same(nt::as_f64(bogus).status(), thrown([&] { (void)safetensors::as_f64(bogus); }));
}

TEST(NothrowTypes, ExpectedHoldsAValueOrAnErrorAndValueThrowsTheError) {
  Expected<int> five = 5;
  EXPECT_TRUE(five.has_value());
  EXPECT_EQ(five.value(), 5);
  EXPECT_EQ(*five, 5);
  EXPECT_TRUE(five.status().ok());
  Expected<int> failed = Status(ErrorKind::Io, "disk on fire");
  EXPECT_FALSE(failed);
  EXPECT_EQ(failed.value_or(7), 7);
  EXPECT_EQ(failed.status().message(), "disk on fire");
  try {
    (void)failed.value();
    ADD_FAILURE() << "value() of an error returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_STREQ(e.what(), "disk on fire");
  }
  // An Expected is never empty: a success status without a value is a defect, named as such.
  Expected<int> neither = Status();
  EXPECT_FALSE(neither);
  EXPECT_EQ(neither.status().kind(), ErrorKind::Internal);

  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_NO_THROW(ok.throw_if_error());
  // A NUL in a message (names and paths may hold one) is written `\0` by both faces alike, so
  // the message is whole as a C string too.
  Status bad(ErrorKind::TypeMismatch, std::string("nope\0nul", 8));
  EXPECT_EQ(bad.message(), "nope\\0nul");
  EXPECT_EQ(test::kind_of([&] { bad.throw_if_error(); }), ErrorKind::TypeMismatch);
  EXPECT_EQ(Error(bad).status().message(), bad.message());
  EXPECT_STREQ(Error(bad).what(), bad.message().c_str());
  EXPECT_EQ(Error(ErrorKind::Io, std::string("a\0b", 3)).status().message(), "a\\0b");

  // On a temporary, `*` and `value()` hand the value out by value: a range-for over a call's
  // result keeps it alive (with a reference it would dangle; the asan preset would see it).
  std::size_t total = 0;
  for (const auto& s : *Expected<std::vector<std::string>>(std::vector<std::string>{"ab", "cde"}))
    total += s.size();
  EXPECT_EQ(total, 5u);
  // value_or on a move-only value.
  auto owned = Expected<std::unique_ptr<int>>(std::make_unique<int>(4)).value_or(nullptr);
  ASSERT_NE(owned, nullptr);
  EXPECT_EQ(*owned, 4);
  EXPECT_EQ(Expected<std::unique_ptr<int>>(Status(ErrorKind::Io, "x")).value_or(nullptr), nullptr);
}

// Expected keeps its value in storage of its own (not a std::optional): every copy, move and
// assignment between a value and an error constructs and destroys the value exactly once, and
// copying is offered exactly when the value can be copied.
struct Counted {
  explicit Counted(int v) : value(v) { ++live; }
  Counted(const Counted& o) : value(o.value) { ++live; }
  Counted(Counted&& o) noexcept : value(std::exchange(o.value, -1)) { ++live; }
  Counted& operator=(const Counted&) = default;
  Counted& operator=(Counted&& o) noexcept {
    value = std::exchange(o.value, -1);
    return *this;
  }
  ~Counted() { --live; }
  int value;
  static inline int live = 0;
};

static_assert(std::is_copy_constructible_v<Expected<Counted>> &&
              std::is_copy_assignable_v<Expected<Counted>>);
static_assert(!std::is_copy_constructible_v<Expected<std::unique_ptr<int>>>);
static_assert(!std::is_copy_assignable_v<Expected<std::unique_ptr<int>>>);
static_assert(std::is_nothrow_move_constructible_v<Expected<std::unique_ptr<int>>>);

TEST(NothrowTypes, ExpectedCopiesMovesAndAssignsItsValueExactlyOnce) {
  {
    Expected<Counted> one = Counted(1);
    Expected<Counted> error = Status(ErrorKind::Io, "gone");
    EXPECT_EQ(Counted::live, 1);
    Expected<Counted> copy = one;
    EXPECT_EQ(Counted::live, 2);
    EXPECT_EQ(copy->value, 1);
    copy = error;  // a value replaced by an error is destroyed
    EXPECT_EQ(Counted::live, 1);
    EXPECT_FALSE(copy);
    EXPECT_EQ(copy.status().message(), "gone");
    copy = one;  // an error replaced by a value holds a copy
    EXPECT_EQ(Counted::live, 2);
    EXPECT_EQ(copy->value, 1);
    EXPECT_TRUE(copy.status().ok());
    Expected<Counted> two = Counted(2);
    copy = std::move(two);  // value over value: assigned, none made or lost
    EXPECT_EQ(Counted::live, 3);
    EXPECT_EQ(copy->value, 2);
    EXPECT_TRUE(two.has_value());  // as std::optional: a moved-from Expected holds a moved-from value
    EXPECT_EQ(two->value, -1);
    Expected<Counted> moved = std::move(copy);
    EXPECT_EQ(Counted::live, 4);
    EXPECT_EQ(moved->value, 2);
    moved = Expected<Counted>(Status(ErrorKind::TypeMismatch, "no"));
    EXPECT_EQ(Counted::live, 3);
    EXPECT_EQ(moved.status().kind(), ErrorKind::TypeMismatch);
    EXPECT_EQ(Counted(error.value_or(Counted(5))).value, 5);
    EXPECT_EQ(Counted::live, 3);
    Counted out = std::move(one).value();  // by value from a temporary, the Expected keeps its own
    EXPECT_EQ(out.value, 1);
    EXPECT_EQ(Counted::live, 4);
    std::vector<Expected<Counted>> many;
    for (int i = 0; i < 50; ++i)
      many.push_back(i % 3 ? Expected<Counted>(Counted(i)) : Status(ErrorKind::Io, "e"));
    EXPECT_EQ(Counted::live, 4 + 33);
    EXPECT_EQ(many[49]->value, 49);
    EXPECT_FALSE(many[48]);
  }
  EXPECT_EQ(Counted::live, 0);  // nothing leaked, nothing destroyed twice
  Expected<std::unique_ptr<int>> p = std::make_unique<int>(3);
  auto q = std::move(p);
  EXPECT_EQ(**q, 3);
}

// A value whose copy or move throws (an allocation that fails) leaves an `Expected` as it was:
// a value never built is never destroyed, one already held is destroyed once, and an error
// keeps its message. The values own heap memory, so the asan preset sees a double or a missed
// destruction.
struct Fragile {
  explicit Fragile(std::string t) : text(std::move(t)) { ++live; }
  Fragile(const Fragile& o) : text(unless_failing(o.text)) { ++live; }
  Fragile(Fragile&& o) : text(unless_failing(std::move(o.text))) { ++live; }
  Fragile& operator=(const Fragile& o) {
    if (failing) throw std::bad_alloc();
    text = o.text;
    return *this;
  }
  Fragile& operator=(Fragile&& o) {
    if (failing) throw std::bad_alloc();
    text = std::move(o.text);
    return *this;
  }
  ~Fragile() { --live; }
  /// `s` as given, or the throw before anything is taken from it.
  template <class S>
  static S&& unless_failing(S&& s) {
    if (failing) throw std::bad_alloc();
    return std::forward<S>(s);
  }
  std::string text;
  static inline int live = 0;
  static inline bool failing = false;
};

TEST(NothrowTypes, ExpectedStaysWholeWhenItsValueFailsToCopyOrMove) {
  const std::string long_text(64, 'v');  // beyond the small-string buffer: on the heap
  const std::string long_error(64, 'e');
  {
    Expected<Fragile> value = Fragile(long_text);
    Expected<Fragile> error = Status(ErrorKind::Io, long_error);
    Expected<Fragile> other = Fragile("other" + long_text);
    Fragile::failing = true;
    EXPECT_THROW((void)Expected<Fragile>{value}, std::bad_alloc);
    EXPECT_THROW((void)Expected<Fragile>{std::move(value)}, std::bad_alloc);
    EXPECT_THROW(error = value, std::bad_alloc);  // nothing built: still the error
    EXPECT_THROW(error = std::move(value), std::bad_alloc);
    EXPECT_THROW(other = value, std::bad_alloc);  // the value held stays held
    EXPECT_THROW(other = std::move(value), std::bad_alloc);
    Fragile::failing = false;
    EXPECT_EQ(Fragile::live, 2);
    ASSERT_FALSE(error);
    EXPECT_EQ(error.status().kind(), ErrorKind::Io);
    EXPECT_EQ(error.status().message(), long_error);
    ASSERT_TRUE(value);
    EXPECT_EQ(value->text, long_text);
    ASSERT_TRUE(other);
    EXPECT_EQ(other->text, "other" + long_text);
    // Self-assignment keeps either state as it is.
    auto& same = value;
    value = same;
    value = std::move(same);
    auto& same_error = error;
    error = same_error;
    error = std::move(same_error);
    EXPECT_EQ(value->text, long_text);
    EXPECT_EQ(error.status().message(), long_error);
    // And each state still reports as it should.
    EXPECT_EQ(test::kind_of([&] { (void)error->text; }), ErrorKind::Io);
    EXPECT_EQ(test::kind_of([&] { (void)*std::as_const(error); }), ErrorKind::Io);
    EXPECT_EQ(test::kind_of([&] { (void)std::move(error).value(); }), ErrorKind::Io);
    error = value;
    EXPECT_EQ(Fragile::live, 3);
    EXPECT_EQ(error->text, long_text);
  }
  EXPECT_EQ(Fragile::live, 0);
}

// `as_f32` and `as_f64` fill a vector of their element type through one private helper that
// sizes it from the target's bytes. Given an element that is not the target's (three F16
// values are 6 bytes, one float and a half), the destination is the vector's own bytes, and
// the core refuses it rather than writing past the vector (the asan preset sees such a write).
TEST(NothrowTypes, AConvertedVectorOfAnotherElementThanTheTargetIsRefusedNotOverrun) {
  std::vector<std::uint16_t> half{0x3c00, 0x4000, 0x4200};  // 1, 2, 3
  const safetensors::TensorView t{Dtype::F16, {3}, std::as_bytes(std::span(half)), {}};
  auto out = safetensors::detail::converted_vector<float>(t, Dtype::F16);
  ASSERT_FALSE(out);
  EXPECT_EQ(out.status().kind(), ErrorKind::TensorInvalidInfo) << out.status().message();
  // The helper as the public functions call it.
  auto floats = nt::as_f32(t);
  ASSERT_TRUE(floats) << floats.status().message();
  EXPECT_EQ(*floats, (std::vector<float>{1.0f, 2.0f, 3.0f}));
}

}  // namespace
