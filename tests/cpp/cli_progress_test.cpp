// When the `safetensors` tool shows progress: only on a terminal someone watches, that is with
// standard output and standard error both terminals and no --json. The tool runs here on a
// pseudo-terminal, as it does in a shell; what the terminal shows is read from its other side.
#include <safetensors/safetensors.hpp>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "program.hpp"

using safetensors::Dtype;
using safetensors::TensorView;

namespace {

using test::has;

/// Where the tool's standard output goes while its standard error is a terminal.
enum class Stdout { Terminal, DevNull };

/// Runs the tool with `args`, standard error on a pseudo-terminal, and returns what that
/// terminal showed (standard output too when it shares the terminal) and the exit code.
std::pair<std::string, int> on_terminal(const std::vector<std::string>& args, Stdout out) {
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) {
    ADD_FAILURE() << "openpty: " << std::strerror(errno);
    return {"", -1};
  }
  std::vector<std::string> argv_text{SAFETENSORS_CLI};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int stdout_fd = out == Stdout::Terminal ? slave : ::open("/dev/null", O_WRONLY);
    if (stdout_fd < 0 || ::dup2(stdout_fd, 1) < 0 || ::dup2(slave, 2) < 0) ::_exit(126);
    ::close(master);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(slave);
  std::string shown;
  char buf[4096];
  for (;;) {  // until the tool's side closes (EIO on Linux)
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n > 0) {
      shown.append(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(master);
  return {shown, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

class CliProgress : public ::testing::Test {
 protected:
  void SetUp() override {
    safetensors::save_file(file_, {{"w", TensorView{Dtype::F32, {4}, std::as_bytes(std::span(w_)), {}}}});
  }

  /// Each command that shows progress, with its arguments.
  std::vector<std::vector<std::string>> commands() const {
    return {{"validate", file_.string()},
            {"stats", file_.string()},
            {"reshard", file_.string(), (dir_ / "out").string()}};
  }

  test::TempDir dir_;
  std::filesystem::path file_ = dir_ / "in.safetensors";
  float w_[4] = {1, 2, 3, 4};
};

// Progress lines are rewritten in place with "\r" and erase-line ("\033[K"); output on a
// terminal turns "\n" into "\r\n", so erase-line is the mark of progress.
constexpr const char* kEraseLine = "\033[K";

TEST_F(CliProgress, ShownWhenStdoutAndStderrAreTerminals) {
  for (const auto& args : commands()) {
    auto [shown, code] = on_terminal(args, Stdout::Terminal);
    EXPECT_EQ(code, 0) << args[0] << ": " << shown;
    EXPECT_TRUE(has(shown, kEraseLine)) << args[0] << ": " << shown;
  }
}

TEST_F(CliProgress, NotShownWhenStdoutIsNotATerminal) {
  for (const auto& args : commands()) {
    auto [shown, code] = on_terminal(args, Stdout::DevNull);
    EXPECT_EQ(code, 0) << args[0] << ": " << shown;
    EXPECT_TRUE(shown.empty()) << args[0] << ": " << shown;
  }
}

TEST_F(CliProgress, NotShownWithJson) {
  for (auto args : commands()) {
    args.push_back("--json");
    auto [shown, code] = on_terminal(args, Stdout::Terminal);
    EXPECT_EQ(code, 0) << args[0] << ": " << shown;
    EXPECT_FALSE(has(shown, kEraseLine)) << args[0] << ": " << shown;
    EXPECT_TRUE(has(shown, "{")) << args[0] << ": " << shown;
  }
}

}  // namespace
