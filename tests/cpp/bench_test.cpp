// The benchmark programs, bench_cpp and bench.py, run as programs: the seed README's form
// `MODEL ITERATIONS` prints the time per iteration of each load, and a bad argument or a missing
// file is a usage message with exit code 2 (never a traceback, or an error about a file named
// like the number), a file that is not safetensors exit code 1. The same cases for both. And a
// smoke run of bench_memory.
#include <safetensors/safetensors.hpp>

#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "program.hpp"

#if !defined(SAFETENSORS_BENCH_CPP) || !defined(SAFETENSORS_BENCH_PY) ||    \
    !defined(SAFETENSORS_TEST_PYTHON) || !defined(SAFETENSORS_REPORT_PY) || \
    !defined(SAFETENSORS_MAKE_BENCH_FILES) || !defined(SAFETENSORS_BENCH_MEMORY)
#error \
    "SAFETENSORS_BENCH_CPP, _BENCH_PY, _REPORT_PY, _MAKE_BENCH_FILES, _BENCH_MEMORY and _TEST_PYTHON must name the programs"
#endif

namespace {

using safetensors::Dtype;
using safetensors::TensorView;
using test::has;

struct Program {
  const char* name;
  std::vector<std::string> command;
};

void PrintTo(const Program& p, std::ostream* os) {
  *os << p.name;
}

const Program kBenchCpp{"bench_cpp", {SAFETENSORS_BENCH_CPP}};
const Program kBenchPy{"bench.py", {SAFETENSORS_TEST_PYTHON, SAFETENSORS_BENCH_PY}};

class Bench : public ::testing::TestWithParam<Program> {
 protected:
  void SetUp() override {
    std::array<float, 6> w{1, 2, 3, 4, 5, 6};
    safetensors::save_file(model_, {{"w", TensorView{Dtype::F32, {2, 3}, std::as_bytes(std::span(w)), {}}}});
    test::write_bytes(bad_, test::raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3));
  }

  test::Run bench(const std::vector<std::string>& args) const {
    auto command = GetParam().command;
    command.insert(command.end(), args.begin(), args.end());
    return test::run(command);
  }

  /// Whether the program can measure here: bench.py needs NumPy and safetensors in the test
  /// Python (its argument checks do not). Their absence is a failure under
  /// SAFETENSORS_REQUIRE_PYTHON=1, as for every Python test.
  [[nodiscard]] bool can_measure() const {
    if (std::string(GetParam().name) == "bench_cpp") return true;
    if (test::run({SAFETENSORS_TEST_PYTHON, "-c", "import numpy, safetensors"}).code == 0) return true;
    const char* require = std::getenv("SAFETENSORS_REQUIRE_PYTHON");
    if (require && std::string_view(require) == "1")
      ADD_FAILURE() << "no NumPy and safetensors in the test Python";
    return false;
  }

  test::TempDir dir_;
  std::filesystem::path model_ = dir_ / "model.safetensors", bad_ = dir_ / "bad.safetensors";
};

TEST_P(Bench, ACheckpointIndexGetsTheCheckpointItemsNamedByItsDirectory) {
  if (!can_measure()) GTEST_SKIP() << "no NumPy and safetensors in " << SAFETENSORS_TEST_PYTHON;
  // Two shards and their index, in a directory named as the report will name them.
  auto folder = dir_ / "tiny-moe";
  std::filesystem::create_directories(folder);
  std::array<float, 8> a{1, 2, 3, 4, 5, 6, 7, 8};
  std::array<float, 2> b{9, 10};
  safetensors::save_file(
      folder / "s1.safetensors",
      {{"layers.0.mlp.experts.1.w", TensorView{Dtype::F32, {8, 1}, std::as_bytes(std::span(a)), {}}}});
  safetensors::save_file(folder / "s2.safetensors",
                         {{"norm", TensorView{Dtype::F32, {2}, std::as_bytes(std::span(b)), {}}}});
  std::ofstream(folder / "model.safetensors.index.json")
      << R"({"metadata":{"total_size":40},"weight_map":{"layers.0.mlp.experts.1.w":"s1.safetensors","norm":"s2.safetensors"}})";
  auto json = dir_ / "ckpt.json";
  auto r =
      bench({"--runs", "2", "--json", json.string(), (folder / "model.safetensors.index.json").string()});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::ifstream in(json);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(has(text, R"("name":"tiny-moe")") || has(text, R"("name": "tiny-moe")")) << text;
  EXPECT_TRUE(has(text, R"("tensors":2)") || has(text, R"("tensors": 2)")) << text;
  EXPECT_TRUE(has(text, R"("item":"open")") || has(text, R"("item": "open")")) << text;
  if (std::string(GetParam().name) == "bench_cpp") {
    // Every byte by range-for beside one read() of every shard; and the plans.
    for (const char* item : {"load", "read()", "plan_ep", "plan_tp", "plan_upload"})
      EXPECT_TRUE(has(text, std::string(R"("item":")") + item + "\"")) << item << ": " << text;
    EXPECT_TRUE(has(r.out, "tiny-moe (checkpoint: 2 tensors in 2 shards")) << r.out;
  }
}

