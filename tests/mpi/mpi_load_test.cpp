// A real multi-process load on MPI: run as `mpirun -np 4 mpi_load_test DIR`. Rank 0 writes a
// sharded checkpoint into DIR; every rank plans the tensor-parallel load of every rank, runs its
// share through MpiCollective, checks its tensors against a single-process slice and reports the
// bytes it read. The program fails (on every rank) when any rank's result differs, or when the
// reads of all ranks do not cover the needed bytes exactly once.
#include <safetensors/mpi.hpp>  // first: it includes mpi.h without the C++ bindings

#include <safetensors/distributed.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/tensor_parallel.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace safetensors;
namespace fs = std::filesystem;

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 167 + seed * 31) & 0xFF);
  return v;
}

const Gqa gqa{8, 2, 2};  // 4 ranks > 2 KV heads: each KV head on two ranks

/// Two shards of two layers each, and the index.
void write_checkpoint(const fs::path& dir) {
  fs::create_directories(dir);
  std::string weight_map;
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<std::pair<std::string, std::vector<std::byte>>> data;
    std::map<std::string, TensorView> tensors;
    std::string file = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    for (int l = 2 * shard; l < 2 * shard + 2; ++l) {
      auto p = "model.layers." + std::to_string(l) + ".";
      auto add = [&](const std::string& n, Dtype d, std::vector<std::size_t> shape, std::size_t bytes) {
        data.emplace_back(p + n, pattern(bytes, static_cast<unsigned>(l * 7 + data.size())));
        tensors.emplace(p + n, TensorView{d, std::move(shape), data.back().second, {}});
        weight_map += (weight_map.empty() ? "" : ",") + std::string("\"") + p + n + "\":\"" + file + "\"";
      };
      data.reserve(8);
      add("mlp.up_proj.weight", Dtype::F32, {32, 16}, 32 * 16 * 4);
      add("mlp.down_proj.weight", Dtype::F32, {16, 32}, 16 * 32 * 4);
      add("self_attn.qkv_proj.weight", Dtype::BF16, {24, 16}, 24 * 16 * 2);
      add("input_layernorm.weight", Dtype::F16, {16}, 16 * 2);
      add("vocab.weight", Dtype::U8, {30, 3}, 30 * 3);
    }
    save_file(dir / file, tensors);
  }
  std::ofstream(dir / "model.safetensors.index.json")
      << "{\"metadata\":{},\"weight_map\":{" << weight_map << "}}";
}

struct Want {
  std::string name;
  std::function<Selection(const Slice&, std::size_t, std::size_t)> select;
};

std::vector<Want> wants(const Checkpoint& ckpt) {
  std::vector<Want> out;
  for (const auto& name : ckpt.keys()) {
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    if (has("up_proj")) {
      out.push_back(
          {name, [](const Slice& s, std::size_t r, std::size_t w) { return column_parallel(s, r, w); }});
    } else if (has("down_proj")) {
      out.push_back(
          {name, [](const Slice& s, std::size_t r, std::size_t w) { return row_parallel(s, r, w); }});
    } else if (has("qkv_proj")) {
      for (int part = 0; part < 3; ++part) {
        out.push_back({name, [part](const Slice& s, std::size_t r, std::size_t w) {
                         auto q = qkv_shard(s, gqa, r, w);
                         return part == 0 ? q.q : part == 1 ? q.k : q.v;
                       }});
      }
    } else if (has("vocab")) {  // 30 rows over 4 ranks: uneven, asked for
      out.push_back({name, [](const Slice& s, std::size_t r, std::size_t w) {
                       return shard(s, 0, r, w, Split::Uneven);
                     }});
    } else {
      out.push_back({name, [](const Slice& s, std::size_t, std::size_t) { return s.select({}); }});
    }
  }
  return out;
}

