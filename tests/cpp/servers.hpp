// Servers the remote tests start on loopback: nginx serving a directory (with an access log of
// each request's path, Range, status and body bytes). Shared by remote_test and the GPU tests
// that upload remote files.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace test {

namespace fs = std::filesystem;

/// Whether a missing server is a failure rather than a skip (SAFETENSORS_REQUIRE_SERVERS=1, set
/// by tests/run under CI).
inline bool servers_required() {
  const char* v = std::getenv("SAFETENSORS_REQUIRE_SERVERS");
  return v != nullptr && std::string(v) == "1";
}

inline std::uint16_t free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(s);
  return ntohs(addr.sin_port);
}

inline bool listening(std::uint16_t port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(s);
  return ok;
}

/// nginx serving `root` on loopback until destroyed.
class Nginx {
 public:
  static std::optional<Nginx> start(const fs::path& root, const fs::path& work) {
    fs::path bin;
    for (const char* p : {"/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"}) {
      if (fs::exists(p)) bin = p;
    }
    if (bin.empty()) return std::nullopt;
    const std::uint16_t port = free_port();
    const std::string w = work.string();
    std::ofstream(work / "nginx.conf")
        << "daemon off;\nmaster_process off;\nworker_processes 1;\npid " << w << "/nginx.pid;\n"
        << "error_log " << w << "/error.log;\nevents { worker_connections 64; }\n"
        << "http {\n log_format ranges '$uri $http_range $status $body_bytes_sent';\n access_log " << w
        << "/access.log ranges;\n client_body_temp_path " << w << "/body;\n proxy_temp_path " << w
        << "/proxy;\n fastcgi_temp_path " << w << "/fastcgi;\n uwsgi_temp_path " << w << "/uwsgi;\n"
        << " scgi_temp_path " << w << "/scgi;\n default_type application/octet-stream;\n"
        << " server { listen 127.0.0.1:" << port << "; root " << root.string() << "; }\n}\n";
    std::vector<std::string> args{bin.string(), "-p", w, "-e", w + "/error.log", "-c", w + "/nginx.conf"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // nginx's own output goes nowhere: a server outliving a test program that died (a sanitizer
    // halting it) must not hold the test's output pipe open, or ctest waits on it forever.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    const int spawned = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) return std::nullopt;
    Nginx server(pid, port);
    for (int i = 0; i < 1000 && !listening(port); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!listening(port)) return std::nullopt;
    return server;
  }
  Nginx(Nginx&& o) noexcept : pid_(std::exchange(o.pid_, 0)), port_(o.port_) {}
  Nginx& operator=(Nginx&&) = delete;
  Nginx(const Nginx&) = delete;
  Nginx& operator=(const Nginx&) = delete;
  ~Nginx() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  [[nodiscard]] std::string url(const std::string& name) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + name;
  }

 private:
  Nginx(pid_t pid, std::uint16_t port) : pid_(pid), port_(port) {}
  pid_t pid_;
  std::uint16_t port_;
};

/// The requests nginx served from `work`: (path, Range header, status, body bytes).
struct ServedRequest {
  std::string uri, range;
  int status = 0;
  std::uint64_t bytes = 0;
};
inline std::vector<ServedRequest> access_log(const fs::path& work) {
  std::vector<ServedRequest> out;
  std::ifstream in(work / "access.log");
  ServedRequest r;
  while (in >> r.uri >> r.range >> r.status >> r.bytes) out.push_back(r);
  return out;
}

}  // namespace test