TEST_P(Bench, ModelIterationsPrintsTheTimePerIterationOfEachLoad) {
  if (!can_measure()) GTEST_SKIP() << "no NumPy and safetensors in " << SAFETENSORS_TEST_PYTHON;
  auto json = dir_ / "out.json";
  auto r = bench({model_.string(), "3", "--json", json.string()});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "model.safetensors (") && has(r.out, "3 iterations): time per iteration")) << r.out;
  for (const char* item : {"  open ", "  load ", "  load_copy "})
    EXPECT_TRUE(has(r.out, item)) << item << r.out;
  auto report = test::read_bytes(json);
  std::string text(report.begin(), report.end());
  EXPECT_TRUE(has(text, R"("iterations": 3)") || has(text, R"("iterations":3)")) << text;
  EXPECT_TRUE(has(text, "per_iteration_s")) << text;
}

TEST_P(Bench, TheNumberAfterTheModelIsNeverAFileName) {
  auto r = bench({(dir_ / "missing.safetensors").string(), "10"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "usage:") && has(r.err, "missing.safetensors")) << r.err;
  EXPECT_FALSE(has(r.err, "'10'")) << r.err;
  EXPECT_FALSE(has(r.err, "Traceback")) << r.err;
}

TEST_P(Bench, BadArgumentsAreUsageErrors) {
  const std::string m = model_.string();
  for (const auto& args : std::vector<std::vector<std::string>>{{},
                                                                {"--runs", "abc", m},
                                                                {"--runs", "0", m},
                                                                {"--runs"},
                                                                {m, "0"},
                                                                {m, "10", "20"},
                                                                {m, "10", "--runs", "3"},
                                                                {"10"},
                                                                {"--items", "bogus", m},
                                                                {"--cold", "--items", "bogus", m},
                                                                {"--items", "slice", m, "5"},
                                                                {"--frobnicate", m}}) {
    auto r = bench(args);
    std::string line;
    for (const auto& a : args) line += a + " ";
    EXPECT_EQ(r.code, 2) << GetParam().name << " " << line << "\n" << r.out << r.err;
    EXPECT_TRUE(has(r.err, "usage:")) << line << r.err;
    EXPECT_FALSE(has(r.err, "Traceback")) << line << r.err;
  }
}

TEST_P(Bench, AFileThatIsNotSafetensorsIsAnError) {
  if (!can_measure()) GTEST_SKIP() << "no NumPy and safetensors in " << SAFETENSORS_TEST_PYTHON;
  for (const auto& args :
       std::vector<std::vector<std::string>>{{bad_.string(), "2"}, {"--runs", "1", bad_.string()}}) {
    auto r = bench(args);
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_TRUE(has(r.err, "bad.safetensors")) << r.err;
    EXPECT_FALSE(has(r.err, "Traceback")) << r.err;
  }
}

