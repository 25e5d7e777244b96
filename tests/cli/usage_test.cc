// Argument parsing and exit codes of every spikectl command, without a
// daemon: a usage error exits 2 before any connection is made (the address
// given refuses connections, so a wrongly accepted command line exits 1),
// and --help exits 0 with the usage on stdout.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/args.h"
#include "cli/spikectl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage/corpus/test_dir.h"

namespace spikeguard::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result Spikectl(std::vector<std::string> args) {
  // Port 1 on loopback refuses at once: reaching the network shows as exit 1.
  args.insert(args.begin(), "--addr=127.0.0.1:1");
  std::ostringstream out, err;
  const int code = RunSpikectl(args, out, err);
  return {code, out.str(), err.str()};
}

struct UsageCase {
  std::vector<std::string> args;
  std::string reason;  // expected on stderr
};

class UsageErrorTest : public ::testing::TestWithParam<UsageCase> {};

TEST_P(UsageErrorTest, ExitsTwoNamingTheProblemWithUsage) {
  const UsageCase& c = GetParam();
  Result r = Spikectl(c.args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, StartsWith("spikectl: "));
  EXPECT_THAT(r.err, HasSubstr(c.reason));
  EXPECT_THAT(r.err, HasSubstr("usage: spikectl"));
  EXPECT_THAT(r.out, IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(
    AllCommands, UsageErrorTest,
    ::testing::Values(
        UsageCase{{}, "missing command"},
        UsageCase{{"bogus"}, "unknown command 'bogus'"},
        UsageCase{{"--frobnicate", "status"}, "unknown flag --frobnicate"},
        UsageCase{{"--output=xml", "status"}, "bad value for --output: 'xml'"},
        UsageCase{{"--timeout=abc", "status"}, "bad number for --timeout: 'abc'"},
        UsageCase{{"--timeout=0", "status"}, "bad value for --timeout"},
        UsageCase{{"status", "--output=yaml"}, "bad value for --output: 'yaml'"},
        UsageCase{{"status", "extra"}, "unexpected argument 'extra'"},
        UsageCase{{"status", "--bogus"}, "unknown flag --bogus"},
        UsageCase{{"runs"}, "missing runs command"},
        UsageCase{{"runs", "bogus"}, "unknown command 'runs bogus'"},
        UsageCase{{"runs", "list", "--run=x"}, "unknown flag --run"},
        UsageCase{{"runs", "create"}, "missing argument NAME"},
        UsageCase{{"runs", "create", "r", "--world-size=abc"}, "bad number for --world-size: 'abc'"},
        UsageCase{{"runs", "create", "r", "--world-size=0"}, "bad value for --world-size"},
        UsageCase{{"runs", "create", "r", "--mode=chaos"}, "bad value for --mode: 'chaos'"},
        UsageCase{{"runs", "create", "r", "--spec=/nonexistent/spec.txtpb"}, "cannot read --spec file"},
        UsageCase{{"runs", "show"}, "missing argument NAME"},
        UsageCase{{"runs", "show", "a", "b"}, "unexpected argument 'b'"},
        UsageCase{{"checkpoints"}, "missing checkpoints command"},
        UsageCase{{"checkpoints", "list"}, "missing required flag --run"},
        UsageCase{{"checkpoints", "list", "--run"}, "missing value for --run"},
        UsageCase{{"telemetry"}, "missing required flag --run"},
        UsageCase{{"telemetry", "--run=r", "--metrics=loss,bogus"}, "unknown metric 'bogus'"},
        UsageCase{{"telemetry", "--run=r", "--metrics=layerx.max_attn_logit"},
                  "unknown metric 'layerx.max_attn_logit'"},
        UsageCase{{"telemetry", "--run=r", "--metrics=layer2.loss"}, "unknown metric 'layer2.loss'"},
        UsageCase{{"telemetry", "--run=r", "--metrics="}, "empty --metrics"},
        UsageCase{{"telemetry", "--run=r", "--from=x"}, "bad number for --from: 'x'"},
        UsageCase{{"telemetry", "--run=r", "--to=1e3"}, "bad number for --to: '1e3'"},
        UsageCase{{"telemetry", "--run=r", "--gen=g"}, "bad number for --gen: 'g'"},
        UsageCase{{"telemetry", "--run=r", "--from=10", "--to=5"}, "--from 10 is after --to 5"},
        UsageCase{{"telemetry", "--run=r", "--limit=0"}, "bad value for --limit"},
        UsageCase{{"incidents"}, "missing incidents command"},
        UsageCase{{"incidents", "list", "--state=sleeping"}, "bad value for --state: 'sleeping'"},
        UsageCase{{"incidents", "list", "--verdict=cosmic"}, "bad value for --verdict: 'cosmic'"},
        UsageCase{{"incidents", "show"}, "missing argument ID"},
        UsageCase{{"incidents", "show", "abc"}, "bad number for ID: 'abc'"},
        UsageCase{{"incidents", "watch", "extra"}, "unexpected argument 'extra'"},
        UsageCase{{"rewind", "--run=r"}, "missing required flag --to-step"},
        UsageCase{{"rewind", "--to-step=5"}, "missing required flag --run"},
        UsageCase{{"rewind", "--run=r", "--to-step=x"}, "bad number for --to-step: 'x'"},
        UsageCase{{"rewind", "--run=r", "--to-step=-5"}, "--to-step must not be negative"},
        UsageCase{{"rewind", "--run=r", "--to-step=10", "--skip=5"}, "bad value for --skip: '5'"},
        UsageCase{{"rewind", "--run=r", "--to-step=10", "--skip=9:5"}, "bad value for --skip: '9:5'"},
        UsageCase{{"rewind", "--run=r", "--to-step=10", "--stop-after=z"},
                  "bad number for --stop-after: 'z'"},
        UsageCase{{"replay", "--run=r"}, "missing required flag --from-step"},
        UsageCase{{"replay", "--run=r", "--from-step=1.5"}, "bad number for --from-step: '1.5'"},
        UsageCase{{"skip", "--run=r", "--from=1"}, "missing required flag --to"},
        UsageCase{{"skip", "--run=r", "--from=9", "--to=1"}, "--from 9 is after --to 1"},
        UsageCase{{"pause"}, "missing required flag --run"},
        UsageCase{{"resume", "r"}, "unexpected argument 'r'"},
        UsageCase{{"approve"}, "missing argument ID"},
        UsageCase{{"approve", "x"}, "bad number for ID: 'x'"},
        UsageCase{{"abort"}, "missing argument ID"},
        UsageCase{{"abort", "1", "2"}, "unexpected argument '2'"},
        UsageCase{{"abort", "1", "--reason"}, "missing value for --reason"},
        UsageCase{{"policy"}, "missing policy command"},
        UsageCase{{"policy", "set"}, "missing required flag --file"},
        UsageCase{{"policy", "set", "--file=/nonexistent/policy.txtpb"}, "cannot read --file file"},
        UsageCase{{"policy", "get", "--file=p"}, "unknown flag --file"},
        UsageCase{{"manifest", "--run=r", "--from=1"}, "missing required flag --to"},
        UsageCase{{"manifest", "--run=r", "--from=1", "--to=2", "--gen=x"}, "bad number for --gen"},
        UsageCase{{"quarantine", "list"}, "missing required flag --run"},
        UsageCase{{"quarantine", "add"}, "unknown command 'quarantine add'"}));

class HelpTest : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(HelpTest, PrintsUsageToStdoutAndExitsZero) {
  Result r = Spikectl(GetParam());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("usage: spikectl"));
  EXPECT_THAT(r.err, IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(
    EveryCommand, HelpTest,
    ::testing::Values(
        std::vector<std::string>{"--help"}, std::vector<std::string>{"-h"},
        std::vector<std::string>{"status", "--help"}, std::vector<std::string>{"runs", "--help"},
        std::vector<std::string>{"runs", "list", "-h"},
        std::vector<std::string>{"runs", "create", "--help"},
        std::vector<std::string>{"runs", "show", "--help"},
        std::vector<std::string>{"checkpoints", "-h"},
        std::vector<std::string>{"checkpoints", "list", "--help"},
        std::vector<std::string>{"telemetry", "--help"},
        std::vector<std::string>{"incidents", "--help"},
        std::vector<std::string>{"incidents", "list", "--help"},
        std::vector<std::string>{"incidents", "show", "--help"},
        std::vector<std::string>{"incidents", "watch", "--help"},
        std::vector<std::string>{"rewind", "--help"}, std::vector<std::string>{"replay", "--help"},
        std::vector<std::string>{"skip", "--help"}, std::vector<std::string>{"pause", "--help"},
        std::vector<std::string>{"resume", "--help"}, std::vector<std::string>{"approve", "--help"},
        std::vector<std::string>{"abort", "--help"}, std::vector<std::string>{"policy", "--help"},
        std::vector<std::string>{"policy", "get", "--help"},
        std::vector<std::string>{"policy", "set", "--help"},
        std::vector<std::string>{"manifest", "--help"},
        std::vector<std::string>{"quarantine", "--help"},
        std::vector<std::string>{"quarantine", "list", "--help"},
        // Help wins over the errors of an unfinished command line.
        std::vector<std::string>{"rewind", "--to-step=x", "-h"},
        std::vector<std::string>{"skip", "--from=x", "--help"}));

TEST(UsageTest, CommandHelpDescribesItsFlags) {
  Result r = Spikectl({"rewind", "--help"});
  EXPECT_THAT(r.out, HasSubstr("--skip=A:B"));
  EXPECT_THAT(r.out, HasSubstr("--stop-after=S"));
  EXPECT_THAT(r.out, HasSubstr("--addr=HOST:PORT"));
}

TEST(UsageTest, OverviewListsEveryCommand) {
  Result r = Spikectl({"--help"});
  for (const char* command :
       {"status", "runs list", "runs create", "runs show", "checkpoints list", "telemetry",
        "incidents list", "incidents show", "incidents watch", "rewind", "replay", "skip", "pause",
        "resume", "approve", "abort", "policy get", "policy set", "manifest", "quarantine list"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("  ") + command + " ")) << command;
  }
}

TEST(UsageTest, NoCommandPrintsOverviewToStderr) {
  std::ostringstream out, err;
  EXPECT_EQ(RunSpikectl(std::vector<std::string>{}, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("Commands:"));
  EXPECT_THAT(out.str(), IsEmpty());
}

TEST(UsageTest, MalformedSpecFileIsAUsageErrorNamingTheLine) {
  const std::string path = storage::testing_util::TestFilePath("bad_spec.txtpb");
  std::ofstream(path) << "command: \"train\"\nno_such_field: 3\n";
  Result r = Spikectl({"runs", "create", "r", "--spec=" + path});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("bad --spec file"));
  EXPECT_THAT(r.err, HasSubstr("line 2"));
  EXPECT_THAT(r.err, HasSubstr("no_such_field"));
}

TEST(UsageTest, ValidCommandLineReachesForTheDaemon) {
  // The control case for the suite above: a correct command line gets past
  // parsing and fails only on the connection.
  Result r = Spikectl({"rewind", "--run=r", "--to-step=100", "--skip=120:130"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach spikeguardd at 127.0.0.1:1"));
}

TEST(UsageTest, MainSignatureSkipsProgramName) {
  std::vector<std::string> words = {"spikectl", "--addr=127.0.0.1:1", "status", "--help"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  std::ostringstream out, err;
  EXPECT_EQ(RunSpikectl(static_cast<int>(argv.size()), argv.data(), out, err), 0);
  EXPECT_THAT(out.str(), StartsWith("usage: spikectl [global flags] status"));
}

TEST(UsageTest, DefaultAddressComesFromEnvironment) {
  ::unsetenv("SPIKEGUARD_ADDR");
  EXPECT_EQ(DefaultAddress(), "127.0.0.1:7070");
  ::setenv("SPIKEGUARD_ADDR", "daemon.example:9000", 1);
  EXPECT_EQ(DefaultAddress(), "daemon.example:9000");
  ::unsetenv("SPIKEGUARD_ADDR");
}

// --- ParseArgs -----------------------------------------------------------------

const std::vector<FlagSpec> kFlags = {
    {"run", FlagSpec::kValue}, {"skip", FlagSpec::kRepeated}, {"dry-run", FlagSpec::kBool}};

TEST(ParseArgsTest, AcceptsBothFlagSpellingsAndKeepsRepeats) {
  const std::vector<std::string> words = {"--run", "a", "ID", "--skip=1:2", "--skip", "3:4",
                                          "--run=b", "--dry-run"};
  const std::vector<std::string> names = {"ID"};
  absl::StatusOr<ParsedArgs> args = ParseArgs(words, kFlags, names, 1);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->Get("run"), "b");  // the last one wins
  EXPECT_EQ(args->GetAll("skip"), (std::vector<std::string>{"1:2", "3:4"}));
  EXPECT_EQ(args->Get("dry-run"), "true");
  EXPECT_EQ(args->positional, (std::vector<std::string>{"ID"}));
  EXPECT_FALSE(args->help);
}

TEST(ParseArgsTest, NegativeNumbersAndWordsAfterDoubleDashArePositional) {
  const std::vector<std::string> words = {"-5", "--", "--run"};
  const std::vector<std::string> names = {"A", "B"};
  absl::StatusOr<ParsedArgs> args = ParseArgs(words, kFlags, names, 2);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->positional, (std::vector<std::string>{"-5", "--run"}));
}

TEST(ParseArgsTest, RejectsSingleDashWordsAndBadBooleans) {
  const std::vector<std::string> names;
  EXPECT_EQ(ParseArgs(std::vector<std::string>{"-x"}, kFlags, names, 0).status().message(),
            "unknown flag -x");
  EXPECT_EQ(ParseArgs(std::vector<std::string>{"--dry-run=maybe"}, kFlags, names, 0)
                .status()
                .message(),
            "bad value for --dry-run: 'maybe' (want true or false)");
}

TEST(ParseArgsTest, NumbersRejectTrailingJunkAndOverflow) {
  EXPECT_EQ(*ParseInt64("N", "-42"), -42);
  EXPECT_FALSE(ParseInt64("N", "42x").ok());
  EXPECT_FALSE(ParseInt64("N", "99999999999999999999").ok());
  EXPECT_FALSE(ParseInt64("N", "").ok());
  EXPECT_DOUBLE_EQ(*ParseDouble("S", "2.5"), 2.5);
  EXPECT_FALSE(ParseDouble("S", "nan").ok());
}

}  // namespace
}  // namespace spikeguard::cli
