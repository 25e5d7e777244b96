// A real spikeguardd process on a loopback port with a data dir in a temp
// dir, and spikectl run as a real process against it. Shared by the e2e
// tests. Both run as deployed: TLS, a tokens file, spikectl presenting the
// admin token (tests/e2e/security.h).
#pragma once

#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/e2e/process.h"
#include "tests/e2e/security.h"

namespace spikeguard::testing {

class Cluster {
 public:
  explicit Cluster(const TempDir& dir) : dir_(dir), port_(FreePort()), security_(dir) {
    addr_ = absl::StrCat("127.0.0.1:", port_);
  }

  const std::string& addr() const { return addr_; }
  std::string data_dir() const { return dir_.File("data"); }

  std::unique_ptr<Process> StartDaemon(const std::string& tag,
                                       const std::vector<std::string>& extra = {}) {
    const std::string port_file = dir_.File("port");
    std::remove(port_file.c_str());
    std::vector<std::string> argv = {SPIKEGUARDD, "--listen=" + addr_, "--data-dir=" + data_dir(),
                                     "--port-file=" + port_file};
    for (const auto& a : security_.DaemonArgs()) argv.push_back(a);
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = std::make_unique<Process>(argv, dir_.File("daemon-" + tag));
    for (int i = 0; i < 500 && ReadFile(port_file).empty(); ++i) {
      if (!p->running()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_FALSE(ReadFile(port_file).empty()) << "daemon did not start: " << p->err();
    return p;
  }

  RunResult Spikectl(std::vector<std::string> args, const std::string& tag) {
    std::vector<std::string> argv = {SPIKECTL, "--addr=" + addr_};
    for (const auto& a : security_.ClientArgs()) argv.push_back(a);
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, dir_.File("spikectl-" + tag + "-" + std::to_string(++calls_)));
  }

  // spikectl --output=json ARGS, parsed into `out`.
  template <typename Message>
  bool SpikectlJson(std::vector<std::string> args, const std::string& tag, Message* out) {
    args.insert(args.begin(), "--output=json");
    RunResult r = Spikectl(args, tag);
    if (r.code != 0) {
      last_error_ = r.err;
      return false;
    }
    return google::protobuf::util::JsonStringToMessage(r.out, out).ok();
  }
  const std::string& last_error() const { return last_error_; }
  const TestSecurity& security() const { return security_; }

 private:
  const TempDir& dir_;
  int port_;
  TestSecurity security_;
  std::string addr_;
  int calls_ = 0;
  std::string last_error_;
};

}  // namespace spikeguard::testing
