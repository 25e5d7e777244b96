// A real single-node Slurm for tests: munged, slurmctld and slurmd from
// Debian's slurm-wlm and munge, as children of the test, with their own
// munge key and socket, ports, state, spool and logs in a temp dir, so that
// nothing of the machine's own Slurm or munge (if any) is used or changed.
//
// What this sandbox needs (and a real cluster would not): no cgroups, so
// ProctrackType=proctrack/linuxproc and TaskPlugin=task/none; no accounting
// daemon, so job state comes from `scontrol show job` (kept MinJobAge after
// the job ends) rather than sacct; SlurmUser=root (the tests run as root:
// slurmd must be able to start jobs).
//
//   SlurmCluster slurm(dir);
//   ASSERT_TRUE(slurm.Start()) << slurm.error();
//   slurm.env()  // {"SLURM_CONF": ...} for every client command
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/subprocess.h"
#include "tests/e2e/process.h"

namespace spikeguard::testing {

class SlurmCluster {
 public:
  explicit SlurmCluster(const TempDir& dir) : root_(dir.File("slurm")) {}
  ~SlurmCluster() { Stop(); }

  // Empty when this machine can run the cluster; else why not (the test
  // skips, naming it: the packages are installed by deploy/install-deps.sh).
  static std::string Unavailable() {
    for (const char* bin : {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
                            "/usr/bin/sbatch", "/usr/bin/scontrol"}) {
      if (access(bin, X_OK) != 0) {
        return absl::StrCat(bin, " is not installed (deploy/install-deps.sh installs slurm-wlm and munge)");
      }
    }
    if (geteuid() != 0) return "slurmd must run as root to start jobs, and this test is not root";
    return "";
  }

  bool Start() {
    namespace fs = std::filesystem;
    for (const char* d : {"state", "spool", "log", "munge"}) fs::create_directories(root_ + "/" + d);
    fs::permissions(root_ + "/munge", fs::perms::owner_all, fs::perm_options::replace);
    // A fresh munge key for this cluster only.
    {
      std::ifstream rnd("/dev/urandom", std::ios::binary);
      std::string key(128, '\0');
      rnd.read(key.data(), key.size());
      std::ofstream(root_ + "/munge/munge.key", std::ios::binary) << key;
      fs::permissions(root_ + "/munge/munge.key", fs::perms::owner_read | fs::perms::owner_write,
                      fs::perm_options::replace);
    }
    const std::string sock = root_ + "/munge/munge.sock";
    munged_ = std::make_unique<Process>(
        std::vector<std::string>{"/usr/sbin/munged", "--foreground", "--force",
                                 "--socket=" + sock, "--key-file=" + root_ + "/munge/munge.key",
                                 "--pid-file=" + root_ + "/munge/munged.pid",
                                 "--seed-file=" + root_ + "/munge/munged.seed",
                                 "--log-file=" + root_ + "/log/munged.log"},
        root_ + "/log/munged");
    if (!WaitFor([&] { return std::filesystem::exists(sock); }, absl::Seconds(10))) {
      error_ = "munged did not start: " + munged_->err();
      return false;
    }
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    host_ = std::string(host).substr(0, std::string(host).find('.'));
    const int cpus = std::max(2u, std::thread::hardware_concurrency());
    conf_ = root_ + "/slurm.conf";
    std::ofstream(conf_) << absl::StrFormat(
        "ClusterName=sgtest\n"
        "SlurmctldHost=%s\n"
        "SlurmctldPort=%d\nSlurmdPort=%d\n"
        "AuthType=auth/munge\nAuthInfo=socket=%s\nCredType=cred/munge\n"
        "SlurmUser=root\nSlurmdUser=root\n"
        "StateSaveLocation=%s/state\nSlurmdSpoolDir=%s/spool\n"
        "SlurmctldPidFile=%s/slurmctld.pid\nSlurmdPidFile=%s/slurmd.pid\n"
        "SlurmctldLogFile=%s/log/slurmctld.log\nSlurmdLogFile=%s/log/slurmd.log\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
        "MpiDefault=none\nJobAcctGatherType=jobacct_gather/none\n"
        "ReturnToService=2\nMinJobAge=600\nKillWait=5\n"
        // The node may promise more CPUs than the machine has (tests run
        // several small jobs at once on 2 cores).
        "SlurmdParameters=config_overrides\n"
        // Short timers, so a test's job starts and ends in seconds.
        "SchedulerParameters=sched_interval=1\nMessageTimeout=10\n"
        "NodeName=%s CPUs=%d RealMemory=4000 State=UNKNOWN\n"
        "PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
        host_, FreePort(), FreePort(), sock, root_, root_, root_, root_, root_, root_, host_, cpus * 4,
        host_);
    ctld_ = std::make_unique<Process>(
        std::vector<std::string>{"/usr/sbin/slurmctld", "-D", "-i", "-f", conf_}, root_ + "/log/ctld");
    slurmd_ = std::make_unique<Process>(
        std::vector<std::string>{"/usr/sbin/slurmd", "-D", "-f", conf_}, root_ + "/log/slurmd");
    // Up when the node shows idle.
    if (!WaitFor(
            [&] {
              auto r = Run({"/usr/bin/sinfo", "-h", "-o", "%t"});
              return r.ok() && r->exit_code == 0 && r->out.find("idle") != std::string::npos;
            },
            absl::Seconds(60))) {
      error_ = absl::StrCat("the Slurm node did not become idle; slurmctld: ", ctld_->err(),
                            " slurmd: ", slurmd_->err(), " log: ", ReadFile(root_ + "/log/slurmctld.log"));
      return false;
    }
    return true;
  }

  void Stop() {
    if (ctld_ == nullptr && munged_ == nullptr) return;
    if (ctld_ && ctld_->running()) {
      // Jobs first, so that no task outlives the cluster.
      (void)Run({"/usr/bin/scancel", "--full", "--partition=debug"});
      WaitFor([&] {
        auto r = Run({"/usr/bin/squeue", "-h"});
        return !r.ok() || r->out.empty();
      }, absl::Seconds(15));
    }
    for (auto* p : {&slurmd_, &ctld_, &munged_}) {
      if (*p && (*p)->running()) {
        (*p)->Kill(SIGTERM);
        if (!(*p)->Wait(std::chrono::seconds(10))) (*p)->Kill(SIGKILL);
      }
      p->reset();
    }
  }

  const std::string& conf() const { return conf_; }
  const std::string& host() const { return host_; }
  const std::string& error() const { return error_; }
  std::map<std::string, std::string> env() const { return {{"SLURM_CONF", conf_}}; }
  std::string log(const std::string& name) const { return ReadFile(root_ + "/log/" + name); }
  // The cluster's directory (state, spool, logs).
  const std::string& root() const { return root_; }

  absl::StatusOr<SubprocessResult> Run(std::vector<std::string> argv) const {
    SubprocessOptions o;
    o.env = env();
    o.timeout = absl::Seconds(20);
    return RunSubprocess(argv, o);
  }

  template <typename Pred>
  static bool WaitFor(Pred pred, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return pred();
  }

 private:
  std::string root_;
  std::string conf_;
  std::string host_;
  std::string error_;
  std::unique_ptr<Process> munged_, ctld_, slurmd_;
};

}  // namespace spikeguard::testing
