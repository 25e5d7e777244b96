// `--help` of the programs that parse Abseil flags (spikeguardd,
// spikeguard-tracegen) lists their own flags. Abseil's --help only lists
// flags defined in a file named after the program, so both used to print
// "No flags matched" (base/flag_usage.h). spikectl and spikeguard-worker
// parse their own arguments and print their usage.
#include <string>
#include <vector>

#include "base/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spikeguard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Help(const std::string& binary, const std::string& flag = "--help") {
  auto r = RunSubprocess({binary, flag});
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return "";
  return r->out + r->err;
}

TEST(HelpTest, SpikeguarddHelpListsTheDaemonsFlags) {
  for (const char* flag : {"--help", "--helpshort"}) {
    const std::string out = Help(SPIKEGUARDD, flag);
    EXPECT_THAT(out, Not(HasSubstr("No flags matched"))) << flag;
    EXPECT_THAT(out, HasSubstr("spikeguardd --listen=HOST:PORT")) << flag;  // the usage line
    // A few of the daemon's own flags, with their help text.
    EXPECT_THAT(out, HasSubstr("--listen")) << out;
    EXPECT_THAT(out, HasSubstr("HOST:PORT to serve on")) << out;
    EXPECT_THAT(out, HasSubstr("--data_dir")) << out;
    EXPECT_THAT(out, HasSubstr("--tokens")) << out;
    EXPECT_THAT(out, HasSubstr("--tls_cert")) << out;
    // Only the daemon's: not every library's (that is --helpfull).
    EXPECT_THAT(out, Not(HasSubstr("--flagfile"))) << out;
  }
}

TEST(HelpTest, TracegenHelpListsItsFlags) {
  const std::string out = Help(TRACEGEN);
  EXPECT_THAT(out, Not(HasSubstr("No flags matched")));
  EXPECT_THAT(out, HasSubstr("--addr"));
  EXPECT_THAT(out, HasSubstr("spikeguardd address"));
  EXPECT_THAT(out, HasSubstr("--spike_at"));
  EXPECT_THAT(out, HasSubstr("--steps_per_second"));
}

TEST(HelpTest, SpikectlAndWorkerHelpPrintTheirUsage) {
  EXPECT_THAT(Help(SPIKECTL), HasSubstr("usage: spikectl"));
  EXPECT_THAT(Help(WORKER), HasSubstr("spikeguard-worker corpus build"));
}

}  // namespace
}  // namespace spikeguard
