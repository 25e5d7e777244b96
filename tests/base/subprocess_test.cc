#include "base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace spikeguard {
namespace {

TEST(Subprocess, CapturesOutputAndExitCodeWithoutAShell) {
  auto r = RunSubprocess({"/bin/echo", "a b", "$HOME", "; rm -rf /"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
  // Each argument reached the program as given: nothing was expanded or run.
  EXPECT_EQ(r->out, "a b $HOME ; rm -rf /\n");

  auto failed = RunSubprocess({"/bin/sh", "-c", "echo oops >&2; exit 7"});
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->exit_code, 7);
  EXPECT_EQ(failed->err, "oops\n");
}

TEST(Subprocess, FindsCommandsOnPathAndNamesOnesThatCannotRun) {
  auto r = RunSubprocess({"true"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
  auto missing = RunSubprocess({"/nonexistent/sbatch", "x"});
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("/nonexistent/sbatch"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(RunSubprocess({}).status()));
}

TEST(Subprocess, PassesStdinAndEnvironmentOverrides) {
  SubprocessOptions o;
  o.stdin_text = std::string(200000, 'x') + "\nend\n";  // more than a pipe buffer
  o.env["SG_SUBPROCESS_TEST"] = "value with spaces";
  auto r = RunSubprocess({"/bin/sh", "-c", "wc -c; printf '%s' \"$SG_SUBPROCESS_TEST\" >&2"}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "200005\n");
  EXPECT_EQ(r->err, "value with spaces");
}

TEST(Subprocess, AChildThatIgnoresItsStdinDoesNotHurtTheCaller) {
  SubprocessOptions o;
  o.stdin_text = std::string(1 << 20, 'x');
  // Without MSG_NOSIGNAL this write would raise SIGPIPE in the test process.
  auto r = RunSubprocess({"true"}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
}

TEST(Subprocess, KillsACommandPastItsTimeoutAndSaysSo) {
  SubprocessOptions o;
  o.timeout = absl::Milliseconds(300);
  // The child's own child is killed too (the process group), so nothing
  // keeps the output pipe open.
  auto r = RunSubprocess({"/bin/sh", "-c", "sleep 30 & sleep 30"}, o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("sleep 30"), std::string::npos) << r.status();
}

TEST(Subprocess, CutsOutputAtTheLimitAndReportsSignals) {
  SubprocessOptions o;
  o.max_output_bytes = 1000;
  auto r = RunSubprocess({"/bin/sh", "-c", "head -c 100000 /dev/zero | tr '\\0' y"}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out.substr(0, 1000), std::string(1000, 'y'));
  EXPECT_NE(r->out.find("[output cut at 1000 bytes]"), std::string::npos);

  auto killed = RunSubprocess({"/bin/sh", "-c", "kill -TERM $$"});
  ASSERT_TRUE(killed.ok());
  EXPECT_EQ(killed->exit_code, 128 + SIGTERM);
}

TEST(Spawn, StartsWithExactlyTheGivenEnvironmentWorkdirAndOutput) {
  const std::string log = testing::TempDir() + "/spawn_test_" + std::to_string(::getpid()) + ".log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  SpawnOptions o;
  o.env = std::vector<std::string>{"ONLY=this"};
  o.stdout_fd = fd;
  o.stderr_fd = fd;
  o.workdir = "/";
  auto pid = SpawnProcess({"/bin/sh", "-c", "pwd; env | grep -c =; echo \"$ONLY\" >&2; exit 4"}, o);
  ::close(fd);
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 4);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  // sh itself adds PWD (and may add SHLVL, _): none of the caller's variables.
  EXPECT_EQ(text.str().substr(0, 2), "/\n") << text.str();
  EXPECT_NE(text.str().find("this\n"), std::string::npos) << text.str();
  EXPECT_EQ(text.str().find("PATH="), std::string::npos) << text.str();
  std::remove(log.c_str());
}

TEST(Spawn, NamesWhatCouldNotBeExecuted) {
  auto missing = SpawnProcess({"/nonexistent/rank", "x"});
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("/nonexistent/rank"), std::string::npos);
  // execve does not search PATH unless asked.
  EXPECT_TRUE(absl::IsNotFound(SpawnProcess({"true"}).status()));
  SpawnOptions o;
  o.workdir = "/nonexistent/dir";
  auto bad_dir = SpawnProcess({"/bin/true"}, o);
  EXPECT_TRUE(absl::IsNotFound(bad_dir.status())) << bad_dir.status();
  EXPECT_NE(bad_dir.status().message().find("/nonexistent/dir"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(SpawnProcess({}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ExecProcess({})));
  auto exec = ExecProcess({"/nonexistent/srun"});
  EXPECT_TRUE(absl::IsNotFound(exec)) << exec;
}

TEST(Subprocess, DisplayQuotesWhatAShellWouldSplit) {
  EXPECT_EQ(ArgvForDisplay({"sbatch", "--job-name=a b", "x"}), "sbatch '--job-name=a b' x");
}

}  // namespace
}  // namespace spikeguard