// --cold drops the machine's page cache before every run: without the permission to, a message
// that says so and exit code 1, before any work. As root, the program runs as `nobody`
// (setpriv) instead of dropping the caches of the machine the tests run on.
TEST_P(Bench, ColdWithoutPermissionToDropThePageCacheSaysSoAndExits1) {
  if (!can_measure()) GTEST_SKIP() << "no NumPy and safetensors in " << SAFETENSORS_TEST_PYTHON;
  std::vector<std::string> command;
  if (::geteuid() == 0) {
    if (test::run({"setpriv", "--version"}).code != 0)
      GTEST_SKIP() << "root, and no setpriv to run as nobody";
    command = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  }
  command.insert(command.end(), GetParam().command.begin(), GetParam().command.end());
  for (const char* a : {"--cold", "--runs", "1"}) command.emplace_back(a);
  command.push_back(model_.string());
  auto r = test::run(command);
  // As nobody, a checkout under a private directory (mktemp -d makes one) cannot even be read:
  // the program never starts, which is not what this test checks.
  if (::geteuid() == 0 && r.code != 1 && has(r.err, "Permission denied"))
    GTEST_SKIP() << "nobody cannot read the program or its files here: " << r.err;
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "needs root") && has(r.err, "drop_caches")) << r.err;
  EXPECT_FALSE(has(r.out, "model.safetensors (")) << "no work before the check: " << r.out;
  EXPECT_FALSE(has(r.err, "Traceback")) << r.err;
}

// Every output is checked: a --json path in a missing folder fails before any measurement, and
// /dev/full as the --json file or as standard output is an error with exit code 1, not 0 with
// nothing written.
TEST_P(Bench, AnOutputThatCannotBeWrittenIsAnErrorWithExitCode1) {
  if (!can_measure()) GTEST_SKIP() << "no NumPy and safetensors in " << SAFETENSORS_TEST_PYTHON;
  auto missing = dir_ / "no-such-folder" / "out.json";
  auto r = bench({"--runs", "1", "--json", missing.string(), model_.string()});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "cannot create " + missing.string() + ": No such file or directory")) << r.err;
  EXPECT_FALSE(has(r.out, "model.safetensors (")) << "no work before the check: " << r.out;
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  auto full = bench({"--runs", "1", "--json", "/dev/full", model_.string()});
  EXPECT_EQ(full.code, 1) << full.out << full.err;
  EXPECT_TRUE(has(full.err, "cannot write /dev/full: No space left on device")) << full.err;
  // Standard output, through the shell (test::run captures it into a file).
  std::string command;
  for (const auto& a : GetParam().command) command += test::quote(a) + " ";
  command +=
      "--runs 1 " + test::quote(model_.string()) + " >/dev/full 2>" + test::quote((dir_ / "err").string());
  int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  auto err = test::read_bytes(dir_ / "err");
  std::string text(err.begin(), err.end());
  EXPECT_TRUE(has(text, "cannot write to standard output: No space left on device")) << text;
  EXPECT_FALSE(has(text, "Traceback")) << text;
}

TEST_P(Bench, HelpIsExitCode0) {
  auto r = bench({"--help"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "ITERATIONS")) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Programs, Bench, ::testing::Values(kBenchCpp, kBenchPy),
                         [](const ::testing::TestParamInfo<Program>& p) {
                           return std::string(p.param.name) == "bench_cpp" ? "bench_cpp" : "bench_py";
                         });

}  // namespace

// report.py's last lines judge the goals: met lines say nothing, a goal below its line is
// missed, and one above it with fewer rounds than a judgement needs (the --quick run has one) is
// said to be not judged, never "missed".
TEST(BenchOutputs, AGoalWithTooFewRoundsIsNotJudgedRatherThanMissed) {
  test::TempDir dir;
  // gpt2's save against its limit: 1.03x in each round given; its load_copy 0.5x.
  auto round = [&](int r) {
    const auto path = dir / ("round" + std::to_string(r) + "-cpp.json");
    std::ofstream(path) << R"j({"tool":"bench_cpp","cache":"warm","machine":"m","date":"d","files":[)j"
                        << R"j({"name":"gpt2.safetensors","bytes":548105232,"tensors":160,"items":[)j"
                        << R"j({"item":"save","median_s":1.0},{"item":"load_copy","median_s":2.0}],)j"
                        << R"j("limits":[{"item":"write()+fsync","median_s":1.03},)j"
                        << R"j({"item":"read()","median_s":1.0}]}]})j";
    return path.string();
  };
  auto report = [&](const std::vector<std::string>& inputs) {
    std::string cmd = test::quote(SAFETENSORS_TEST_PYTHON) + " " + test::quote(SAFETENSORS_REPORT_PY) +
                      " --out " + test::quote((dir / "out").string());
    for (const auto& in : inputs) cmd += " " + test::quote(in);
    cmd += " >" + test::quote((dir / "stdout").string()) + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    auto out = test::read_bytes(dir / "stdout");
    return std::string(out.begin(), out.end());
  };
  const std::string one = report({round(1)});
  EXPECT_TRUE(has(one, "goal not judged (1 of 3 rounds): gpt2.safetensors save: 1.03x")) << one;
  EXPECT_FALSE(has(one, "goal missed: gpt2.safetensors save")) << one;
  EXPECT_TRUE(has(one, "goal missed: gpt2.safetensors load_copy: 0.5x")) << one;
  const std::string three = report({round(1), round(2), round(3)});
  EXPECT_FALSE(has(three, "gpt2.safetensors save:")) << "met, so not listed: " << three;
  EXPECT_TRUE(has(three, "goal missed: gpt2.safetensors load_copy: 0.5x")) << three;
}

