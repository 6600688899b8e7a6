// Multi-rank loading with W threads as ranks over an in-process collective: every rank's tensors
// equal a single-process slice, and the reads of all ranks together cover the bytes the ranks need
// exactly once (with the gaps of less than a page between them). Also the tensor-parallel
// helpers, and the "no NCCL" path.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <safetensors/distributed.hpp>
#include <safetensors/nccl.hpp>
#include <safetensors/safetensors.hpp>
#include <safetensors/tensor_parallel.hpp>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "multi_rank.hpp"

namespace {

using namespace safetensors;
using test::kind_of;

using test::LocalGroup;
using test::Want;
using test::whole;

/// Runs a world of `world` threads; each opens `open()` itself (as separate processes would),
/// plans every rank's `wants`, loads its share and checks it against a single-process read.
/// Then checks that the reads of all ranks are disjoint and cover the needed bytes (and gaps of
/// less than a page between them).
template <class Open>
void run_world(std::size_t world, const std::vector<Want>& wants, Open open,
               std::function<std::string(const std::string&)> file_of = nullptr,
               std::size_t step_bytes = 64) {
  LocalGroup group(world);
  std::mutex mu;
  std::vector<PlannedRead> reads;
  std::vector<std::uint64_t> read_by(world), planned_by(world);
  std::uint64_t planned_total = 0;
  std::vector<std::exception_ptr> errors(world);
  // Needed bytes per file (file numbers as the plan assigns them: first naming order).
  std::map<std::size_t, std::vector<int>> needed;
  std::vector<std::thread> threads;
  for (std::size_t rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto src = open();
        auto needs = test::needs_of(src, wants, world);
        // By default small steps: many reads and broadcasts per tensor.
        LoadPlan plan(needs, {step_bytes});
        LocalGroup::Member me(group, rank);
        auto mine = plan.load(me);
        ASSERT_EQ(mine.size(), wants.size());
        for (std::size_t i = 0; i < mine.size(); ++i) {
          auto want = needs[rank][i].read();
          EXPECT_EQ(mine[i].shape, want.shape) << wants[i].name;
          EXPECT_EQ(mine[i].dtype, want.dtype) << wants[i].name;
          ASSERT_EQ(mine[i].data.size(), want.data.size()) << wants[i].name;
          EXPECT_TRUE(std::ranges::equal(mine[i].data, want.data))
              << "rank " << rank << " differs from a single-process slice of " << wants[i].name;
        }
        std::lock_guard lock(mu);
        for (const auto& r : plan.reads_here()) {
          EXPECT_EQ(r.reader, rank);
          reads.push_back(r);
        }
        read_by[rank] = plan.bytes_read_here();
        planned_by[rank] = plan.bytes_read_by(rank);
        planned_total = plan.bytes_read();
        if (rank == 0) {
          std::map<std::string, std::size_t> ids;
          for (std::size_t r = 0; r < world; ++r) {
            for (std::size_t i = 0; i < wants.size(); ++i) {
              auto key = file_of ? file_of(wants[i].name) : std::string();
              auto id = ids.emplace(key, ids.size()).first->second;
              auto& mask = needed[id];
              for (const auto& run : needs[r][i].runs()) {
                if (mask.size() < run.offset + run.length) mask.resize(run.offset + run.length);
                for (std::size_t b = run.offset; b < run.offset + run.length; ++b) mask[b] = 1;
              }
            }
          }
        }
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  // Every needed byte read once across ranks, no byte twice, and a byte no rank needs only in a
  // gap of less than a page between needed ones (read with them rather than skipped).
  std::map<std::size_t, std::vector<int>> seen;
  for (const auto& r : reads) {
    auto& mask = seen[r.file];
    if (mask.size() < r.offset + r.length) mask.resize(static_cast<std::size_t>(r.offset + r.length));
    for (auto b = r.offset; b < r.offset + r.length; ++b) mask[static_cast<std::size_t>(b)]++;
  }
  std::uint64_t read_bytes = 0;
  for (auto& [file, mask] : needed) {
    auto& got = seen[file];
    got.resize(std::max(got.size(), mask.size()));
    mask.resize(got.size());
    std::size_t gap = 0;
    bool gap_read = false, needed_before = false;
    for (std::size_t b = 0; b < mask.size(); ++b) {
      ASSERT_LE(got[b], 1) << "file " << file << " byte " << b << " read " << got[b] << " times";
      if (mask[b]) {
        ASSERT_EQ(got[b], 1) << "file " << file << " needed byte " << b << " not read";
        ASSERT_FALSE(gap_read && (!needed_before || gap >= 4096))
            << "file " << file << ": a gap of " << gap << " bytes before byte " << b << " read";
        gap = 0;
        gap_read = false;
        needed_before = true;
      } else {
        ++gap;
        gap_read = gap_read || got[b] == 1;
      }
    }
    ASSERT_FALSE(gap_read) << "file " << file << ": bytes after the last needed one read";
    read_bytes += static_cast<std::uint64_t>(std::accumulate(got.begin(), got.end(), 0));
  }
  EXPECT_EQ(seen.size(), needed.size());
  EXPECT_EQ(std::accumulate(read_by.begin(), read_by.end(), std::uint64_t{0}), read_bytes);
  EXPECT_EQ(planned_total, read_bytes);
  EXPECT_EQ(read_by, planned_by);
}

class Layer : public test::LayerFile {
 protected:
  [[nodiscard]] auto opener(Backend b = Backend::Read) const {
    return [p = path(), b] { return SafeOpen(p, {b}); };
  }
};

using test::layer_wants;
const Gqa& gqa = test::kLayerGqa;

TEST(Rows, ARanksOwnStepsReadTogetherLandWhereTheyBelong) {
  // Each rank's rows of six weights (steps of different lengths that it reads for itself alone)
  // read together in turns, with a shared vector read and broadcast on its own: at the default
  // step size (one turn), in turns of two or three steps, and of many 100-byte steps.
  test::TempDir dir;
  const auto path = dir / "rows.safetensors";
  test::write_rows_file(path);
  for (auto backend : {Backend::Mmap, Backend::Read}) {
    auto open = [&] { return SafeOpen(path, {backend}); };
    for (std::size_t world : {2, 4})
      run_world(world, test::rows_wants(), open, nullptr, LoadOptions{}.max_step_bytes);
    run_world(2, test::rows_wants(), open, nullptr, 4000);
    run_world(4, test::rows_wants(), open, nullptr, 100);
  }
}

TEST_F(Layer, TwoRanksSplitKvHeads) {
  run_world(2, layer_wants(), opener());
}

TEST_F(Layer, FourRanksReplicateKvHeadsAndNorm) {
  run_world(4, layer_wants(), opener(Backend::Mmap));
}

TEST_F(Layer, WorldLargerThanKvHeads) {
  // 8 ranks, 2 KV heads: ranks 0-3 share KV head 0, ranks 4-7 KV head 1 (vLLM's rule).
  run_world(8, layer_wants(), opener());
}

TEST_F(Layer, UnevenAndEmptyShares) {
  auto uneven = [](const Slice& s, std::size_t r, std::size_t w) { return shard(s, 0, r, w, Split::Uneven); };
  // 10 rows over 4 ranks (3, 3, 2, 2) and over 16 ranks (6 ranks get nothing).
  run_world(4, {{"odd", uneven}, {"norm.weight", whole}}, opener());
  run_world(16, {{"odd", uneven}}, opener());
}

TEST_F(Layer, StridedAndInterleavedSelections) {
  // Rows dealt out round-robin, every other row on every rank (the rows between are a gap read
  // with them), and one U8 column per rank: segments far smaller than a page, interleaved.
  auto dealt = [](const Slice& s, std::size_t r, std::size_t w) {
    return s.select({Index::range(static_cast<std::int64_t>(r), {}, static_cast<std::int64_t>(w))});
  };
  auto every_other = [](const Slice& s, std::size_t, std::size_t) {
    return s.select({Index::range({}, {}, 2)});
  };
  auto column = [](const Slice& s, std::size_t r, std::size_t) {
    return s.select({Index::all(), static_cast<std::int64_t>(r % 3)});
  };
  for (std::size_t world : {1, 2, 3}) {
    run_world(world, {{"row.weight", dealt}, {"col.weight", every_other}, {"odd", column}}, opener());
  }
}

TEST_F(Layer, RanksThatNeedNothing) {
  // Only rank 0 wants the tensor; the others take part and get empty selections.
  auto only_rank0 = [](const Slice& s, std::size_t r, std::size_t) {
    return r == 0 ? s.select({}) : s.select({Index::range(0, 0)});
  };
  run_world(3, {{"row.weight", only_rank0}}, opener());
}

TEST_F(Layer, TensorParallelHelpersSelectTheDocumentedRows) {
  SafeOpen f(path());
  auto col = column_parallel(f.get_slice("col.weight"), 1, 2);
  EXPECT_EQ(col.shape(), (std::vector<std::size_t>{4, 6}));
  EXPECT_EQ(col.runs(),
            (std::vector<ByteRun>{{f.info("col.weight").data_offsets.first + 4 * 6 * 4, 4 * 6 * 4}}));
  auto row = row_parallel(f.get_slice("row.weight"), 3, 4);
  EXPECT_EQ(row.shape(), (std::vector<std::size_t>{6, 2}));
  EXPECT_EQ(row.runs().size(), 6u);
  EXPECT_EQ(row_parallel(f.get_slice("norm.weight"), 1, 4).shape(), (std::vector<std::size_t>{6}));
  // Fused QKV, world 4 > 2 KV heads: rank 2 takes query heads 4-5 and KV head 1.
  auto qkv = qkv_shard(f.get_slice("attn.qkv.weight"), gqa, 2, 4);
  auto begin = f.info("attn.qkv.weight").data_offsets.first;
  const std::size_t row_bytes = 6 * 4;
  EXPECT_EQ(qkv.q.runs(), (std::vector<ByteRun>{{begin + 8 * row_bytes, 4 * row_bytes}}));
  EXPECT_EQ(qkv.k.runs(), (std::vector<ByteRun>{{begin + 18 * row_bytes, 2 * row_bytes}}));
  EXPECT_EQ(qkv.v.runs(), (std::vector<ByteRun>{{begin + 22 * row_bytes, 2 * row_bytes}}));
}

TEST_F(Layer, IndivisibleSharesAreTypedErrors) {
  SafeOpen f(path());
  EXPECT_EQ(kind_of([&] { (void)column_parallel(f.get_slice("odd"), 0, 4); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)shard(f.get_slice("odd"), 2, 0, 2); }), ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] { (void)column_parallel(f.get_slice("col.weight"), 2, 2); }),
            ErrorKind::InvalidSlice);
  // 8 query heads over 3 ranks; 8 ranks cannot replicate 3 KV heads; wrong row count.
  EXPECT_EQ(kind_of([&] { (void)qkv_shard(f.get_slice("attn.qkv.weight"), gqa, 0, 3); }),
            ErrorKind::InvalidSlice);
  EXPECT_EQ(kind_of([&] {
              (void)attention_shard(f.get_slice("col.weight"), {6, 3, 1}, Projection::K, 0, 4);
            }),
            ErrorKind::InvalidSlice);
  try {
    (void)attention_shard(f.get_slice("col.weight"), gqa, Projection::Q, 0, 2);
    ADD_FAILURE() << "a q_proj of 16 rows accepted a tensor of 8";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidSlice);
    EXPECT_NE(std::string(e.what()).find("col.weight"), std::string::npos) << e.what();
  }
  // A moved-from slice is `Internal` under every rule, as `select` says, before any rule runs.
  auto s = f.get_slice("col.weight");
  auto kept = std::move(s);
  // NOLINTNEXTLINE(bugprone-use-after-move)
  EXPECT_EQ(kind_of([&] { (void)column_parallel(s, 0, 2); }), ErrorKind::Internal);
  EXPECT_EQ(kind_of([&] { (void)qkv_shard(s, gqa, 0, 2); }), ErrorKind::Internal);
  EXPECT_EQ(column_parallel(kept, 0, 2).shape(), (std::vector<std::size_t>{4, 6}));
}

