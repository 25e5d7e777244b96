#include "base/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace spikeguard {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() { Close(); }
  void Close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// The child's stdin is a socket pair, so that writing to a child that exits
// without reading raises no SIGPIPE in the daemon (send with MSG_NOSIGNAL).
bool MakeStdinPair(Fd& child_end, Fd& parent_end) {
  int p[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0) return false;
  child_end.fd = p[0];
  parent_end.fd = p[1];
  return true;
}

bool MakePipe(Fd& read_end, Fd& write_end) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return false;
  read_end.fd = p[0];
  write_end.fd = p[1];
  return true;
}

// An argv and environment as exec takes them, built before fork: after it,
// a child of a threaded process may only call async-signal-safe functions.
class ExecArgs {
 public:
  ExecArgs(const std::vector<std::string>& argv, const std::optional<std::vector<std::string>>& env)
      : argv_strings_(argv) {
    for (auto& a : argv_strings_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    if (env.has_value()) {
      env_strings_ = *env;
      for (auto& e : env_strings_) envp_.push_back(e.data());
      envp_.push_back(nullptr);
    }
  }
  ExecArgs(const ExecArgs&) = delete;
  ExecArgs& operator=(const ExecArgs&) = delete;

  // Async-signal-safe; returns only when exec fails (errno says why).
  void Exec(bool search_path) const {
    char* const* envp = envp_.empty() ? environ : envp_.data();
    if (search_path) {
      ::execvpe(argv_[0], argv_.data(), envp);
    } else {
      ::execve(argv_[0], argv_.data(), envp);
    }
  }

 private:
  std::vector<std::string> argv_strings_;
  std::vector<std::string> env_strings_;
  std::vector<char*> argv_;
  std::vector<char*> envp_;
};

// What a child that could not exec reports through its error pipe.
struct ExecFailure {
  int chdir_failed = 0;
  int error = 0;
};

}  // namespace

absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                   const SpawnOptions& options) {
  if (argv.empty() || argv[0].empty()) return absl::InvalidArgumentError("empty command");
  const ExecArgs exec_args(argv, options.env);
  const char* workdir = options.workdir.empty() ? nullptr : options.workdir.c_str();
  // Closed on a successful exec (O_CLOEXEC): the parent reads end of file.
  Fd exec_r, exec_w;
  if (!MakePipe(exec_r, exec_w)) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    if (options.new_process_group) ::setpgid(0, 0);
    if (options.stdin_fd >= 0) ::dup2(options.stdin_fd, 0);
    if (options.stdout_fd >= 0) ::dup2(options.stdout_fd, 1);
    if (options.stderr_fd >= 0) ::dup2(options.stderr_fd, 2);
    ExecFailure failure;
    if (workdir != nullptr && ::chdir(workdir) != 0) {
      failure = {1, errno};
    } else {
      exec_args.Exec(options.search_path);
      failure = {0, errno};
    }
    (void)!::write(exec_w.fd, &failure, sizeof failure);
    ::_exit(failure.chdir_failed ? 126 : 127);
  }
  exec_w.Close();
  ExecFailure failure;
  ssize_t got;
  while ((got = ::read(exec_r.fd, &failure, sizeof failure)) < 0 && errno == EINTR) {
  }
  if (got == sizeof failure) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (failure.chdir_failed) {
      return absl::NotFoundError(absl::StrCat("cannot run ", argv[0], ": working directory ",
                                              options.workdir, ": ", strerror(failure.error)));
    }
    return absl::NotFoundError(absl::StrCat("cannot run ", argv[0], ": ", strerror(failure.error)));
  }
  return pid;
}

absl::Status ExecProcess(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0].empty()) return absl::InvalidArgumentError("empty command");
  const ExecArgs exec_args(argv, std::nullopt);
  exec_args.Exec(/*search_path=*/false);
  return absl::NotFoundError(absl::StrCat("cannot execute ", argv[0], ": ", strerror(errno)));
}

