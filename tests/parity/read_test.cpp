// Reading, through the C API and the C++ API on the same inputs: each file opened every way
// (the three backends, a caller's memory lent and copied, trailing bytes refused and allowed),
// then what each API reads of it (the description, the keys in both orders, the metadata, each
// tensor's info and bytes, slices, dtype conversions, ranges of the data buffer, names that are
// missing, reserved or not UTF-8); checkpoints strict and lenient (a stale index, a shard
// holding an unlisted copy, a bad index, an escaping shard path, a missing shard); and every
// file of the hostile corpus; upload plans of files and checkpoints (requests, shard pins,
// alignments). Each comparison requires the same outcome kind, message and
// bytes (parity.hpp).
#include <gtest/gtest.h>
#include <safetensors/cuda.hpp>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../cpp/support.hpp"
#include "parity.hpp"

namespace parity {
namespace {

// ---- the inputs -----------------------------------------------------------------------------

/// The tensors of the plain file: every kind of dtype (whole bytes, sub-byte, complex, fp8), a
/// scalar, an empty tensor, a name holding a NUL.
std::vector<Tensor> plain_tensors() {
  using D = st::Dtype;
  auto t = [](std::string name, D d, std::vector<std::size_t> shape, std::size_t bytes, unsigned from) {
    return Tensor{std::move(name), static_cast<int>(d), std::move(shape), counting(bytes, from)};
  };
  return {
      t("f32", D::F32, {2, 3}, 24, 1),
      t("u8", D::U8, {5}, 5, 2),
      t("bf16", D::BF16, {4}, 8, 3),
      t("f4", D::F4, {2, 4}, 4, 4),
      t("i64s", D::I64, {}, 8, 5),
      t("empty", D::F16, {0, 3}, 0, 6),
      t(std::string("nul\0name", 8), D::U8, {2}, 2, 7),
      t("c64", D::C64, {2}, 16, 8),
      t("f8", D::F8_E4M3, {3}, 3, 9),
  };
}

/// Writes `tensors` with `metadata` at `path` through the C++ API (the writers' parity is
/// write_test.cpp's).
void save(const fs::path& path, const std::vector<Tensor>& tensors, const st::Metadata& metadata = {},
          std::size_t alignment = 0) {
  std::vector<std::pair<std::string, st::TensorView>> views;
  for (const auto& t : tensors) views.emplace_back(t.name, to_cxx(t));
  st::save_file(path, views, metadata, {.sync = false, .alignment = alignment});
}

void write_text(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

/// The names every file is asked for besides its own: missing, reserved, not UTF-8, empty.
const std::vector<std::string> odd_names = {"no such tensor", "__metadata__", "w\xff\xfe", ""};

/// Selections every tensor is sliced with: everything, rows, a position from the end, a
/// stride, positions out of range, more indices than dimensions, a cut inside a byte (F4).
std::vector<std::vector<Ix>> selections(std::size_t rank) {
  std::vector<std::vector<Ix>> out = {{}};
  if (rank >= 1) {
    out.push_back({Ix::range(0, 1)});
    out.push_back({Ix::at(-1)});
    out.push_back({Ix::range(std::nullopt, std::nullopt, 2)});
    out.push_back({Ix::at(1000)});
    out.push_back({Ix::range(0, 1, 0)});
    out.push_back({Ix::all(), Ix::range(1, std::nullopt)});
  }
  out.push_back(std::vector<Ix>(rank + 1, Ix::all()));
  return out;
}

/// The dtypes every tensor is converted to: floats of every width, and a target that is not a
/// float.
const std::vector<st::Dtype> targets = {st::Dtype::F32,     st::Dtype::F64, st::Dtype::BF16,
                                        st::Dtype::F8_E4M3, st::Dtype::F4,  st::Dtype::I32};

// ---- opening --------------------------------------------------------------------------------

enum class Way { Mmap, Read, Direct, Memory, MemoryCopy };
constexpr Way every_way[] = {Way::Mmap, Way::Read, Way::Direct, Way::Memory, Way::MemoryCopy};

const char* way_name(Way w) {
  switch (w) {
    case Way::Mmap:
      return "mmap";
    case Way::Read:
      return "read";
    case Way::Direct:
      return "direct";
    case Way::Memory:
      return "memory";
    case Way::MemoryCopy:
      return "memory-copy";
  }
  return "?";
}

bool in_memory(Way w) {
  return w == Way::Memory || w == Way::MemoryCopy;
}

std::uint32_t c_backend(Way w) {
  return w == Way::Read ? ST_BACKEND_READ : w == Way::Direct ? ST_BACKEND_DIRECT : ST_BACKEND_MMAP;
}

st::Backend cxx_backend(Way w) {
  return w == Way::Read ? st::Backend::Read : w == Way::Direct ? st::Backend::Direct : st::Backend::Mmap;
}

/// Bytes lent to the C API, freed by the release callback (which the library calls once).
struct Loan {
  std::string bytes;
};

struct CFile {
  st_file* f = nullptr;
  CFile() = default;
  CFile(const CFile&) = delete;
  CFile& operator=(const CFile&) = delete;
  ~CFile() { st_file_free(f); }
};

bool c_open(const fs::path& path, Way way, bool trailing, CFile& out, st_error* err) {
  const std::uint32_t flags = trailing ? ST_OPEN_ALLOW_TRAILING_BYTES : 0;
  if (!in_memory(way)) return st_file_open(path.c_str(), c_backend(way) | flags, &out.f, err) == ST_OK;
  auto* loan = new Loan{file_text(path)};
  if (way == Way::MemoryCopy) {
    const int rc =
        st_file_open_memory_copy(loan->bytes.data(), loan->bytes.size(), nullptr, flags, &out.f, err);
    delete loan;
    return rc == ST_OK;
  }
  auto release = [](void* owner) { delete static_cast<Loan*>(owner); };
  return st_file_open_memory(loan->bytes.data(), loan->bytes.size(), nullptr, flags, release, loan, &out.f,
                             err) == ST_OK;
}

st::SafeOpen cxx_open(const fs::path& path, Way way, bool trailing) {
  st::OpenOptions options{.backend = cxx_backend(way), .allow_trailing_bytes = trailing};
  if (!in_memory(way)) return st::SafeOpen(path, options);
  auto bytes = std::make_shared<std::string>(file_text(path));
  auto span = std::as_bytes(std::span(bytes->data(), bytes->size()));
  if (way == Way::MemoryCopy) return st::SafeOpen::from_bytes_copy(span, options);
  return st::SafeOpen::from_bytes(span, bytes, options);
}

// ---- one tensor -----------------------------------------------------------------------------

std::string describe(std::string_view dtype, const std::string& shape, std::uint64_t begin,
                     std::uint64_t end) {
  return std::string(dtype) + " " + shape + " [" + std::to_string(begin) + "," + std::to_string(end) + ") ";
}

/// The tensor's info and bytes (C: `st_file_info`, its zero-copy bytes where there are some,
/// and `st_file_read`, which must agree).
Outcome c_tensor(const st_file* f, const std::string& name, std::string* bytes_out) {
  return via_c([&](st_error* err, std::string& v) {
    st_tensor t;
    if (st_file_info(f, name.data(), name.size(), &t, err) != ST_OK) return false;
    v += describe(st_dtype_name(t.dtype), shape_text(std::span(t.shape, t.rank)), t.data_begin, t.data_end);
    std::string read(t.byte_size, '\0');
    if (st_file_read(f, name.data(), name.size(), read.data(), read.size(), err) != ST_OK) return false;
    if (t.data != nullptr) {
      EXPECT_EQ(std::string(static_cast<const char*>(t.data), t.byte_size), read)
          << "zero-copy bytes of " << name;
    }
    v += read;
    if (bytes_out) *bytes_out = read;
    return true;
  });
}

Outcome cxx_tensor(const st::SafeOpen& f, const std::string& name) {
  return via_cxx([&](std::string& v) {
    auto info = f.info(name);
    v += describe(st::to_string(info.dtype), shape_text(info.shape), info.data_offsets.first,
                  info.data_offsets.second);
    auto view = f.get_tensor(name);
    v += std::string(reinterpret_cast<const char*>(view.data.data()), view.data.size());
  });
}

std::string c_slice_result(const st_slice* s, st_error* err, bool& ok) {
  st_tensor t;
  ok = false;
  if (st_slice_tensor(s, &t, err) != ST_OK) return "";
  std::string bytes(t.byte_size, '\0');
  if (st_slice_read(s, bytes.data(), bytes.size(), err) != ST_OK) return "";
  ok = true;
  return std::string(st_dtype_name(t.dtype)) + " " + shape_text(std::span(t.shape, t.rank)) + " " + bytes;
}

std::string cxx_slice_result(const st::Slice& slice, const std::vector<Ix>& sel) {
  std::vector<st::Index> indices;
  for (const auto& i : sel) indices.push_back(to_cxx(i));
  auto view = slice.select(indices).read();
  return std::string(st::to_string(view.dtype)) + " " + shape_text(view.shape) + " " +
         std::string(reinterpret_cast<const char*>(view.data.data()), view.data.size());
}

Outcome c_slice(const st_file* f, const std::string& name, const std::vector<Ix>& sel) {
  return via_c([&](st_error* err, std::string& v) {
    std::vector<st_index> indices;
    for (const auto& i : sel) indices.push_back(to_c(i));
    st_slice* s = nullptr;
    if (st_file_slice(f, name.data(), name.size(), indices.data(), indices.size(), &s, err) != ST_OK)
      return false;
    bool ok = false;
    v += c_slice_result(s, err, ok);
    st_slice_free(s);
    return ok;
  });
}

Outcome cxx_slice(const st::SafeOpen& f, const std::string& name, const std::vector<Ix>& sel) {
  return via_cxx([&](std::string& v) { v += cxx_slice_result(f.get_slice(name), sel); });
}

/// `bytes` (a tensor of `info`) converted to `to`: C sizes the output with
/// `st_tensor_byte_size` where it can (an error there leaves it empty: the conversion makes
/// every check of its inputs before it looks at the output's size).
Outcome c_convert(const st_tensor& info, const std::string& bytes, st::Dtype to) {
  return via_c([&](st_error* err, std::string& v) {
    st_tensor src = info;
    src.data = bytes.data();
    src.byte_size = bytes.size();
    std::size_t size = 0;
    st_error ignored = ST_ERROR_INIT;
    if (st_tensor_byte_size(static_cast<std::int32_t>(to), src.shape, src.rank, &size, &ignored) != ST_OK)
      size = 0;
    st_error_clear(&ignored);
    std::string out(size, '\0');
    if (st_convert(&src, static_cast<std::int32_t>(to), out.data(), out.size(), err) != ST_OK) return false;
    v += out;
    return true;
  });
}

Outcome cxx_convert(const st::TensorView& view, st::Dtype to) {
  return via_cxx([&](std::string& v) {
    auto out = st::convert(view, to);
    v += std::string(reinterpret_cast<const char*>(out.data.data()), out.data.size());
  });
}

/// Every conversion of tensor `name` (read through each API) must agree.
void compare_conversions(const std::string& what, const st_file* cf, const st::SafeOpen& xf,
                         const std::string& name) {
  st_tensor info;
  st_error err = ST_ERROR_INIT;
  std::string bytes;
  const bool c_ok = st_file_info(cf, name.data(), name.size(), &info, &err) == ST_OK &&
                    c_tensor(cf, name, &bytes).kind == "OK";
  st_error_clear(&err);
  std::optional<st::TensorView> view;
  try {
    view = xf.get_tensor(name);
  } catch (const st::Error&) {
  }
  ASSERT_EQ(c_ok, view.has_value()) << what;
  if (!c_ok) return;
  for (auto to : targets) {
    expect_same(what + " as " + std::string(st::to_string(to)), c_convert(info, bytes, to),
                cxx_convert(*view, to));
  }
}

// ---- a whole file ---------------------------------------------------------------------------

/// The selections of a tensor of `rank` a whole-file read makes: every one of `selections`, or
/// (`brief`, for files of thousands of tensors) the whole tensor as a slice.
std::vector<std::vector<Ix>> file_selections(std::size_t rank, bool brief) {
  return brief ? std::vector<std::vector<Ix>>{{}} : selections(rank);
}

/// Everything the C API reads of an open file, each inner step's outcome in the transcript.
bool c_read_all(const st_file* f, bool brief, st_error* err, std::string& v) {
  st_file_desc d;
  if (st_file_describe(f, &d, err) != ST_OK) return false;
  v += "tensors " + std::to_string(d.tensor_count) + " header " + std::to_string(d.header_len) + " data " +
       std::to_string(d.data_len) + " trailing " + std::to_string(d.trailing_bytes) + " metadata " +
       std::to_string(d.has_metadata) + "/" + std::to_string(d.metadata_count) + "\n";
  std::vector<std::string> names;
  for (std::uint32_t order : {ST_ORDER_SORTED, ST_ORDER_FILE}) {
    for (std::size_t i = 0; i < d.tensor_count; ++i) {
      st_str name;
      if (st_file_key(f, i, order, &name, err) != ST_OK) return false;
      v += std::string(name.ptr, name.len) + ",";
      if (order == ST_ORDER_SORTED) names.emplace_back(name.ptr, name.len);
    }
    v += "\n";
  }
  for (std::size_t i = 0; i < d.metadata_count; ++i) {
    st_str key, value;
    if (st_file_metadata(f, i, &key, &value, err) != ST_OK) return false;
    v += std::string(key.ptr, key.len) + "=" + std::string(value.ptr, value.len) + ";";
  }
  st_str format;
  bool found = false;
  if (st_file_metadata_get(f, ST_LITERAL("format"), &format, &found, err) != ST_OK) return false;
  v += "\nformat " + (found ? std::string(format.ptr, format.len) : "(none)") + "\n";
  auto all = names;
  all.insert(all.end(), odd_names.begin(), odd_names.end());
  for (const auto& name : all) {
    note(v, c_tensor(f, name, nullptr));
    st_tensor t;
    st_error ignored = ST_ERROR_INIT;
    const std::size_t rank = st_file_info(f, name.data(), name.size(), &t, &ignored) == ST_OK ? t.rank : 1;
    st_error_clear(&ignored);
    for (const auto& sel : file_selections(rank, brief)) note(v, c_slice(f, name, sel));
  }
  for (auto [offset, len] :
       {std::pair<std::uint64_t, std::size_t>{0, 16}, {d.data_len - 2, 4}, {d.data_len, 0}}) {
    note(v, via_c([&](st_error* e, std::string& out) {
           std::string dst(len, '\0');
           if (st_file_read_data(f, offset, dst.data(), dst.size(), e) != ST_OK) return false;
           out += dst;
           return true;
         }));
  }
  return true;
}

/// Everything the C++ API reads of an open file, in the order `c_read_all` reads it.
void cxx_read_all(const st::SafeOpen& f, bool brief, std::string& v) {
  const auto metadata = f.metadata();
  v += "tensors " + std::to_string(f.size()) + " header " + std::to_string(f.header_size()) + " data " +
       std::to_string(f.data_size()) + " trailing " + std::to_string(f.trailing_bytes()) + " metadata " +
       std::to_string(f.has_metadata()) + "/" + std::to_string(metadata.size()) + "\n";
  const auto names = f.keys();
  for (const auto& list : {names, f.offset_keys()}) {
    for (const auto& name : list) v += name + ",";
    v += "\n";
  }
  for (const auto& [key, value] : metadata) v += key + "=" + value + ";";
  auto format = metadata.find("format");
  v += "\nformat " + (format != metadata.end() ? format->second : "(none)") + "\n";
  auto all = names;
  all.insert(all.end(), odd_names.begin(), odd_names.end());
  for (const auto& name : all) {
    note(v, cxx_tensor(f, name));
    const std::size_t rank = f.contains(name) ? f.info(name).shape.size() : 1;
    for (const auto& sel : file_selections(rank, brief)) note(v, cxx_slice(f, name, sel));
  }
  const std::size_t data_len = f.data_size();
  for (auto [offset, len] : {std::pair<std::size_t, std::size_t>{0, 16}, {data_len - 2, 4}, {data_len, 0}}) {
    note(v, via_cxx([&](std::string& out) {
           std::string dst(len, '\0');
           st::nothrow::read_data(f, offset, std::as_writable_bytes(std::span(dst.data(), dst.size())))
               .throw_if_error();
           out += dst;
         }));
  }
}

/// Opens `path` the way `way` says through both APIs and compares the whole transcript, then
/// (unless `brief`: only the whole tensors as slices) every selection and each tensor's
/// conversions.
void compare_file(const std::string& label, const fs::path& path, Way way, bool trailing, bool brief) {
  const std::string what = label + " (" + way_name(way) + (trailing ? ", trailing bytes allowed)" : ")");
  CFile cf;
  auto c = via_c([&](st_error* err, std::string& v) {
    return c_open(path, way, trailing, cf, err) && c_read_all(cf.f, brief, err, v);
  });
  std::optional<st::SafeOpen> xf;
  auto cxx = via_cxx([&](std::string& v) {
    xf.emplace(cxx_open(path, way, trailing));
    cxx_read_all(*xf, brief, v);
  });
  expect_same(what, c, cxx);
  if (brief || cf.f == nullptr || !xf) return;
  for (const auto& name : xf->keys()) compare_conversions(what + ": " + name, cf.f, *xf, name);
}

class ParityFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<test::TempDir>();
    save(*dir_ / "plain.safetensors", plain_tensors(), {{"format", "pt"}, {"z", "last"}});
    save(*dir_ / "bare.safetensors", {plain_tensors()[0]});
    save(*dir_ / "aligned.safetensors", plain_tensors(), {{"format", "pt"}}, 4096);
    auto trailing = file_text(*dir_ / "plain.safetensors") + "trailing";
    write_text(*dir_ / "trailing.safetensors", trailing);
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static inline std::unique_ptr<test::TempDir> dir_;
};

TEST_F(ParityFiles, EveryWayOfOpeningReadsTheSameThroughBothApis) {
  const std::size_t before = compared();
  for (const char* file :
       {"plain.safetensors", "bare.safetensors", "aligned.safetensors", "trailing.safetensors"}) {
    for (Way way : every_way) {
      for (bool trailing : {false, true}) compare_file(file, *dir_ / file, way, trailing, false);
    }
  }
  // Paths that are no file: missing, a directory.
  for (Way way : {Way::Mmap, Way::Read, Way::Direct}) {
    compare_file("missing", *dir_ / "missing.safetensors", way, false, true);
    compare_file("directory", dir_->path(), way, false, true);
  }
  // 4 files x 5 ways x 2, each with 6 conversions of each of its tensors.
  EXPECT_GT(compared() - before, 500u);
}

/// `o` without the name of the call its message starts with (each API names its own call).
Outcome unnamed(Outcome o) {
  o.message = o.message.substr(o.message.find(": ") + 1);
  return o;
}

TEST_F(ParityFiles, OutputsOverlappingWhatACallReadsAreRefusedAlike) {
  const auto path = *dir_ / "plain.safetensors";
  CFile cf;
  st_error err = ST_ERROR_INIT;
  ASSERT_EQ(st_file_open(path.c_str(), ST_BACKEND_MMAP, &cf.f, &err), ST_OK) << err.message;
  st_tensor t;
  ASSERT_EQ(st_file_info(cf.f, ST_LITERAL("f32"), &t, &err), ST_OK);
  auto xf = st::SafeOpen(path);
  auto view = xf.get_tensor("f32");
  // Into the file's own mapping: a read may not write over what it reads.
  auto mapped = std::span(const_cast<std::byte*>(view.data.data()), view.data.size());
  auto c = via_c([&](st_error* e, std::string&) {
    return st_file_read(cf.f, ST_LITERAL("f32"), const_cast<void*>(t.data), t.byte_size, e) == ST_OK;
  });
  auto cxx = via_cxx([&](std::string&) { st::nothrow::get_tensor_into(xf, "f32", mapped).throw_if_error(); });
  EXPECT_EQ(c.kind, "InvalidSlice");
  expect_same("a read into the mapping", unnamed(c), unnamed(cxx));
  // A conversion in place.
  std::string bytes(reinterpret_cast<const char*>(view.data.data()), view.data.size());
  st_tensor src = t;
  src.data = bytes.data();
  c = via_c([&](st_error* e, std::string&) {
    return st_convert(&src, ST_DTYPE_F32, bytes.data(), bytes.size(), e) == ST_OK;
  });
  st::TensorView own{st::Dtype::F32, view.shape, std::as_bytes(std::span(bytes.data(), bytes.size()))};
  cxx = via_cxx([&](std::string&) {
    st::nothrow::convert(own, st::Dtype::F32, std::as_writable_bytes(std::span(bytes.data(), bytes.size())))
        .throw_if_error();
  });
  EXPECT_EQ(c.kind, "InvalidSlice");
  expect_same("a conversion in place", unnamed(c), unnamed(cxx));
  // A buffer one byte short or long, or empty: one rule (the core's), one message, every way.
  for (std::size_t len : {t.byte_size - 1, t.byte_size + 1, std::size_t{0}}) {
    std::vector<std::byte> dst(len, std::byte{0x5A});
    c = via_c([&](st_error* e, std::string&) {
      return st_file_read(cf.f, ST_LITERAL("f32"), dst.data(), dst.size(), e) == ST_OK;
    });
    cxx = via_cxx([&](std::string&) { st::nothrow::get_tensor_into(xf, "f32", dst).throw_if_error(); });
    EXPECT_EQ(c.kind, "InvalidSlice") << len;
    EXPECT_NE(c.message.find("pass exactly " + std::to_string(t.byte_size) + " bytes"), std::string::npos)
        << c.message;
    expect_same("a read into " + std::to_string(len) + " bytes", c, cxx);
    EXPECT_TRUE(std::ranges::all_of(dst, [](std::byte b) { return b == std::byte{0x5A}; }))
        << "nothing written";
  }
  st_error_clear(&err);
}

// ---- checkpoints ----------------------------------------------------------------------------

std::string index_json(const std::map<std::string, std::string>& weight_map) {
  std::string out = R"({"metadata": {"total_size": 29, "format": "pt"}, "weight_map": {)";
  bool first = true;
  for (const auto& [name, shard] : weight_map) {
    out += (first ? "\"" : ", \"") + name + "\": \"" + shard + "\"";
    first = false;
  }
  return out + "}}";
}

/// Builds the checkpoints of the matrix in `root`, each in a directory of its own: `good` (two
/// shards), `stale` (the index lists a tensor its shard lacks), `unlisted` (a shard holds a copy
/// of a tensor the index puts in the other), `badjson`, `escape` (a shard path leaving the
/// directory), `noshard` (a shard file that does not exist).
void make_checkpoints(const fs::path& root) {
  const auto t = plain_tensors();
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  const std::map<std::string, std::string> good = {{"f32", s1}, {"u8", s1}, {"bf16", s2}, {"f4", s2}};
  for (const char* name : {"good", "stale", "unlisted", "badjson", "escape", "noshard"}) {
    fs::create_directories(root / name);
    save(root / name / s1, {t[0], t[1]}, {{"format", "pt"}});
    save(root / name / s2,
         std::string(name) == "unlisted" ? std::vector<Tensor>{t[2], t[3], t[0]}
                                         : std::vector<Tensor>{t[2], t[3]},
         {{"format", "pt"}});
  }
  const auto index = [&](const char* dir) { return root / dir / "model.safetensors.index.json"; };
  write_text(index("good"), index_json(good));
  auto stale = good;
  stale["gone"] = s1;
  write_text(index("stale"), index_json(stale));
  write_text(index("unlisted"), index_json(good));
  write_text(index("badjson"), "{\"weight_map\": [1, 2");
  auto escape = good;
  escape["f32"] = "../elsewhere.safetensors";
  write_text(index("escape"), index_json(escape));
  auto noshard = good;
  noshard["u8"] = "model-00003-of-00003.safetensors";
  write_text(index("noshard"), index_json(noshard));
}

struct CCheckpoint {
  st_checkpoint* c = nullptr;
  CCheckpoint() = default;
  CCheckpoint(const CCheckpoint&) = delete;
  CCheckpoint& operator=(const CCheckpoint&) = delete;
  ~CCheckpoint() { st_checkpoint_free(c); }
};

std::string c_shard_path(const st_checkpoint* c, std::size_t shard, st_error* err, bool& ok) {
  st_str path;
  ok = st_checkpoint_shard(c, shard, &path, nullptr, err) == ST_OK;
  return ok ? std::string(path.ptr, path.len) : "";
}

bool c_read_checkpoint(const st_checkpoint* c, st_error* err, std::string& v) {
  st_checkpoint_desc d;
  if (st_checkpoint_describe(c, &d, err) != ST_OK) return false;
  v += "tensors " + std::to_string(d.tensor_count) + " shards " + std::to_string(d.shard_count) +
       " metadata " + std::to_string(d.metadata_count) + "\n";
  std::vector<std::string> names;
  for (std::size_t i = 0; i < d.tensor_count; ++i) {
    st_str name;
    if (st_checkpoint_key(c, i, &name, err) != ST_OK) return false;
    names.emplace_back(name.ptr, name.len);
    v += names.back() + ",";
  }
  for (std::size_t i = 0; i < d.metadata_count; ++i) {
    st_str key, value;
    if (st_checkpoint_metadata(c, i, &key, &value, err) != ST_OK) return false;
    v += std::string(key.ptr, key.len) + "=" + std::string(value.ptr, value.len) + ";";
  }
  v += "\nmissing ";
  note(v, via_c([&](st_error* e, std::string& out) {
         std::size_t n = 0;
         if (st_checkpoint_missing_count(c, &n, e) != ST_OK) return false;
         for (std::size_t i = 0; i < n; ++i) {
           st_str name;
           if (st_checkpoint_missing_at(c, i, &name, nullptr, e) != ST_OK) return false;
           out += std::string(name.ptr, name.len) + ",";
         }
         return true;
       }));
  auto all = names;
  all.insert(all.end(), odd_names.begin(), odd_names.end());
  for (const auto& name : all) {
    note(v, via_c([&](st_error* e, std::string& out) {
           std::size_t shard = 0;
           bool ok = false;
           if (st_checkpoint_shard_of(c, name.data(), name.size(), &shard, e) != ST_OK) return false;
           out += c_shard_path(c, shard, e, ok);
           return ok;
         }));
    note(v, via_c([&](st_error* e, std::string& out) {
           st_tensor t;
           if (st_checkpoint_info(c, name.data(), name.size(), &t, e) != ST_OK) return false;
           out += describe(st_dtype_name(t.dtype), shape_text(std::span(t.shape, t.rank)), t.data_begin,
                           t.data_end);
           std::string bytes(t.byte_size, '\0');
           if (st_checkpoint_read(c, name.data(), name.size(), bytes.data(), bytes.size(), e) != ST_OK)
             return false;
           out += bytes;
           return true;
         }));
    for (const auto& sel : selections(1)) {
      note(v, via_c([&](st_error* e, std::string& out) {
             std::vector<st_index> indices;
             for (const auto& i : sel) indices.push_back(to_c(i));
             st_slice* s = nullptr;
             if (st_checkpoint_slice(c, name.data(), name.size(), indices.data(), indices.size(), &s, e) !=
                 ST_OK)
               return false;
             bool ok = false;
             out += c_slice_result(s, e, ok);
             st_slice_free(s);
             return ok;
           }));
    }
  }
  return true;
}

void cxx_read_checkpoint(const st::Checkpoint& c, std::string& v) {
  const auto metadata = c.metadata();
  v += "tensors " + std::to_string(c.size()) + " shards " + std::to_string(c.shard_count()) + " metadata " +
       std::to_string(metadata.size()) + "\n";
  const auto names = c.keys();
  for (const auto& name : names) v += name + ",";
  for (const auto& [key, value] : metadata) v += key + "=" + value + ";";
  v += "\nmissing ";
  note(v, via_cxx([&](std::string& out) {
         for (const auto& name : c.missing()) out += name + ",";
       }));
  auto all = names;
  all.insert(all.end(), odd_names.begin(), odd_names.end());
  for (const auto& name : all) {
    note(v, via_cxx([&](std::string& out) { out += c.shard_of(name); }));
    note(v, via_cxx([&](std::string& out) {
           auto info = c.info(name);
           out += describe(st::to_string(info.dtype), shape_text(info.shape), info.data_offsets.first,
                           info.data_offsets.second);
           auto view = c.get_tensor(name);
           out += std::string(reinterpret_cast<const char*>(view.data.data()), view.data.size());
         }));
    for (const auto& sel : selections(1)) {
      note(v, via_cxx([&](std::string& out) { out += cxx_slice_result(c.get_slice(name), sel); }));
    }
  }
}

void compare_checkpoint(const std::string& label, const fs::path& path, Way way, bool lenient) {
  const std::string what = label + " (" + way_name(way) + (lenient ? ", lenient)" : ", strict)");
  auto c = via_c([&](st_error* err, std::string& v) {
    CCheckpoint ckpt;
    const std::uint32_t flags = c_backend(way) | (lenient ? ST_OPEN_LENIENT : 0);
    return st_checkpoint_open(path.c_str(), flags, &ckpt.c, err) == ST_OK &&
           c_read_checkpoint(ckpt.c, err, v);
  });
  auto cxx = via_cxx([&](std::string& v) {
    st::Checkpoint ckpt(path, {.backend = cxx_backend(way), .lenient = lenient});
    cxx_read_checkpoint(ckpt, v);
  });
  expect_same(what, c, cxx);
}

TEST(ParityCheckpoints, StrictAndLenientReadTheSameThroughBothApis) {
  const std::size_t before = compared();
  test::TempDir dir;
  make_checkpoints(dir.path());
  save(dir / "single.safetensors", plain_tensors(), {{"format", "pt"}});
  for (Way way : {Way::Mmap, Way::Read, Way::Direct}) {
    for (bool lenient : {false, true}) {
      for (const char* name : {"good", "stale", "unlisted", "badjson", "escape", "noshard"}) {
        compare_checkpoint(name, dir / name / "model.safetensors.index.json", way, lenient);
      }
      compare_checkpoint("single file", dir / "single.safetensors", way, lenient);
      compare_checkpoint("missing index", dir / "none.safetensors.index.json", way, lenient);
    }
  }
  EXPECT_EQ(compared() - before, 3u * 2u * 8u);
}

// ---- upload plans ----------------------------------------------------------------------------

/// One request of an upload plan, in a neutral form.
struct Ask {
  std::string name;
  std::vector<Ix> select{};
  std::optional<std::size_t> shard{};
};

std::string placement_text(std::string_view name, std::string_view dtype, const std::string& shape,
                           std::uint64_t offset, std::uint64_t size) {
  return std::string(name) + " " + std::string(dtype) + shape + " @" + std::to_string(offset) + "+" +
         std::to_string(size) + ";";
}

/// The plan of `asks` (nullopt: every tensor) of a C file or checkpoint, as text.
Outcome c_upload_plan(const st_file* f, const st_checkpoint* ck, const std::optional<std::vector<Ask>>& asks,
                      std::size_t alignment) {
  return via_c([&](st_error* err, std::string& v) {
    std::vector<std::vector<st_index>> indices;
    std::vector<st_request> requests;
    if (asks) {
      for (const auto& a : *asks) {
        auto& ix = indices.emplace_back();
        for (const auto& i : a.select) ix.push_back(to_c(i));
      }
      for (std::size_t i = 0; i < asks->size(); ++i) {
        const auto& a = (*asks)[i];
        st_request r;
        std::memset(&r, 0, sizeof r);
        r.name.ptr = a.name.data();
        r.name.len = a.name.size();
        r.indices = indices[i].empty() ? nullptr : indices[i].data();
        r.index_count = indices[i].size();
        r.has_file = a.shard.has_value();
        r.file = a.shard.value_or(0);
        requests.push_back(r);
      }
    }
    const st_request* list = asks ? requests.data() : nullptr;
    // A non-NULL list of 0 requests plans nothing; an empty vector's data() may be NULL.
    static const st_request none{};
    if (asks && asks->empty()) list = &none;
    st_upload_plan* plan = nullptr;
    const int status = f ? st_upload_plan_file(f, list, requests.size(), alignment, &plan, err)
                         : st_upload_plan_checkpoint(ck, list, requests.size(), alignment, &plan, err);
    if (status != ST_OK) return false;
    std::size_t count = 0;
    std::uint64_t total = 0;
    bool ok = st_upload_plan_describe(plan, &count, &total, err) == ST_OK;
    v += "total " + std::to_string(total) + ":";
    for (std::size_t i = 0; ok && i < count; ++i) {
      st_placement pl;
      ok = st_upload_plan_placement(plan, i, &pl, err) == ST_OK;
      if (ok) {
        v += placement_text(std::string_view(pl.name.ptr, pl.name.len), st_dtype_name(pl.dtype),
                            shape_text(std::span(pl.shape, pl.rank)), pl.offset, pl.byte_size);
      }
    }
    st_upload_plan_free(plan);
    return ok;
  });
}

template <class From>
Outcome cxx_upload_plan(const From& from, const std::optional<std::vector<Ask>>& asks,
                        std::size_t alignment) {
  return via_cxx([&](std::string& v) {
    std::vector<st::Request> requests;
    if (asks) {
      for (const auto& a : *asks) {
        st::Request r{a.name};
        for (const auto& i : a.select) r.select.push_back(to_cxx(i));
        r.shard = a.shard;
        requests.push_back(std::move(r));
      }
    }
    auto [total, placements] = asks ? st::cuda::plan(from, requests, {.alignment = alignment})
                                    : st::cuda::plan(from, {}, {.alignment = alignment});
    v += "total " + std::to_string(total) + ":";
    for (const auto& p : placements) {
      v += placement_text(p.name, st::to_string(p.dtype), shape_text(p.shape), p.offset, p.byte_size);
    }
  });
}

/// The requests every source is planned with: every tensor, none, a slice, a name of no tensor,
/// shard pins (the listed shard, the shard of an unlisted copy, one past the end).
std::vector<std::optional<std::vector<Ask>>> upload_asks() {
  return {
      std::nullopt,
      std::vector<Ask>{},
      std::vector<Ask>{{"u8"}, {"f32", {Ix::range(0, 1)}}, {"bf16"}},
      std::vector<Ask>{{"no such tensor"}},
      std::vector<Ask>{{"w\xff"}},
      std::vector<Ask>{{"f32", {}, 0}},
      std::vector<Ask>{{"f32", {}, 1}},
      std::vector<Ask>{{"u8", {}, 7}},
      std::vector<Ask>{{"f32", {Ix::at(5)}}},
  };
}

// C's upload plans are the core's UploadPlan::of, as C++'s: the same placements, the same
// alignment rule (0: 256; else a power of two), the same resolution of names and shard pins.
TEST(ParityUploads, PlansOfFilesAndCheckpointsAgree) {
  const std::size_t before = compared();
  test::TempDir dir;
  make_checkpoints(dir.path());
  save(dir / "single.safetensors", plain_tensors(), {{"format", "pt"}});
  const std::vector<std::size_t> alignments = {0, 1, 3, 64, std::size_t{1} << 40};
  const auto asks = upload_asks();
  {
    st::SafeOpen xf(dir / "single.safetensors");
    st_file* cf = nullptr;
    st_error err = ST_ERROR_INIT;
    ASSERT_EQ(st_file_open((dir / "single.safetensors").c_str(), 0, &cf, &err), ST_OK);
    for (std::size_t a : alignments) {
      for (std::size_t i = 0; i < asks.size(); ++i) {
        expect_same("file, requests " + std::to_string(i) + ", alignment " + std::to_string(a),
                    c_upload_plan(cf, nullptr, asks[i], a), cxx_upload_plan(xf, asks[i], a));
      }
    }
    st_file_free(cf);
  }
  for (const char* name : {"good", "stale", "unlisted"}) {
    for (bool lenient : {false, true}) {
      const auto path = dir / name / "model.safetensors.index.json";
      st::Checkpoint xc(path, {.lenient = lenient});
      CCheckpoint cc;
      st_error err = ST_ERROR_INIT;
      ASSERT_EQ(st_checkpoint_open(path.c_str(), lenient ? ST_OPEN_LENIENT : 0, &cc.c, &err), ST_OK);
      for (std::size_t a : {std::size_t{0}, std::size_t{3}, std::size_t{64}}) {
        for (std::size_t i = 0; i < asks.size(); ++i) {
          expect_same(std::string(name) + (lenient ? " lenient" : " strict") + ", requests " +
                          std::to_string(i) + ", alignment " + std::to_string(a),
                      c_upload_plan(nullptr, cc.c, asks[i], a), cxx_upload_plan(xc, asks[i], a));
        }
      }
    }
  }
  EXPECT_EQ(compared() - before, alignments.size() * asks.size() + 3u * 2u * 3u * asks.size());
}

// ---- the hostile corpus ---------------------------------------------------------------------

TEST(ParityHostile, EveryFileOfTheCorpusGivesTheSameOutcomesEveryWay) {
  auto dir = test::fixture("hostile", "manifest.tsv");
  if (!dir) return;
  std::ifstream manifest(*dir / "manifest.tsv");
  std::size_t files = 0;
  for (std::string line; std::getline(manifest, line);) {
    const std::string file = line.substr(0, line.find('\t'));
    const fs::path path = *dir / file;
    std::error_code ec;
    const bool regular = fs::is_regular_file(path, ec);
    for (Way way : every_way) {
      if (in_memory(way) && !regular) continue;
      compare_file("hostile " + file, path, way, false, true);
    }
    compare_checkpoint("hostile " + file, path, Way::Mmap, false);
    ++files;
  }
  EXPECT_GT(files, 100u);
}

}  // namespace
}  // namespace parity
