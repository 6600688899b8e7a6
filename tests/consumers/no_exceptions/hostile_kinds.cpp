// Every file of the hostile corpus (and a few careless calls) through the library, printing one
// line per file and way of opening it: `OK` or the error's kind. Built twice by this consumer
// project: with -fno-exceptions -fno-rtti it uses the nothrow API; built the ordinary way it
// uses the throwing API and catches `safetensors::Error`. check.cmake compares the two outputs.
#include <safetensors/cuda.hpp>
#include <safetensors/safetensors.hpp>

#include <complex>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace st = safetensors;

namespace {

/// The bytes of a regular file (nothing for a directory, a FIFO or a missing file: the "memory"
/// way of opening covers what a caller can hold in memory).
std::optional<std::vector<char>> file_bytes(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

#if defined(__cpp_exceptions)
constexpr const char* api = "throwing";

/// "OK", or the kind of the error `body` throws.
template <class F>
std::string outcome(F&& body) {
  try {
    body();
    return "OK";
  } catch (const st::Error& e) {
    return std::string(st::to_string(e.kind()));
  }
}

/// Opens `path` as `how` says and reads every tensor, whole and as a slice.
std::string read_all(const std::filesystem::path& path, const std::string& how) {
  return outcome([&] {
    auto read = [](const st::SafeOpen& f) {
      for (const auto& name : f.keys()) {
        auto info = f.info(name);
        auto view = f.get_tensor(name);
        if (view.data.size() != info.byte_size()) throw st::Error(st::ErrorKind::Internal, "size");
        auto part = f.get_slice(name).select({}).read();
        if (part.data.size() != view.data.size()) throw st::Error(st::ErrorKind::Internal, "slice");
        (void)view.as<std::byte>();
      }
    };
    if (how == "memory") {
      if (auto bytes = file_bytes(path))
        read(st::SafeOpen::from_bytes_copy(std::as_bytes(std::span(*bytes))));
    } else if (how == "checkpoint") {
      st::Checkpoint c(path);
      for (const auto& name : c.keys()) (void)c.get_tensor(name);
    } else {
      read(st::SafeOpen(path, {how == "read"     ? st::Backend::Read
                               : how == "direct" ? st::Backend::Direct
                                                 : st::Backend::Mmap}));
    }
  });
}

std::string careless(const std::filesystem::path& file, const std::string& what) {
  return outcome([&] {
    st::SafeOpen f(file);
    if (what == "missing-tensor") (void)f.get_tensor("no such tensor");
    if (what == "wrong-type") {
      auto v = f.get_tensor(f.keys().at(0));
      (void)v.as<std::complex<float>>();
    }
    if (what == "bad-slice") (void)f.get_slice(f.keys().at(0)).select({1000000});
    if (what == "moved-from") {
      st::SafeOpen g = std::move(f);
      (void)f.keys();  // NOLINT: use after move, on purpose
    }
    if (what == "bad-write") {
      st::save_file(file.parent_path() / "no such dir" / "x.safetensors",
                    {{"w", f.get_tensor(f.keys().at(0))}});
    }
    if (what == "cuda") (void)st::cuda::load(f, 0);
  });
}
#else
constexpr const char* api = "nothrow";

std::string kind(const st::Status& s) {
  return s.ok() ? "OK" : std::string(st::to_string(s.kind()));
}

/// Reads every tensor of an open file, whole and as a slice.
st::Status read(const st::SafeOpen& f) {
  auto keys = st::nothrow::keys(f);
  if (!keys) return keys.status();
  for (const auto& name : *keys) {
    auto info = st::nothrow::info(f, name);
    if (!info) return info.status();
    auto view = st::nothrow::get_tensor(f, name);
    if (!view) return view.status();
    if (view->data.size() != info->byte_size()) return st::Status(st::ErrorKind::Internal, "size");
    auto slice = st::nothrow::get_slice(f, name);
    if (!slice) return slice.status();
    auto all = st::nothrow::select(*slice, {});
    if (!all) return all.status();
    auto part = st::nothrow::read(*all);
    if (!part) return part.status();
    if (part->data.size() != view->data.size()) return st::Status(st::ErrorKind::Internal, "slice");
    if (auto bytes = st::nothrow::as<std::byte>(*view); !bytes) return bytes.status();
  }
  return {};
}

std::string read_all(const std::filesystem::path& path, const std::string& how) {
  if (how == "memory") {
    auto bytes = file_bytes(path);
    if (!bytes) return "OK";
    auto f = st::nothrow::from_bytes_copy(std::as_bytes(std::span(*bytes)));
    return kind(f ? read(*f) : f.status());
  }
  if (how == "checkpoint") {
    auto c = st::nothrow::open_checkpoint(path);
    if (!c) return kind(c.status());
    auto keys = st::nothrow::keys(*c);
    if (!keys) return kind(keys.status());
    for (const auto& name : *keys) {
      if (auto v = st::nothrow::get_tensor(*c, name); !v) return kind(v.status());
    }
    return "OK";
  }
  auto backend = how == "read"     ? st::Backend::Read
                 : how == "direct" ? st::Backend::Direct
                                   : st::Backend::Mmap;
  auto f = st::nothrow::open(path, {backend});
  return kind(f ? read(*f) : f.status());
}

std::string careless(const std::filesystem::path& file, const std::string& what) {
  auto f = st::nothrow::open(file);
  if (!f) return kind(f.status());
  auto first = st::nothrow::keys(*f)->at(0);
  if (what == "missing-tensor") return kind(st::nothrow::get_tensor(*f, "no such tensor").status());
  if (what == "wrong-type") {
    auto v = st::nothrow::get_tensor(*f, first);
    return kind(st::nothrow::as<std::complex<float>>(*v).status());
  }
  if (what == "bad-slice") {
    auto s = st::nothrow::get_slice(*f, first);
    return kind(st::nothrow::select(*s, {1000000}).status());
  }
  if (what == "moved-from") {
    st::SafeOpen g = std::move(*f);
    return kind(st::nothrow::keys(*f).status());  // NOLINT: use after move, on purpose
  }
  if (what == "bad-write") {
    auto v = st::nothrow::get_tensor(*f, first);
    return kind(st::nothrow::save_file(file.parent_path() / "no such dir" / "x.safetensors", {{"w", *v}}));
  }
  if (what == "cuda") return kind(st::nothrow::cuda::load(*f, 0).status());
  return "OK";
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (with manifest.tsv)\n", argv[0]);
    return 2;
  }
  std::filesystem::path dir = argv[1];
  std::ifstream manifest(dir / "manifest.tsv");
  std::size_t files = 0;
  for (std::string line; std::getline(manifest, line);) {
    std::string file = line.substr(0, line.find('\t'));
    for (const char* how : {"mmap", "read", "direct", "memory", "checkpoint"}) {
      std::printf("%s\t%s\t%s\n", file.c_str(), how, read_all(dir / file, how).c_str());
    }
    ++files;
  }
  // A small file of our own for the careless calls, written through the API under test.
  auto own = std::filesystem::temp_directory_path() / ("safetensors-no-exceptions-" + std::string(api));
  std::filesystem::create_directories(own);
  const float values[4] = {1, 2, 3, 4};
  st::TensorView w{st::Dtype::F32, {2, 2}, std::as_bytes(std::span(values))};
#if defined(__cpp_exceptions)
  st::save_file(own / "w.safetensors", {{"w", w}});
#else
  if (auto saved = st::nothrow::save_file(own / "w.safetensors", {{"w", w}}); !saved.ok()) {
    std::fprintf(stderr, "%s\n", saved.message().c_str());
    return 1;
  }
#endif
  for (const char* what : {"missing-tensor", "wrong-type", "bad-slice", "moved-from", "bad-write", "cuda"}) {
    std::printf("careless\t%s\t%s\n", what, careless(own / "w.safetensors", what).c_str());
  }
  std::filesystem::remove_all(own);
  std::fprintf(stderr, "%s API: %zu corpus files\n", api, files);
  return files > 100 ? 0 : 1;
}