std::string ArgvForDisplay(const std::vector<std::string>& argv) {
  std::vector<std::string> shown;
  shown.reserve(argv.size());
  for (const auto& a : argv) {
    const bool plain = !a.empty() && a.find_first_of(" \t\n'\"\\$`") == std::string::npos;
    shown.push_back(plain ? a : absl::StrCat("'", a, "'"));
  }
  return absl::StrJoin(shown, " ");
}

absl::StatusOr<SubprocessResult> RunSubprocess(const std::vector<std::string>& argv,
                                               const SubprocessOptions& options) {
  if (argv.empty() || argv[0].empty()) return absl::InvalidArgumentError("empty command");
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    const std::string key = eq ? std::string(*e, eq - *e) : std::string(*e);
    if (options.env.count(key) == 0) env.emplace_back(*e);
  }
  for (const auto& [k, v] : options.env) env.push_back(absl::StrCat(k, "=", v));

  Fd in_r, in_w, out_r, out_w, err_r, err_w;
  if (!MakeStdinPair(in_r, in_w) || !MakePipe(out_r, out_w) || !MakePipe(err_r, err_w)) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  SpawnOptions spawn;
  spawn.env = std::move(env);
  spawn.stdin_fd = in_r.fd;
  spawn.stdout_fd = out_w.fd;
  spawn.stderr_fd = err_w.fd;
  spawn.new_process_group = true;
  spawn.search_path = true;
  absl::StatusOr<pid_t> spawned = SpawnProcess(argv, spawn);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  in_r.Close();
  out_w.Close();
  err_w.Close();

  SubprocessResult result;
  ::fcntl(in_w.fd, F_SETFL, O_NONBLOCK);
  size_t written = 0;
  if (options.stdin_text.empty()) in_w.Close();
  const absl::Time deadline = absl::Now() + options.timeout;
  bool out_cut = false, err_cut = false, timed_out = false;
  char buf[8192];
  while (out_r.fd >= 0 || err_r.fd >= 0) {
    pollfd fds[3];
    int n = 0;
    int out_i = -1, err_i = -1, in_i = -1;
    if (out_r.fd >= 0) { fds[n] = {out_r.fd, POLLIN, 0}; out_i = n++; }
    if (err_r.fd >= 0) { fds[n] = {err_r.fd, POLLIN, 0}; err_i = n++; }
    if (in_w.fd >= 0) { fds[n] = {in_w.fd, POLLOUT, 0}; in_i = n++; }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    const int ready = ::poll(fds, n, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) break;
    auto drain = [&](int i, Fd& fd, std::string& into, bool& cut) {
      if (i < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) return;
      const ssize_t got = ::read(fd.fd, buf, sizeof buf);
      if (got <= 0) {
        fd.Close();
        return;
      }
      const size_t room = options.max_output_bytes > into.size()
                              ? options.max_output_bytes - into.size() : 0;
      into.append(buf, std::min<size_t>(room, static_cast<size_t>(got)));
      if (static_cast<size_t>(got) > room) cut = true;
    };
    drain(out_i, out_r, result.out, out_cut);
    drain(err_i, err_r, result.err, err_cut);
    if (in_i >= 0 && (fds[in_i].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t put = ::send(in_w.fd, options.stdin_text.data() + written,
                                 options.stdin_text.size() - written, MSG_NOSIGNAL);
      if (put < 0 && errno != EAGAIN) {
        in_w.Close();
      } else if (put > 0) {
        written += static_cast<size_t>(put);
        if (written == options.stdin_text.size()) in_w.Close();
      }
    }
  }
  in_w.Close();
  if (timed_out) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(ArgvForDisplay(argv), " did not finish within ",
                     absl::FormatDuration(options.timeout), " and was killed"));
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  if (out_cut) absl::StrAppend(&result.out, "\n[output cut at ", options.max_output_bytes, " bytes]");
  if (err_cut) absl::StrAppend(&result.err, "\n[output cut at ", options.max_output_bytes, " bytes]");
  return result;
}

}  // namespace spikeguard
