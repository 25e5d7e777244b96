#include "base/subprocess.h"

#include <signal.h>

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

TEST(Subprocess, DisplayQuotesWhatAShellWouldSplit) {
  EXPECT_EQ(ArgvForDisplay({"sbatch", "--job-name=a b", "x"}), "sbatch '--job-name=a b' x");
}

}  // namespace
}  // namespace spikeguard