TEST_F(Layer, HeadGeometriesWhoseRowsOverflowAreRefusedAtEveryWorld) {
  // 8 heads × (2^61 + 1) wraps to 8 rows in 64-bit arithmetic: col.weight's row count. It used
  // to be accepted at world 1 (rows 0..8) and to give a negative slice bound at world 2.
  SafeOpen f(path());
  const Gqa huge{8, 2, (std::size_t{1} << 61) + 1};
  for (std::size_t world : {std::size_t{1}, std::size_t{2}}) {
    for (std::size_t rank = 0; rank < world; ++rank) {
      auto st = test::thrown(
          [&] { (void)attention_shard(f.get_slice("col.weight"), huge, Projection::Q, rank, world); });
      EXPECT_EQ(st.kind(), ErrorKind::InvalidSlice) << "world " << world;
      EXPECT_NE(st.message().find("more than fit in 64 bits"), std::string::npos) << st.message();
      EXPECT_EQ(kind_of([&] { (void)qkv_shard(f.get_slice("attn.qkv.weight"), huge, rank, world); }),
                ErrorKind::InvalidSlice);
    }
  }
}

TEST_F(Layer, SeparateProjectionsMatchTheFusedRule) {
  SafeOpen f(path());
  auto qkv = f.get_slice("attn.qkv.weight");
  for (std::size_t rank = 0; rank < 8; ++rank) {
    auto fused = qkv_shard(qkv, gqa, rank, 8);
    // k block of the fused tensor starts at row heads*head_dim = 16.
    auto k_rows = fused.k.runs()[0].offset - f.info("attn.qkv.weight").data_offsets.first;
    EXPECT_EQ(k_rows / (6 * 4), 16 + 2 * (rank / 4)) << rank;
  }
}

