// Generates the benchmark files with the library's own writer, into a cache folder, on demand.
//
//   make_bench_files DIR [gpt2] [1b] [20k] [moe]      (no names: gpt2, 20k and moe)
//
//   gpt2.safetensors      gpt2's 160 tensors with their real names and shapes, F32, metadata
//                         {"format": "pt"}: 548,105,232 bytes, like the published checkpoint.
//   1b-mixed.safetensors  ~1.2 B parameters, F32 with BF16 MLP down-projections: ~4.7 GB.
//   20k.safetensors       20,000 small tensors: a header of ~2 MB, for parse-bound work.
//   moe-deepseek-v3/      a checkpoint shaped as DeepSeek-V3's (the mixture-of-experts models
//                         engines serve): its 90,427 tensor names and dtypes (fp8 E4M3 weights
//                         with F32 block scales, BF16 norms and gates), 163 shards split in
//                         file order as the real model's are, and its index
//                         (model.safetensors.index.json, names sorted as Hugging Face writes
//                         them: ~8.7 MB); small dimensions (fp8 weights of 32 x 48: ~136 MB
//                         of data), for index- and lookup-bound work.
//
// Existing files of the right size are kept. Data is a fixed pseudo-random stream, so the files
// are the same on every machine.
#include <safetensors/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checked_output.hpp"

namespace {

struct Spec {
  std::string name;
  safetensors::Dtype dtype;
  std::vector<std::size_t> shape;
};

std::vector<Spec> gpt2() {
  using safetensors::Dtype;
  std::vector<Spec> t = {{"wte.weight", Dtype::F32, {50257, 768}},
                         {"wpe.weight", Dtype::F32, {1024, 768}},
                         {"ln_f.weight", Dtype::F32, {768}},
                         {"ln_f.bias", Dtype::F32, {768}}};
  const std::vector<std::pair<std::string, std::vector<std::size_t>>> layer = {
      {"ln_1.weight", {768}},
      {"ln_1.bias", {768}},
      {"attn.bias", {1, 1, 1024, 1024}},
      {"attn.c_attn.weight", {768, 2304}},
      {"attn.c_attn.bias", {2304}},
      {"attn.c_proj.weight", {768, 768}},
      {"attn.c_proj.bias", {768}},
      {"ln_2.weight", {768}},
      {"ln_2.bias", {768}},
      {"mlp.c_fc.weight", {768, 3072}},
      {"mlp.c_fc.bias", {3072}},
      {"mlp.c_proj.weight", {3072, 768}},
      {"mlp.c_proj.bias", {768}}};
  for (int l = 0; l < 12; ++l) {
    for (const auto& [name, shape] : layer)
      t.push_back({"h." + std::to_string(l) + "." + name, Dtype::F32, shape});
  }
  return t;
}

/// A ~1.2 B-parameter transformer: 25 layers of width 2048, F32 except the BF16 MLP
/// down-projections, plus F32 embeddings and head.
std::vector<Spec> one_b() {
  using safetensors::Dtype;
  std::vector<Spec> t = {{"model.embed_tokens.weight", Dtype::F32, {32000, 2048}},
                         {"lm_head.weight", Dtype::F32, {32000, 2048}},
                         {"model.norm.weight", Dtype::F32, {2048}}};
  for (int l = 0; l < 25; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "self_attn.qkv_proj.weight", Dtype::F32, {6144, 2048}});
    t.push_back({p + "self_attn.o_proj.weight", Dtype::F32, {2048, 2048}});
    t.push_back({p + "mlp.up_proj.weight", Dtype::F32, {8192, 2048}});
    t.push_back({p + "mlp.down_proj.weight", Dtype::BF16, {2048, 8192}});
    t.push_back({p + "input_layernorm.weight", Dtype::F32, {2048}});
    t.push_back({p + "post_attention_layernorm.weight", Dtype::F32, {2048}});
  }
  return t;
}