// The other benchmark programs' outputs: report.py's results and standard output, and
// make_bench_files's standard output.
TEST(BenchOutputs, ReportAndFileMakerFailOnAnOutputThatCannotBeWritten) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  test::TempDir dir;
  std::ofstream(dir / "r.json")
      << R"({"tool":"bench_cpp","cache":"warm","machine":"m","date":"d","files":[]})";
  auto report = [&](const std::string& out, const std::string& redirect) {
    std::string cmd = test::quote(SAFETENSORS_TEST_PYTHON) + " " + test::quote(SAFETENSORS_REPORT_PY) +
                      " --out " + test::quote(out) + " " + test::quote((dir / "r.json").string()) + redirect +
                      " 2>" + test::quote((dir / "err").string());
    int status = std::system(cmd.c_str());
    auto err = test::read_bytes(dir / "err");
    return std::pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(err.begin(), err.end()));
  };
  auto [ok, ok_err] = report((dir / "out").string(), " >/dev/null");
  EXPECT_EQ(ok, 0) << ok_err;
  auto [file, file_err] = report("/dev/full/out", " >/dev/null");
  EXPECT_EQ(file, 1) << file_err;
  EXPECT_TRUE(has(file_err, "report.py: cannot write /dev/full/out/results.md: Not a directory")) << file_err;
  auto [out, out_err] = report((dir / "out").string(), " >/dev/full");
  EXPECT_EQ(out, 1) << out_err;
  EXPECT_TRUE(has(out_err, "report.py: cannot write to standard output: No space left on device")) << out_err;
  EXPECT_FALSE(has(out_err, "Traceback")) << out_err;

  std::string make = test::quote(SAFETENSORS_MAKE_BENCH_FILES) + " " + test::quote((dir / "files").string()) +
                     " 20k >/dev/full 2>" + test::quote((dir / "err").string());
  int status = std::system(make.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  auto err = test::read_bytes(dir / "err");
  EXPECT_TRUE(has(std::string(err.begin(), err.end()), "make_bench_files: cannot write to standard output"));
}

// Every figure bench_memory documents, separated by spaces.
constexpr const char* kMemoryFigures =
    "mapped_rss_added file_pmd_mapped released_rss_added cached_before cached_after load_rss_added "
    "load_anon_added load_anon_huge load_released_rss_added load_cached_after locked_added "
    "huge_file_pmd_mapped lazy_touch_s populate_open_s populated_touch_s background_open_s "
    "background_touch_s huge_touch_s load_s cold_lazy_touch_s cold_populate_open_s";