TEST_F(Layer, ReadAmplificationIsOneWhereNaiveReadsReplicasWTimes) {
  SafeOpen f(path());
  const std::size_t world = 4;
  std::vector<std::vector<Selection>> needs(world);
  for (std::size_t r = 0; r < world; ++r) needs[r] = {f.get_slice("norm.weight").select({})};
  LoadPlan plan(needs);
  EXPECT_EQ(plan.bytes_read(), 12u);
  EXPECT_EQ(plan.naive_bytes_read(), 4u * 12);
  EXPECT_EQ(plan.bytes_delivered(), 3u * 12);
  EXPECT_EQ(plan.bytes_broadcast(), 3u * 12);
}

TEST_F(Layer, PlanAndCollectiveOfDifferentWorldsAreRefused) {
  SafeOpen f(path());
  std::vector<std::vector<Selection>> needs(2);
  LoadPlan plan(needs);
  LocalGroup g(1);
  LocalGroup::Member me(g, 0);
  EXPECT_EQ(kind_of([&] { (void)plan.load(me); }), ErrorKind::InvalidSlice);
}

TEST(Distributed, AStridedSelectionLoadsInMemoryInProportionToItsBytes) {
  if (!test::address_space_limits_work)
    GTEST_SKIP() << "the sanitizers cannot run under an address-space limit";
  test::TempDir dir;
  const std::size_t n = std::size_t{16} << 20;
  auto path = dir / "wide.safetensors";
  test::write_bytes(
      path, test::raw_file(R"({"t":{"dtype":"U8","shape":[16777216],"data_offsets":[0,16777216]}})", n));
  // Every other byte of 16 MiB: 8 Mi one-byte runs. Planned a step and a piece per run, this
  // took 1.8 GB and aborted the process under the limit below.
  const int status = test::with_address_space(std::uint64_t{512} << 20, [&] {
    SafeOpen f(path);
    const std::vector<std::vector<Selection>> needs{
        {f.get_slice("t").select({Index::range(0, static_cast<std::int64_t>(n), 2)})}};
    LoadPlan plan(needs);
    LocalGroup group(1);
    LocalGroup::Member me(group, 0);
    auto mine = plan.load(me);
    if (mine.size() != 1 || mine[0].data.size() != n / 2) return 1;
    for (std::size_t i = 0; i < n / 2; ++i) {
      if (mine[0].data[i] != static_cast<std::byte>(2 * i % 251)) return 2;
    }
    // One read of the span: the one-byte gaps are read with the bytes around them.
    if (plan.bytes_read() != n - 1 || plan.reads_here().size() != 1) return 3;
    // One-byte steps ask for a step record per byte, more than the limit: a typed error.
    try {
      LoadPlan tiny(needs, {1});
      return 4;
    } catch (const Error& e) {
      return e.kind() == ErrorKind::Io ? 0 : 5;
    }
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::describe_status(status);
}

TEST(Distributed, ShardedPythonCheckpointOverFourRanks) {
  auto dir = test::fixture("shards", "manifest.tsv");
  if (!dir) return;
  auto index = *dir / "model.safetensors.index.json";
  Checkpoint probe(index);
  std::vector<Want> wants;
  for (const auto& name : probe.keys()) {
    if (name.find("up_proj") != std::string::npos) {
      wants.push_back(
          {name, [](const Slice& s, std::size_t r, std::size_t w) { return column_parallel(s, r, w); }});
    } else if (name.find("embed") != std::string::npos) {
      wants.push_back(
          {name, [](const Slice& s, std::size_t r, std::size_t w) { return row_parallel(s, r, w); }});
    } else {
      wants.push_back({name, whole});  // layer norms: replicated
    }
  }
  auto file_of = [&probe](const std::string& name) { return probe.shard_of(name); };
  run_world(
      4, wants, [&] { return Checkpoint(index); }, file_of);
  run_world(
      3,
      {{wants[0].name,
        [](const Slice& s, std::size_t r, std::size_t w) { return shard(s, 0, r, w, Split::Uneven); }}},
      [&] { return Checkpoint(index, {Backend::Read}); }, file_of);
}

TEST(Nccl, MissingLibraryIsACudaErrorNamingIt) {
  try {
    NcclLibrary nccl("libnccl-not-installed-here.so.2");
    ADD_FAILURE() << "loaded a library that does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Cuda);
    EXPECT_NE(std::string(e.what()).find("libnccl-not-installed-here.so.2"), std::string::npos) << e.what();
  }
}

TEST(Nccl, LibraryWithoutNcclSymbolsIsACudaError) {
  // libc loads but has no NCCL entry points.
  try {
    NcclLibrary nccl("libc.so.6");
    ADD_FAILURE() << "libc accepted as NCCL";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Cuda);
    EXPECT_NE(std::string(e.what()).find("ncclGetErrorString"), std::string::npos) << e.what();
  }
}

TEST(Nccl, TheLibraryStaysLoadedForTheProcess) {
  // NCCL's threads (proxy, watchdog) may still be exiting when the last NcclLibrary goes: the
  // library must never be unloaded under them.
  const char* stub = SAFETENSORS_TEST_STUB_NCCL;
  ASSERT_EQ(::dlopen(stub, RTLD_NOW | RTLD_NOLOAD), nullptr) << "loaded before the test";
  {
    auto nccl = std::make_shared<NcclLibrary>(stub);
    NcclCollective comm(nccl, NcclCollective::unique_id(*nccl), 0, 1);
    EXPECT_EQ(comm.size(), 1u);
  }
  void* still = ::dlopen(stub, RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(still, nullptr) << "unloaded once the last NcclLibrary was gone";
  if (still != nullptr) ::dlclose(still);  // the reference taken just above
}

TEST(Collective, HostOnlyCollectivesRefuseDeviceMemory) {
  LocalGroup g(1);
  LocalGroup::Member me(g, 0);
  EXPECT_EQ(kind_of([&] { me.broadcast_device(nullptr, 0, 0, nullptr); }), ErrorKind::Cuda);
  std::array<std::byte, 3> mine{std::byte{1}, std::byte{2}, std::byte{3}}, all{};
  me.all_gather(mine, all);
  EXPECT_EQ(all, mine);
}

}  // namespace
