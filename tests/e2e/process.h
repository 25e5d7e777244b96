// process.h
// -----------------------------------------------------------------------------
// Real child processes for end-to-end tests: start a binary with arguments,
// its stdout and stderr going to files, wait for it with a timeout, or kill it
// (SIGKILL for crash tests). Also: a free loopback port, and a temp dir.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>

#include <algorithm>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace spikeguard::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "spikeguard-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  // SPIKEGUARD_KEEP_TEST_DIRS=1 keeps them (daemon and worker logs) for a
  // look after a failure.
  ~TempDir() {
    if (const char* keep = std::getenv("SPIKEGUARD_KEEP_TEST_DIRS"); keep && *keep == '1') {
      std::fprintf(stderr, "kept %s\n", path_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A port that was free a moment ago.
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Process {
 public:
  // Starts `argv[0]` with the arguments; output goes to `log_prefix`.out/.err.
  Process(std::vector<std::string> argv, std::string log_prefix)
      : argv_(std::move(argv)), out_path_(log_prefix + ".out"), err_path_(log_prefix + ".err") {
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = std::freopen(out_path_.c_str(), "w", stdout);
      FILE* err = std::freopen(err_path_.c_str(), "w", stderr);
      (void)out;
      (void)err;
      std::vector<char*> args;
      for (auto& a : argv_) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      std::perror("execv");
      _exit(127);
    }
  }
  ~Process() {
    if (running()) Kill(SIGKILL);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool running() {
    if (exited_) return false;
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      Record(status);
      return false;
    }
    return true;
  }

  // Exit code, or 128+signal; nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (running()) {
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return code_;
  }

  void Kill(int sig) {
    if (exited_) return;
    ::kill(pid_, sig);
    if (sig == SIGKILL) {
      int status = 0;
      waitpid(pid_, &status, 0);
      Record(status);
    }
  }

  std::string out() const { return ReadFile(out_path_); }
  std::string err() const { return ReadFile(err_path_); }
  pid_t pid() const { return pid_; }

 private:
  void Record(int status) {
    exited_ = true;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::vector<std::string> argv_;
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

// Pids of the processes (not this one) whose command line mentions every
// needle, e.g. the workers a SIGKILLed daemon left behind in a test's temp dir.
inline std::vector<int> PidsMentioning(const std::vector<std::string>& needles) {
  std::vector<int> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* e = readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    std::string cmdline = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    bool all = !cmdline.empty();
    for (const auto& n : needles) all = all && cmdline.find(n) != std::string::npos;
    if (all) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

inline void KillProcessesMentioning(const std::string& needle) {
  for (int pid : PidsMentioning({needle})) ::kill(pid, SIGKILL);
}

// Runs a command to completion and returns (exit code, stdout, stderr).
struct RunResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline RunResult RunCommand(std::vector<std::string> argv, const std::string& log_prefix,
                            std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  Process p(std::move(argv), log_prefix);
  auto code = p.Wait(timeout);
  RunResult r;
  if (!code) {
    p.Kill(SIGKILL);
    r.code = -1;
  } else {
    r.code = *code;
  }
  r.out = p.out();
  r.err = p.err();
  return r;
}

}  // namespace spikeguard::testing