int run(const fs::path& dir) {
  MpiCollective comm;
  const std::size_t rank = comm.rank(), world = comm.size();
  if (rank == 0) write_checkpoint(dir);
  MPI_Barrier(MPI_COMM_WORLD);

  Checkpoint ckpt(dir / "model.safetensors.index.json", {Backend::Read});
  auto list = wants(ckpt);
  std::vector<std::vector<Selection>> needs(world);
  for (std::size_t r = 0; r < world; ++r) {
    for (const auto& w : list) needs[r].push_back(w.select(ckpt.get_slice(w.name), r, world));
  }
  LoadPlan plan(needs, {256});
  auto mine = plan.load(comm);

  int bad = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    auto want = needs[rank][i].read();
    if (mine[i].shape != want.shape || mine[i].data.size() != want.data.size() ||
        !std::ranges::equal(mine[i].data, want.data)) {
      std::fprintf(stderr, "rank %zu: %s differs from a single-process slice\n", rank, list[i].name.c_str());
      bad = 1;
    }
  }
  // Every rank's reads to rank 0, as (file, offset, length) triples.
  std::vector<unsigned long long> flat;
  for (const auto& r : plan.reads_here()) flat.insert(flat.end(), {r.file, r.offset, r.length});
  int count = static_cast<int>(flat.size());
  std::vector<int> counts(world), displs(world);
  MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (std::size_t r = 0; r < world; ++r) displs[r] = total, total += counts[r];
  std::vector<unsigned long long> all(static_cast<std::size_t>(total));
  MPI_Gatherv(flat.data(), count, MPI_UNSIGNED_LONG_LONG, all.data(), counts.data(), displs.data(),
              MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  unsigned long long mine_read = plan.bytes_read_here(), sum_read = 0;
  MPI_Reduce(&mine_read, &sum_read, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  std::printf("rank %zu of %zu: read %llu bytes, %zu tensors\n", rank, world, mine_read, mine.size());

  if (rank == 0) {
    // The needed bytes per file, numbered as the plan numbers files (first naming order).
    std::map<std::string, std::size_t> ids;
    std::map<std::size_t, std::vector<int>> needed, seen;
    std::size_t union_bytes = 0;
    for (std::size_t r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < list.size(); ++i) {
        auto id = ids.emplace(ckpt.shard_of(list[i].name), ids.size()).first->second;
        auto& mask = needed[id];
        for (const auto& run : needs[r][i].runs()) {
          mask.resize(std::max(mask.size(), run.offset + run.length));
          for (auto b = run.offset; b < run.offset + run.length; ++b) mask[b] = 1;
        }
      }
    }
    for (std::size_t k = 0; k + 2 < all.size(); k += 3) {
      auto& mask = seen[all[k]];
      mask.resize(std::max<std::size_t>(mask.size(), all[k + 1] + all[k + 2]));
      for (auto b = all[k + 1]; b < all[k + 1] + all[k + 2]; ++b) mask[b]++;
    }
    // Every needed byte read once, no byte twice; a byte no rank needs only in a gap of less
    // than a page between needed ones (read with them rather than skipped).
    std::size_t read_bytes = 0;
    for (auto& [file, mask] : needed) {
      auto& got = seen[file];
      got.resize(std::max(got.size(), mask.size()));
      mask.resize(got.size());
      std::size_t gap = 0;
      bool gap_read = false, needed_before = false;
      for (std::size_t b = 0; b < mask.size() && !bad; ++b) {
        union_bytes += static_cast<std::size_t>(mask[b]);
        read_bytes += static_cast<std::size_t>(got[b]);
        if (got[b] > 1 || (mask[b] && got[b] != 1)) {
          std::fprintf(stderr, "file %zu byte %zu: needed %d, read %d times\n", file, b, mask[b], got[b]);
          bad = 1;
        } else if (mask[b]) {
          if (gap_read && (!needed_before || gap >= 4096)) {
            std::fprintf(stderr, "file %zu: a gap of %zu bytes before byte %zu read\n", file, gap, b);
            bad = 1;
          }
          gap = 0;
          gap_read = false;
          needed_before = true;
        } else {
          ++gap;
          gap_read = gap_read || got[b] == 1;
        }
      }
      if (gap_read) {
        std::fprintf(stderr, "file %zu: bytes after the last needed one read\n", file);
        bad = 1;
      }
    }
    if (seen.size() != needed.size() || sum_read != read_bytes || plan.bytes_read() != read_bytes) {
      std::fprintf(stderr, "read %llu bytes across ranks; the plan reads %llu, the reads cover %zu\n",
                   sum_read, static_cast<unsigned long long>(plan.bytes_read()), read_bytes);
      bad = 1;
    }
    std::printf("all ranks: read %llu bytes (union of needs %zu); naive per-rank load would read %llu\n",
                sum_read, union_bytes, static_cast<unsigned long long>(plan.naive_bytes_read()));
  }
  int any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -np N mpi_load_test DIR\n");
  } else {
    try {
      rc = run(argv[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Finalize();
  return rc;
}
