// Multi-rank loading, measured: read amplification and collective traffic of the distributed
// load plan against a naive per-rank load, and the wall time of a real load on MPI.
//
//   bench_distributed split FILE DIR N          write FILE as an N-shard checkpoint in DIR
//   bench_distributed plan PATH [TP...]         plan-only table for TP 2 4 8 (no tensor reads)
//   mpirun -np W bench_distributed load PATH [naive]   one timed load on W ranks
//
// PATH is a file or a checkpoint index. The tensor-parallel layout is a Llama-style one for the
// names make_bench_files writes: embeddings and lm_head split by vocabulary rows, qkv_proj as
// fused GQA (88 query heads, 4 KV heads, head_dim 64 = 6144 rows: KV heads replicated at TP 8),
// o_proj and down_proj row-parallel, up_proj column-parallel, norms replicated. Prints a table
// and one JSON line per row.
#include <safetensors/mpi.hpp>  // first: mpi.h without the C++ bindings

#include <safetensors/distributed.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/tensor_parallel.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "checked_output.hpp"

namespace {

using namespace safetensors;
namespace fs = std::filesystem;

const Gqa gqa{88, 4, 64};

bool has(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

template <class Src>
Selection select_for(const Src& src, const std::string& name, std::size_t r, std::size_t w) {
  auto s = src.get_slice(name);
  if (has(name, "qkv_proj")) return qkv_shard(s, gqa, r, w).q;  // k and v: see needs()
  if (has(name, "o_proj") || has(name, "down_proj")) return row_parallel(s, r, w);
  if (has(name, "up_proj") || has(name, "embed") || has(name, "lm_head")) return column_parallel(s, r, w);
  return s.select({});
}

/// Every rank's selections; `names`, when given, gets the tensor name of each of rank 0's.
template <class Src>
std::vector<std::vector<Selection>> needs(const Src& src, std::size_t world,
                                          std::vector<std::string>* names = nullptr) {
  std::vector<std::vector<Selection>> out(world);
  for (std::size_t r = 0; r < world; ++r) {
    for (const auto& name : src.keys()) {
      if (has(name, "qkv_proj")) {
        auto q = qkv_shard(src.get_slice(name), gqa, r, world);
        out[r].push_back(q.q);
        out[r].push_back(q.k);
        out[r].push_back(q.v);
        if (names != nullptr && r == 0) names->insert(names->end(), {name, name, name});
      } else {
        out[r].push_back(select_for(src, name, r, world));
        if (names != nullptr && r == 0) names->push_back(name);
      }
    }
  }
  return out;
}

bool is_index(const fs::path& p) {
  return p.extension() == ".json";
}

template <class F>
auto with_source(const fs::path& p, Backend b, F f) {
  if (is_index(p)) return f(Checkpoint(p, {b}));
  return f(SafeOpen(p, {b}));
}

int split(const fs::path& file, const fs::path& dir, std::size_t n) {
  SafeOpen f(file);
  fs::create_directories(dir);
  auto keys = f.offset_keys();
  std::string map;
  for (std::size_t k = 0; k < n; ++k) {
    std::map<std::string, TensorView> part;
    auto shard = "model-" + std::to_string(k + 1) + "-of-" + std::to_string(n) + ".safetensors";
    for (std::size_t i = k * keys.size() / n; i < (k + 1) * keys.size() / n; ++i) {
      part.emplace(keys[i], f.get_tensor(keys[i]));
      map += (map.empty() ? "\"" : ",\"") + keys[i] + "\":\"" + shard + "\"";
    }
    save_file(dir / shard, part, {}, {.sync = false});
  }
  checked::write_file(dir / "model.safetensors.index.json", "{\"metadata\":{},\"weight_map\":{" + map + "}}");
  return 0;
}

int plan_table(const fs::path& path, std::vector<std::size_t> tps) {
  std::printf(
      "| TP | needed (GB) | ours: read (GB) | ours: amplification | naive: read (GB) | naive: amplification "
      "| "
      "delivered (MB) | broadcast (MB) |\n|---|---|---|---|---|---|---|---|\n");
  for (auto w : tps) {
    with_source(path, Backend::Mmap, [&](const auto& src) {
      LoadPlan plan(needs(src, w));
      double gb = 1e9, need = static_cast<double>(plan.bytes_read());
      std::printf("| %zu | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f |\n", w, need / gb, need / gb, 1.0,
                  static_cast<double>(plan.naive_bytes_read()) / gb,
                  static_cast<double>(plan.naive_bytes_read()) / need,
                  static_cast<double>(plan.bytes_delivered()) / 1e6,
                  static_cast<double>(plan.bytes_broadcast()) / 1e6);
      std::fprintf(stderr,
                   "{\"tp\":%zu,\"path\":\"%s\",\"read\":%llu,\"naive_read\":%llu,\"delivered\":%llu,"
                   "\"broadcast\":%llu}\n",
                   w, path.string().c_str(), static_cast<unsigned long long>(plan.bytes_read()),
                   static_cast<unsigned long long>(plan.naive_bytes_read()),
                   static_cast<unsigned long long>(plan.bytes_delivered()),
                   static_cast<unsigned long long>(plan.bytes_broadcast()));
      return 0;
    });
  }
  return 0;
}

int load(const fs::path& path, bool naive) {
  MpiCollective comm;
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  unsigned long long read = 0;
  std::size_t tensors = 0;
  with_source(path, Backend::Read, [&](const auto& src) {
    std::vector<std::string> names;
    auto all = needs(src, comm.size(), &names);
    if (naive) {
      // Every rank reads each tensor it needs whole, copies its slice out and drops the rest.
      std::vector<std::vector<std::byte>> mine;
      TensorView t;
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (i == 0 || names[i] != names[i - 1]) {  // q, k and v of one fused tensor: one read
          t = src.get_tensor(names[i]);
          read += t.data.size();
        }
        const std::size_t begin = src.info(names[i]).data_offsets.first;
        auto& out = mine.emplace_back();
        for (const auto& run : all[comm.rank()][i].runs()) {
          auto from = t.data.subspan(run.offset - begin, run.length);
          out.insert(out.end(), from.begin(), from.end());
        }
      }
      tensors = mine.size();
    } else {
      LoadPlan plan(all);
      auto mine = plan.load(comm);
      read = plan.bytes_read_here();
      tensors = mine.size();
    }
    return 0;
  });
  MPI_Barrier(MPI_COMM_WORLD);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsigned long long total = 0;
  MPI_Reduce(&read, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (comm.rank() == 0) {
    std::printf(
        "{\"mode\":\"%s\",\"world\":%zu,\"seconds\":%.2f,\"bytes_read\":%llu,\"tensors_per_rank\":%zu}\n",
        naive ? "naive" : "plan", comm.size(), s, total, tensors);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 2;
  try {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "split" && argc == 5) {
      rc = split(argv[2], argv[3], std::stoul(argv[4]));
    } else if (cmd == "plan" && argc >= 3) {
      std::vector<std::size_t> tps;
      for (int i = 3; i < argc; ++i) tps.push_back(std::stoul(argv[i]));
      if (tps.empty()) tps = {2, 4, 8};
      rc = plan_table(argv[2], tps);
    } else if (cmd == "load" && argc >= 3) {
      rc = load(argv[2], argc > 3 && std::string(argv[3]) == "naive");
    } else {
      std::fprintf(stderr,
                   "usage: bench_distributed split FILE DIR N | plan PATH [TP...] | load PATH [naive]\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    rc = 1;
  }
  if (!checked::stdout_arrived("bench_distributed")) rc = 1;
  MPI_Finalize();
  return rc;
}
