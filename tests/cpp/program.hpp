// Running a built program (the `safetensors` tool, bench_cpp, bench.py) as a user does, through
// the shell, and capturing its exit code, standard output and standard error.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "support.hpp"

namespace test {

struct Run {
  int code;  // the exit code, or -1 when the program did not exit (a signal)
  std::string out;
  std::string err;
};

/// `s` as one shell word.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Runs `command` (the program, then its arguments, each passed as it is).
inline Run run(const std::vector<std::string>& command) {
  TempDir tmp;
  std::string cmd;
  for (const auto& a : command) cmd += (cmd.empty() ? "" : " ") + quote(a);
  cmd += " >" + quote((tmp / "out").string()) + " 2>" + quote((tmp / "err").string());
  int status = std::system(cmd.c_str());
  auto text = [&](const char* f) {
    auto b = read_bytes(tmp / f);
    return std::string(b.begin(), b.end());
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text("out"), text("err")};
}

/// Runs `program` with `args`.
inline Run run(const std::string& program, const std::vector<std::string>& args) {
  std::vector<std::string> command{program};
  command.insert(command.end(), args.begin(), args.end());
  return run(command);
}

#ifdef SAFETENSORS_CLI
/// The built `safetensors` tool (tests/CMakeLists.txt names it) with `args`.
inline Run cli(const std::vector<std::string>& args) {
  return run(SAFETENSORS_CLI, args);
}
#endif

inline bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace test
