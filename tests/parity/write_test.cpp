// Writing and dequantizing, through the C API and the C++ API on the same inputs: files saved
// all at once (atomically, and into memory), files and sharded checkpoints written in pieces
// (pieces out of order, twice, past the end, under names never declared or not UTF-8, a finish
// with bytes missing and one blocked by a directory, each then finished again), every
// declaration the writers refuse, and fp8-block and MXFP4 dequantization. Each comparison
// requires the same outcome kind, message and bytes (parity.hpp); each API writes to the same
// path in turn, so that messages naming it can be compared.
#include <gtest/gtest.h>
#include <safetensors/streaming_writer.hpp>

#include <map>
#include <string>
#include <vector>

#include "../cpp/support.hpp"
#include "parity.hpp"

namespace parity {
namespace {

using D = st::Dtype;

Tensor tensor(std::string name, D dtype, std::vector<std::size_t> shape, std::size_t bytes,
              unsigned from = 1) {
  return {std::move(name), static_cast<int>(dtype), std::move(shape), counting(bytes, from)};
}

/// The metadata entries of `m` as the C API takes them (pointing into `m`).
std::vector<st_metadata_entry> c_metadata(const st::Metadata& m) {
  std::vector<st_metadata_entry> out;
  for (const auto& [k, v] : m) out.push_back({c_str(k), c_str(v)});
  return out;
}

std::vector<std::pair<std::string, st::TensorView>> cxx_views(const std::vector<Tensor>& tensors) {
  std::vector<std::pair<std::string, st::TensorView>> out;
  for (const auto& t : tensors) out.emplace_back(t.name, to_cxx(t));
  return out;
}

void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// ---- all at once ----------------------------------------------------------------------------

struct SaveCase {
  std::string label;
  std::vector<Tensor> tensors;
  st::Metadata metadata;
  bool empty_metadata = false;
};

std::vector<SaveCase> save_cases() {
  const auto a = tensor("a", D::F32, {2, 2}, 16), b = tensor("b", D::U8, {3}, 3),
             c = tensor("c", D::BF16, {}, 2);
  return {
      {"mixed tensors and metadata", {b, a, c}, {{"format", "pt"}, {"z", "1"}}},
      {"empty metadata kept", {a}, {}, true},
      {"no metadata", {a}, {}},
      {"no tensors", {}, {{"format", "pt"}}},
      {"no tensors, empty metadata", {}, {}, true},
      {"sub-byte and empty tensors", {tensor("f4", D::F4, {3, 2}, 3), tensor("e", D::F16, {0}, 0)}, {}},
      {"reserved name", {tensor("__metadata__", D::U8, {1}, 1)}, {}},
      {"name twice", {a, a}, {}},
      {"name not UTF-8", {tensor("w\xc3(", D::U8, {1}, 1)}, {}},
      {"dtype value of no dtype", {Tensor{"w", 99, {1}, "x"}}, {}},
      {"bytes short of the shape", {tensor("w", D::F32, {2}, 7)}, {}},
      {"sub-byte count ending inside a byte", {tensor("w", D::F4, {3}, 2)}, {}},
      {"shape overflowing", {Tensor{"w", static_cast<int>(D::F32), {1ull << 62, 8}, ""}}, {}},
      {"metadata key not UTF-8", {a}, {{"k\xff", "v"}}},
      {"metadata value not UTF-8", {a}, {{"k", "\xe2\x82"}}},
  };
}

Outcome c_save(const fs::path& path, const SaveCase& s) {
  return via_c([&](st_error* err, std::string& v) {
    std::vector<st_tensor> tensors;
    for (const auto& t : s.tensors) tensors.push_back(to_c(t));
    auto meta = c_metadata(s.metadata);
    const std::uint32_t flags = ST_SAVE_NO_SYNC | (s.empty_metadata ? ST_SAVE_EMPTY_METADATA : 0);
    const bool ok = st_save_file(path.c_str(), tensors.data(), tensors.size(), meta.data(), meta.size(),
                                 flags, err) == ST_OK;
    v += file_text(path);
    return ok;
  });
}

Outcome cxx_save(const fs::path& path, const SaveCase& s) {
  return via_cxx([&](std::string& v) {
    auto saved = st::nothrow::save_file(path, cxx_views(s.tensors), s.metadata,
                                        {.sync = false, .empty_metadata = s.empty_metadata});
    v += file_text(path);
    saved.throw_if_error();
  });
}

Outcome c_serialize(const SaveCase& s) {
  return via_c([&](st_error* err, std::string& v) {
    std::vector<st_tensor> tensors;
    for (const auto& t : s.tensors) tensors.push_back(to_c(t));
    auto meta = c_metadata(s.metadata);
    void* data = nullptr;
    std::size_t len = 0;
    const std::uint32_t flags = s.empty_metadata ? ST_SAVE_EMPTY_METADATA : 0;
    if (st_serialize(tensors.data(), tensors.size(), meta.data(), meta.size(), flags, &data, &len, err) !=
        ST_OK)
      return false;
    v.assign(static_cast<const char*>(data), len);
    st_bytes_free(data);
    return true;
  });
}

Outcome cxx_serialize(const SaveCase& s) {
  return via_cxx([&](std::string& v) {
    auto bytes = st::serialize(cxx_views(s.tensors), s.metadata, {.empty_metadata = s.empty_metadata});
    v.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  });
}

TEST(ParitySave, SavingAndSerializingWriteTheSameBytesAndRefuseTheSameWays) {
  test::TempDir dir;
  for (const auto& s : save_cases()) {
    for (const auto& path : {dir / "out.safetensors", dir.path() / "no such dir" / "out.safetensors"}) {
      remove_tree(path);
      auto c = c_save(path, s);
      remove_tree(path);
      auto cxx = cxx_save(path, s);
      remove_tree(path);
      expect_same("save_file: " + s.label + " at " + path.string(), c, cxx);
    }
    expect_same("serialize: " + s.label, c_serialize(s), cxx_serialize(s));
  }
}

// ---- in pieces ------------------------------------------------------------------------------

/// One step of a writer's life.
struct Step {
  enum Op { Write, Finish, Block, Unblock } op = Write;
  std::string name;
  std::uint64_t offset = 0;
  std::string bytes;
};

Step write(std::string name, std::uint64_t offset, std::string bytes) {
  return {Step::Write, std::move(name), offset, std::move(bytes)};
}
const Step finish{Step::Finish, "", 0, ""};
/// A directory at the name a finish publishes (the file, or a sharded checkpoint's index), so
/// that the finish fails; `unblock` removes it.
const Step block{Step::Block, "", 0, ""};
const Step unblock{Step::Unblock, "", 0, ""};

struct WriterCase {
  std::string label;
  std::vector<Tensor> tensors;  // declarations; their bytes are what `write_all` writes
  st::Metadata metadata;
  std::vector<Step> steps;
  bool sharded = false;
  std::uint64_t max_shard_size = 5'000'000'000;
  std::string prefix = "model";
  std::size_t alignment = 0;
  bool empty_metadata = false;
};

/// Steps writing every declared tensor whole.
std::vector<Step> write_all(const std::vector<Tensor>& tensors) {
  std::vector<Step> out;
  for (const auto& t : tensors) out.push_back(write(t.name, 0, t.bytes));
  return out;
}

std::vector<WriterCase> writer_cases() {
  const auto a = tensor("a", D::F32, {2, 3}, 24), b = tensor("b", D::U8, {5}, 5),
             c = tensor("c", D::I64, {}, 8);
  const std::vector<Tensor> abc = {a, b, c};
  auto then_finish = [](std::vector<Step> steps) {
    steps.push_back(finish);
    return steps;
  };
  std::vector<WriterCase> cases = {
      {"whole tensors", abc, {{"format", "pt"}}, then_finish(write_all(abc))},
      {"pieces out of order",
       abc,
       {},
       {write("a", 12, a.bytes.substr(12)), write("c", 0, c.bytes), write("b", 3, "xy"),
        write("a", 0, a.bytes.substr(0, 12)), write("b", 0, "abc"), finish}},
      {"misfit pieces",
       abc,
       {},
       {write("a", 20, "12345"), write("a", 0, "12"), write("a", 1, "x"), write("nope", 0, "x"),
        write("a\xff", 0, "x"), write("", 0, ""), write("b", 5, ""), write("c", 1u << 31, "x")}},
      {"finish with bytes missing, then completed",
       abc,
       {},
       {write("a", 0, a.bytes), finish, write("b", 0, b.bytes), finish, write("c", 0, c.bytes), finish}},
      {"finish blocked by a directory, then cleared",
       abc,
       {},
       {write("a", 0, a.bytes), write("b", 0, b.bytes), write("c", 0, c.bytes), block, finish, unblock,
        finish}},
      {"aligned to 4096", abc, {{"format", "pt"}}, then_finish(write_all(abc)), false, 24, "model", 4096},
      {"empty metadata kept", {a}, {}, then_finish(write_all({a})), false, 24, "model", 0, true},
      {"alignment not a power of two", abc, {}, {}, false, 24, "model", 3},
      {"reserved name", {tensor("__metadata__", D::U8, {1}, 1)}, {}, {}},
      {"name twice", {a, a}, {}, {}},
      {"name not UTF-8", {tensor("\xff", D::U8, {1}, 1)}, {}, {}},
      {"dtype value of no dtype", {Tensor{"w", 200, {1}, "x"}}, {}, {}},
      {"metadata not UTF-8", {a}, {{"k", "\xff"}}, {}},
      {"shape overflowing", {Tensor{"w", static_cast<int>(D::F64), {1ull << 61, 4}, ""}}, {}, {}},
  };
  // The same as sharded checkpoints: cut into several shards, or one.
  const std::size_t files = cases.size();
  for (std::size_t i = 0; i < files; ++i) {
    auto s = cases[i];
    s.label = "sharded: " + s.label;
    s.sharded = true;
    s.max_shard_size = 24;
    cases.push_back(s);
  }
  cases.push_back({"sharded in one shard", abc, {{"format", "pt"}}, then_finish(write_all(abc)), true});
  cases.push_back({"sharded, prefix of our own", abc, {}, then_finish(write_all(abc)), true, 10, "ckpt"});
  cases.push_back({"sharded, prefix holding a slash", abc, {}, {}, true, 10, "a/b"});
  // Both take the core's rule (`Declarations::shard_prefix`): a prefix that is not UTF-8 is
  // `InvalidShardPath`, as every prefix that is no plain file name.
  cases.push_back({"sharded, prefix not UTF-8", {tensor("a", D::U8, {1}, 1)}, {}, {}, true, 10, "m\xff"});
  return cases;
}

struct CWriter {
  st_writer* w = nullptr;
  CWriter() = default;
  CWriter(const CWriter&) = delete;
  CWriter& operator=(const CWriter&) = delete;
  ~CWriter() { st_writer_free(w); }
};

/// Where a finish publishes last (a file's target, or a sharded checkpoint's index or its only
/// shard), which `block` puts a directory at.
fs::path last_file(const fs::path& target, const WriterCase& w, const std::vector<std::string>& files) {
  return w.sharded ? target / files.back() : target;
}

/// The files a writer published, with their bytes.
std::string published(const fs::path& target, const WriterCase& w, const std::vector<std::string>& files) {
  std::string out;
  for (const auto& name : files) {
    out += "\n" + name + ": " + file_text(w.sharded ? target / name : target.parent_path() / name);
  }
  return out;
}

void do_block(const fs::path& at, bool on) {
  if (on) {
    fs::create_directories(at / "inside");
  } else {
    remove_tree(at);
  }
}

Outcome c_writer(const fs::path& target, const WriterCase& w) {
  return via_c([&](st_error* err, std::string& v) {
    std::vector<st_tensor> decls;
    for (const auto& t : w.tensors) decls.push_back(to_c(t));
    auto meta = c_metadata(w.metadata);
    st_write_options options;
    std::memset(&options, 0, sizeof options);
    options.flags = ST_SAVE_NO_SYNC | (w.empty_metadata ? ST_SAVE_EMPTY_METADATA : 0);
    options.alignment = w.alignment;
    options.max_shard_size = w.max_shard_size;
    options.prefix = c_str(w.prefix);
    CWriter writer;
    const int rc = w.sharded ? st_writer_create_sharded(target.c_str(), decls.data(), decls.size(),
                                                        meta.data(), meta.size(), &options, &writer.w, err)
                             : st_writer_create(target.c_str(), decls.data(), decls.size(), meta.data(),
                                                meta.size(), &options, &writer.w, err);
    if (rc != ST_OK) return false;
    std::vector<std::string> files;
    for (std::size_t i = 0; i < st_writer_file_count(writer.w); ++i) {
      st_str name;
      if (st_writer_file_name(writer.w, i, &name, err) != ST_OK) return false;
      files.emplace_back(name.ptr, name.len);
      v += files.back() + ",";
    }
    for (const auto& step : w.steps) {
      if (step.op == Step::Block || step.op == Step::Unblock) {
        do_block(last_file(target, w, files), step.op == Step::Block);
        continue;
      }
      note(v, via_c([&](st_error* e, std::string&) {
             if (step.op == Step::Write) {
               return st_writer_write(writer.w, step.name.data(), step.name.size(), step.offset,
                                      step.bytes.data(), step.bytes.size(), e) == ST_OK;
             }
             if (st_writer_finish(writer.w, e) != ST_OK) return false;
             writer.w = nullptr;  // freed by the finish that published
             return true;
           }));
    }
    v += published(target, w, files);
    return true;
  });
}

Outcome cxx_writer(const fs::path& target, const WriterCase& w) {
  return via_cxx([&](std::string& v) {
    std::vector<st::TensorSpec> specs;
    for (const auto& t : w.tensors) specs.push_back({t.name, static_cast<D>(t.dtype), t.shape});
    const st::SaveOptions options{
        .sync = false, .empty_metadata = w.empty_metadata, .alignment = w.alignment};
    std::optional<st::StreamingWriter> writer;
    if (w.sharded) {
      writer.emplace(st::ShardedWriter(target, specs, w.metadata, {w.max_shard_size, w.prefix}, options));
    } else {
      writer.emplace(target, specs, w.metadata, options);
    }
    std::vector<std::string> files;
    for (const auto& path : writer->files()) {
      files.push_back(fs::path(path).filename().string());
      v += files.back() + ",";
    }
    for (const auto& step : w.steps) {
      if (step.op == Step::Block || step.op == Step::Unblock) {
        do_block(last_file(target, w, files), step.op == Step::Block);
        continue;
      }
      note(v, via_cxx([&](std::string&) {
             if (step.op == Step::Write) {
               writer->write(step.name, step.offset,
                             std::as_bytes(std::span(step.bytes.data(), step.bytes.size())));
             } else {
               writer->finish();
             }
           }));
    }
    v += published(target, w, files);
  });
}

TEST(ParityWriters, FilesAndShardedCheckpointsWrittenInPiecesAgree) {
  test::TempDir dir;
  const std::size_t before = compared();
  for (const auto& w : writer_cases()) {
    const fs::path target = w.sharded ? dir / "ckpt" : dir / "out.safetensors";
    auto fresh = [&] {
      remove_tree(target);
      if (w.sharded) fs::create_directories(target);
    };
    fresh();
    auto c = c_writer(target, w);
    fresh();
    auto cxx = cxx_writer(target, w);
    remove_tree(target);
    expect_same("writer: " + w.label, c, cxx);
  }
  EXPECT_GT(compared() - before, 30u);
}

// The one writer case whose kind is pinned beside its agreement: the C++ bridge once read a
// shard prefix as a tensor name (InvalidTensorName) where the core says InvalidShardPath.
TEST(ParityWriters, APrefixThatIsNotUtf8IsAnInvalidShardPathOnBothFaces) {
  test::TempDir dir;
  fs::create_directories(dir / "ckpt");
  const WriterCase w{"sharded, prefix not UTF-8", {tensor("a", D::U8, {1}, 1)}, {}, {}, true, 10, "m\xff"};
  auto c = c_writer(dir / "ckpt", w);
  auto cxx = cxx_writer(dir / "ckpt", w);
  EXPECT_EQ(c.kind, "InvalidShardPath") << c.message;
  expect_same("writer: " + w.label, c, cxx);
}

// ---- dequantization -------------------------------------------------------------------------

std::string floats(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::size_t i = 0;
  for (float f : values) std::memcpy(out.data() + 4 * i++, &f, 4);
  return out;
}

struct Fp8Case {
  std::string label;
  Tensor weight, scale;
  std::size_t rows = 2, cols = 2;
  D to = D::F32;
};

struct Mxfp4Case {
  std::string label;
  Tensor blocks, scales;
  D to = D::F32;
};

/// `f` into a buffer of `len` bytes (the C++ result's size when it has one, else 0: the C call
/// makes every check of its inputs before it looks at the output's size).
template <class F>
Outcome c_into(std::size_t len, F&& f) {
  return via_c([&](st_error* err, std::string& v) {
    std::string out(len, '\0');
    if (f(out, err) != ST_OK) return false;
    v += out;
    return true;
  });
}

TEST(ParityDequantize, Fp8BlocksAndMxfp4AgreeOnResultsAndRefusals) {
  const auto w = tensor("w", D::F8_E4M3, {4, 6}, 24);
  const Tensor s{"s", static_cast<int>(D::F32), {2, 3}, floats({1, 2, 0.5f, -1, 4, 0.25f})};
  std::vector<Fp8Case> fp8 = {
      {"2x2 blocks", w, s},
      {"into BF16", w, s, 2, 2, D::BF16},
      {"partial edge blocks", w, Tensor{"s", static_cast<int>(D::F32), {1, 2}, floats({2, 3})}, 4, 4},
      {"scale of the wrong shape", w, Tensor{"s", static_cast<int>(D::F32), {2, 2}, floats({1, 2, 3, 4})}},
      {"scale not F32", w, Tensor{"s", static_cast<int>(D::BF16), {2, 3}, counting(12)}},
      {"weight of a sub-byte dtype", tensor("w", D::F4, {4, 6}, 12), s},
      {"weight of one dimension", tensor("w", D::F8_E4M3, {24}, 24), s},
      {"weight bytes short", Tensor{"w", static_cast<int>(D::F8_E4M3), {4, 6}, counting(20)}, s},
      {"zero block rows", w, s, 0, 2},
      {"target not a float", w, s, 2, 2, D::I32},
      {"target of four bits", w, s, 2, 2, D::F4},
  };
  for (const auto& k : fp8) {
    auto cxx = via_cxx([&](std::string& v) {
      auto out = st::dequantize_fp8_blocks(to_cxx(k.weight), to_cxx(k.scale), k.to, k.rows, k.cols);
      v.assign(reinterpret_cast<const char*>(out.data.data()), out.data.size());
    });
    auto c = c_into(cxx.value.size(), [&](std::string& out, st_error* err) {
      auto wt = to_c(k.weight), sc = to_c(k.scale);
      return st_dequantize_fp8_blocks(&wt, &sc, k.rows, k.cols, static_cast<std::int32_t>(k.to), out.data(),
                                      out.size(), err);
    });
    expect_same("fp8 blocks: " + k.label, c, cxx);
  }
  const auto blocks = tensor("blocks", D::U8, {2, 3, 16}, 96);
  const auto scales = tensor("scales", D::U8, {2, 3}, 6, 120);
  std::vector<Mxfp4Case> mx = {
      {"U8 scales", blocks, scales},
      {"E8M0 scales into BF16", blocks, tensor("scales", D::F8_E8M0, {2, 3}, 6, 125), D::BF16},
      {"blocks of 15 bytes", tensor("blocks", D::U8, {2, 3, 15}, 90), scales},
      {"scales of the wrong shape", blocks, tensor("scales", D::U8, {2, 2}, 4)},
      {"blocks not U8", tensor("blocks", D::I8, {2, 3, 16}, 96), scales},
      {"target not a float", blocks, scales, D::U16},
      {"blocks bytes short", Tensor{"blocks", static_cast<int>(D::U8), {2, 3, 16}, counting(95)}, scales},
  };
  for (const auto& k : mx) {
    auto cxx = via_cxx([&](std::string& v) {
      auto out = st::dequantize_mxfp4(to_cxx(k.blocks), to_cxx(k.scales), k.to);
      v.assign(reinterpret_cast<const char*>(out.data.data()), out.data.size());
    });
    auto c = c_into(cxx.value.size(), [&](std::string& out, st_error* err) {
      auto b = to_c(k.blocks), sc = to_c(k.scales);
      return st_dequantize_mxfp4(&b, &sc, static_cast<std::int32_t>(k.to), out.data(), out.size(), err);
    });
    expect_same("mxfp4: " + k.label, c, cxx);
  }
}

// ---- the map from C status codes ------------------------------------------------------------

TEST(ParityKinds, EveryCStatusCodeIsTheErrorKindOfItsName) {
  for (std::int32_t code = 0; code < static_cast<std::int32_t>(st::error_kind_count); ++code) {
    auto kind = kind_of(code);
    ASSERT_TRUE(kind.has_value()) << code;
    EXPECT_EQ(st::to_string(*kind), st_error_kind_name(code));
  }
  EXPECT_FALSE(kind_of(static_cast<std::int32_t>(st::error_kind_count)).has_value());
  EXPECT_FALSE(kind_of(-1).has_value());
}

}  // namespace
}  // namespace parity