/// 20,000 small tensors with the long names of a mixture-of-experts model (F16 and F32, types
/// NumPy has, so that bench.py can load the same file).
std::vector<Spec> many() {
  using safetensors::Dtype;
  std::vector<Spec> t;
  const char* proj[] = {"gate_proj", "up_proj", "down_proj", "w_scale"};
  for (int i = 0; i < 20000; ++i) {
    int layer = i / 400, expert = (i / 4) % 100;
    t.push_back({"model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + "." +
                     proj[i % 4] + ".weight",
                 i % 4 == 3 ? Dtype::F32 : Dtype::F16,
                 {4, 8}});
  }
  return t;
}

/// DeepSeek-V3's tensors in file order: 3 dense layers, then 58 layers of 256 routed experts and
/// a shared one (each projection an fp8 weight and its F32 block scale), embeddings, norm and
/// head: 90,427 tensors, dimensions small.
std::vector<Spec> moe() {
  using safetensors::Dtype;
  std::vector<Spec> t = {{"model.embed_tokens.weight", Dtype::BF16, {8, 4}}};
  auto linear = [&](const std::string& p) {
    t.push_back({p + ".weight", Dtype::F8_E4M3, {32, 48}});
    t.push_back({p + ".weight_scale_inv", Dtype::F32, {1, 1}});
  };
  for (int l = 0; l < 61; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", Dtype::BF16, {8}});
    t.push_back({p + "post_attention_layernorm.weight", Dtype::BF16, {8}});
    for (const char* a : {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"})
      linear(p + "self_attn." + a);
    t.push_back({p + "self_attn.q_a_layernorm.weight", Dtype::BF16, {8}});
    t.push_back({p + "self_attn.kv_a_layernorm.weight", Dtype::BF16, {8}});
    const char* mlp[] = {"gate_proj", "up_proj", "down_proj"};
    if (l < 3) {
      for (const char* m : mlp) linear(p + "mlp." + m);
      continue;
    }
    t.push_back({p + "mlp.gate.weight", Dtype::BF16, {8, 8}});
    t.push_back({p + "mlp.gate.e_score_correction_bias", Dtype::F32, {8}});
    for (const char* m : mlp) linear(p + "mlp.shared_experts." + m);
    for (int e = 0; e < 256; ++e)
      for (const char* m : mlp) linear(p + "mlp.experts." + std::to_string(e) + "." + m);
  }
  t.push_back({"model.norm.weight", Dtype::BF16, {8}});
  t.push_back({"lm_head.weight", Dtype::BF16, {8, 4}});
  return t;
}

/// A deterministic pseudo-random byte stream (xorshift64*), written 8 bytes at a time.
void fill(std::vector<std::byte>& out, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    std::uint64_t v = x * 0x2545F4914F6CDD1Dull;
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(i);
}

/// Whether `path` already holds exactly these tensors.
bool present(const std::filesystem::path& path, const std::vector<Spec>& specs) {
  try {
    safetensors::SafeOpen f(path, {safetensors::Backend::Read});
    if (f.size() != specs.size()) return false;
    for (const auto& s : specs) {
      auto info = f.info(s.name);
      if (info.dtype != s.dtype || info.shape != s.shape) return false;
    }
    return true;
  } catch (const safetensors::Error&) {
    return false;
  }
}

/// The tensors of `specs[first, last)` with pseudo-random bytes (seeded by position), and the
/// storage their views point into.
struct Tensors {
  std::vector<std::vector<std::byte>> storage;
  std::vector<std::pair<std::string, safetensors::TensorView>> views;
  std::size_t bytes = 0;
};

Tensors tensors_of(const std::vector<Spec>& specs, std::size_t first, std::size_t last) {
  Tensors out;
  out.storage.reserve(last - first);
  for (std::size_t i = first; i < last; ++i) {
    const auto& s = specs[i];
    std::size_t numel = 1;
    for (auto d : s.shape) numel *= d;
    auto& bytes = out.storage.emplace_back(numel * safetensors::bit_size(s.dtype) / 8);
    fill(bytes, i + 1);
    out.bytes += bytes.size();
    out.views.emplace_back(s.name, safetensors::TensorView{s.dtype, s.shape, bytes, {}});
  }
  return out;
}

/// Whether `index` already opens as a checkpoint of exactly these tensors.
bool present_checkpoint(const std::filesystem::path& index, const std::vector<Spec>& specs) {
  try {
    safetensors::Checkpoint c(index);
    if (c.size() != specs.size()) return false;
    for (const auto& s : specs) {
      auto info = c.info(s.name);
      if (info.dtype != s.dtype || info.shape != s.shape) return false;
    }
    return true;
  } catch (const safetensors::Error&) {
    return false;
  }
}

/// JSON text of a string made of printable ASCII (every name here is).
std::string quoted(const std::string& s) {
  return "\"" + s + "\"";
}

/// A checkpoint of `specs` in `dir`: `shards` files cut in file order as a model's release cuts
/// them (shard k holds tensors [k n / shards, (k + 1) n / shards)), named as Hugging Face names
/// them, and the index, names sorted, written as `save_torch_state_dict` writes it.
void make_checkpoint(const std::filesystem::path& dir, const std::vector<Spec>& specs, std::size_t shards) {
  const auto index = dir / "model.safetensors.index.json";
  if (present_checkpoint(index, specs)) {
    std::printf("%s: present\n", index.c_str());
    return;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::map<std::string, std::string> weight_map;
  std::size_t total = 0;
  char name[64];
  for (std::size_t k = 0; k < shards; ++k) {
    const std::size_t first = k * specs.size() / shards, last = (k + 1) * specs.size() / shards;
    std::snprintf(name, sizeof name, "model-%05zu-of-%06zu.safetensors", k + 1, shards);
    auto t = tensors_of(specs, first, last);
    safetensors::save_file(dir / name, t.views, {{"format", "pt"}});
    total += t.bytes;
    for (std::size_t i = first; i < last; ++i) weight_map.emplace(specs[i].name, name);
  }
  std::string text =
      "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total) + "\n  },\n  \"weight_map\": {\n";
  bool first = true;
  for (const auto& [tensor, shard] : weight_map) {
    text += (first ? "    " : ",\n    ") + quoted(tensor) + ": " + quoted(shard);
    first = false;
  }
  text += "\n  }\n}\n";
  checked::OutputFile out(index);
  out.write(text);
  out.close();
  std::printf("%s: %zu tensors in %zu shards, index %zu bytes\n", index.c_str(), specs.size(), shards,
              text.size());
}

void make(const std::filesystem::path& path, const std::vector<Spec>& specs) {
  if (present(path, specs)) {
    std::printf("%s: present\n", path.c_str());
    return;
  }
  auto t = tensors_of(specs, 0, specs.size());
  safetensors::save_file(path, t.views, {{"format", "pt"}});
  std::printf("%s: %ju bytes, %zu tensors\n", path.c_str(),
              static_cast<std::uintmax_t>(std::filesystem::file_size(path)), specs.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fputs("usage: make_bench_files DIR [gpt2] [1b] [20k] [moe]   (default: gpt2 20k moe)\n",
               argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : (checked::stdout_arrived("make_bench_files") ? 0 : 1);
  }
  std::filesystem::path dir = argv[1];
  std::set<std::string> which(argv + 2, argv + argc);
  if (which.empty()) which = {"gpt2", "20k", "moe"};
  try {
    std::filesystem::create_directories(dir);
    if (which.count("gpt2")) make(dir / "gpt2.safetensors", gpt2());
    if (which.count("20k")) make(dir / "20k.safetensors", many());
    if (which.count("1b")) make(dir / "1b-mixed.safetensors", one_b());
    // DeepSeek-V3/R1 ship 163 shards.
    if (which.count("moe")) make_checkpoint(dir / "moe-deepseek-v3", moe(), 163);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_bench_files: %s\n", e.what());
    return 1;
  }
  return checked::stdout_arrived("make_bench_files") ? 0 : 1;
}