// bench_memory, once at the smallest size: every figure it documents is measured and written to
// the JSON (a lock RLIMIT_MEMLOCK refuses is a skipped figure, with the reason), the file it made
// is gone, and bad arguments are usage errors. Its figures are the benchmark's, not asserted here.
TEST(BenchMemory, ASmokeRunWritesEveryFigureAndRemovesItsFile) {
  test::TempDir dir;
  auto json = dir / "memory.json";
  auto r = test::run(SAFETENSORS_BENCH_MEMORY,
                     {"--make", "1", "--dir", dir.path().string(), "--runs", "1", "--json", json.string()});
  ASSERT_EQ(r.code, 0) << r.err;
  auto bytes = test::read_bytes(json);
  std::string text(bytes.begin(), bytes.end());
  EXPECT_TRUE(has(text, "\"tool\": \"bench_memory\"")) << text;
  std::istringstream figures(kMemoryFigures);
  for (std::string figure; figures >> figure;) {
    EXPECT_TRUE(has(text, "\"" + figure + "\"")) << figure << " missing from " << text;
    EXPECT_TRUE(has(r.out, "  " + figure + " ")) << figure << " missing from " << r.out;
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1)
      << "the file bench_memory made is left behind";

  for (std::vector<std::string> bad : {std::vector<std::string>{},
                                       {"--runs", "0", "--make", "1"},
                                       {"--make", "x"},
                                       {"--make", "1", "--dir", (dir / "none").string()},
                                       {"--frobnicate"},
                                       {(dir / "missing.safetensors").string()}}) {
    auto u = test::run(SAFETENSORS_BENCH_MEMORY, bad);
    EXPECT_EQ(u.code, 2) << u.err;
    EXPECT_TRUE(has(u.err, "usage: bench_memory")) << u.err;
  }
}

// The optional C++ peer: with bench_cpp built against a checkout of syoyo/safetensors-cpp, the
// `peer` item times its open, load and load_copy on the same file and sets each beside ours;
// without one, the item is one skipped line naming the CMake variable that adds it. Either way
// the run succeeds and its JSON is written.
TEST(BenchPeer, ThePeerItemTimesSyoyoBesideOursOrSaysHowToAddIt) {
  test::TempDir dir;
  const auto model = dir / "model.safetensors";
  std::array<float, 6> w{1, 2, 3, 4, 5, 6};
  safetensors::save_file(model, {{"w", TensorView{Dtype::F32, {2, 3}, std::as_bytes(std::span(w)), {}}}});
  const auto json = dir / "out.json";
  auto r = test::run({SAFETENSORS_BENCH_CPP, "--runs", "1", "--items", "open,load,load_copy,peer", "--json",
                      json.string(), model.string()});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto report = test::read_bytes(json);
  const std::string text(report.begin(), report.end());
  if (has(r.out, "syoyo          skipped:")) {
    EXPECT_TRUE(has(r.out, "SAFETENSORS_SYOYO_DIR")) << r.out;
    EXPECT_TRUE(has(text, R"("item":"syoyo")")) << text;
    return;
  }
  for (const char* item : {"open", "load", "load_copy"}) {
    const std::string name = std::string("syoyo ") + item;
    EXPECT_TRUE(has(r.out, "  " + name + " ")) << name << "\n" << r.out;
    EXPECT_TRUE(has(text, "\"item\":\"" + name + "\"")) << name << "\n" << text;
    EXPECT_TRUE(has(r.out, "ours ") && has(r.out, " vs syoyo/safetensors-cpp ")) << r.out;
  }
}

// An owned copy is set beside every way of reading the same bytes into memory: memory already
// mapped (the goal's limit), fresh memory, and fresh memory that asked for huge pages, as the
// library's own large buffers do (what one thread can reach: the kernel still zeroes the pages).
TEST(BenchLimits, LoadCopyIsMeasuredBesideReadsIntoMappedFreshAndHugePageMemory) {
  test::TempDir dir;
  const auto model = dir / "model.safetensors";
  std::vector<float> w(3 << 20, 1.5f);  // 12 MiB: large enough for huge pages
  safetensors::save_file(model, {{"w", TensorView{Dtype::F32, {w.size()}, std::as_bytes(std::span(w)), {}}}});
  const auto json = dir / "out.json";
  auto r = test::run({SAFETENSORS_BENCH_CPP, "--runs", "1", "--items", "load_copy", "--json", json.string(),
                      model.string()});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto report = test::read_bytes(json);
  const std::string text(report.begin(), report.end());
  for (const char* limit : {"read()", "read() into new memory", "read() into new huge pages", "memcpy"}) {
    EXPECT_TRUE(has(r.out, std::string("  ") + limit + " ")) << limit << "\n" << r.out;
    EXPECT_TRUE(has(text, "{\"item\":\"" + std::string(limit) + "\",\"median_s\":")) << limit << "\n" << text;
  }
}
