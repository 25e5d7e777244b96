// scale_bench: many ranks held for minutes against a real spikeguardd
// process.
//
//   scale_bench --daemon PATH/spikeguardd --out DIR [--ranks 10000]
//               [--minutes 10] [--step-seconds 3] [--layers 8] [--channels 16]
//               [--small-ranks 10] [--runs 500]
//
// Starts spikeguardd as a child process (its own RSS and threads are read
// from /proc), creates one run of --ranks ranks, and simulates every rank
// with the callback client API: one Attach stream per rank (hello, welcome,
// then one StepReport batch per step), many streams per HTTP/2 connection
// (--channels connections), all in this one process on a few threads. Each
// rank reports its next step every --step-seconds, the ranks spread evenly
// over that period. Every 10 s it prints: acks in the interval, ack latency
// p50/p99/max (batch handed to its stream -> its ack read), the oldest unacknowledged
// batch's age, the daemon's RSS and threads, catalog bytes and run-level
// steps completed. At the end: catalog bytes per completed step at --ranks
// and, from a second daemon, at --small-ranks, for the same number of steps
// (growth per step independent of rank count means the two match). RSS per
// connected rank is (RSS at the end - RSS before any rank attached) / ranks;
// RSS per run comes from a third daemon holding --runs runs of one rank each
// (each attached and 200 steps reported), against its RSS before them.
//
// A benchmark prints figures (DIR/scale_bench.md); it fails (exit 1) only
// when it cannot run.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sqlite3.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/detect/eval/trace_gen.h"
#include "tests/bench/daemon/bench_util.h"
#include "grpcpp/grpcpp.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"
#include "spikeguard/v1/worker.grpc.pb.h"

namespace {

namespace v1 = spikeguard::v1;
using spikeguard::bench::CatalogBytes;
using spikeguard::bench::Percentile;
using Clock = std::chrono::steady_clock;
using spikeguard::worker::TraceModel;
using spikeguard::worker::TraceSpec;

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "scale_bench: " << what << "\n";
  std::exit(1);
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// "VmRSS" (kB) or "Threads" of a process.
int64_t ProcStatus(pid_t pid, const std::string& key) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::string v = line.substr(key.size() + 1);
      v.erase(std::remove_if(v.begin(), v.end(), [](char c) { return !isdigit(c); }), v.end());
      int64_t n = -1;
      (void)absl::SimpleAtoi(v, &n);
      return n;
    }
  }
  return -1;
}

// A spikeguardd child process on a port it picked.
struct DaemonProcess {
  pid_t pid = -1;
  int port = 0;
  std::string dir;

  DaemonProcess(const std::string& binary, const std::string& data_dir, int ranks) : dir(data_dir) {
    std::filesystem::create_directories(dir);
    const std::string port_file = dir + "/port";
    std::filesystem::remove(port_file);
    pid = fork();
    if (pid < 0) Die("fork failed");
    if (pid == 0) {
      const std::string log = dir + "/daemon.log";
      // Dies with the bench; writes only to its log.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      FILE* f = freopen(log.c_str(), "w", stderr);
      FILE* o = freopen("/dev/null", "w", stdout);
      (void)f;
      (void)o;
      const std::string a1 = "--data-dir=" + dir, a2 = "--port-file=" + port_file,
                        a3 = absl::StrCat("--max-pending-hellos=", ranks + 64);
      execl(binary.c_str(), binary.c_str(), "--listen=127.0.0.1:0", a1.c_str(), a2.c_str(),
            a3.c_str(), "--allow-anonymous", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 300; ++i) {
      std::ifstream in(port_file);
      if (in >> port && port > 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    Die("spikeguardd did not write its port within 30 s (see " + dir + "/daemon.log)");
  }
  ~DaemonProcess() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
    }
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
  std::string catalog() const { return dir + "/catalog.db"; }
};

void CreateRun(const std::string& address, const std::string& run, uint32_t world_size) {
  auto stub = v1::SupervisorService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::CreateRunRequest req;
  req.set_name(run);
  req.set_world_size(world_size);
  req.set_mode(v1::MODE_OBSERVE);
  v1::Run out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Status s = stub->CreateRun(&ctx, req, &out);
  if (!s.ok()) Die(absl::StrCat("CreateRun ", run, ": ", s.error_message()));
}

int64_t StepsCompleted(const std::string& address, const std::string& run) {
  auto stub = v1::SupervisorService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::GetRunRequest req;
  req.set_name(run);
  v1::Run out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!stub->GetRun(&ctx, req, &out).ok()) return -1;
  return out.last_step() + 1;
}

// Latencies and counters shared by every stream.
struct Totals {
  std::mutex mu;
  std::vector<double> ack_ms;  // this interval
  double max_ack_ms = 0;       // whole run
  int64_t acks = 0;
  int64_t rejected = 0;
  int64_t welcomed = 0;
  int64_t ended = 0;
  std::string last_error;
};

// One simulated rank: an Attach stream driven by the callback API.
class RankStream : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::ControllerMessage> {
 public:
  RankStream(v1::WorkerService::Stub* stub, const std::string& run, uint32_t rank,
             uint32_t world_size, Totals* totals)
      : totals_(totals) {
    v1::WorkerMessage hello;
    auto* h = hello.mutable_hello();
    h->set_run(run);
    h->set_rank(rank);
    h->set_world_size(world_size);
    h->set_host("scale-bench");
    h->set_protocol("spikeguard.v1");
    stub->async()->Attach(&context_, this);
    Enqueue(std::move(hello));
    StartRead(&in_);
    StartCall();
  }

  // Sends one batch holding `report`.
  void Report(v1::StepReport report) {
    v1::WorkerMessage m;
    m.mutable_reports()->set_seq(++seq_);
    *m.mutable_reports()->add_reports() = std::move(report);
    {
      // Timed from when it is handed to the stream (its ack may be read
      // before its write's completion is).
      std::lock_guard<std::mutex> lock(mu_);
      sent_[seq_] = Clock::now();
    }
    Enqueue(std::move(m));
  }

  // Age of the oldest batch written and not yet acknowledged (0: none).
  double OldestUnackedMs(Clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_.empty() ? 0.0 : Ms(now - sent_.begin()->second);
  }

  void Cancel() { context_.TryCancel(); }
  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return done_; });
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) return;
    }
    StartNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (in_.has_welcome()) {
      std::lock_guard<std::mutex> lock(totals_->mu);
      ++totals_->welcomed;
    } else if (in_.has_ack()) {
      Clock::time_point sent;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = sent_.find(in_.ack().seq()); it != sent_.end()) {
          sent = it->second;
          sent_.erase(it);
        }
      }
      const double ms = sent == Clock::time_point() ? 0 : Ms(Clock::now() - sent);
      std::lock_guard<std::mutex> lock(totals_->mu);
      ++totals_->acks;
      totals_->rejected += in_.ack().rejected();
      if (in_.ack().rejected() > 0) totals_->last_error = in_.ack().message();
      totals_->ack_ms.push_back(ms);
      totals_->max_ack_ms = std::max(totals_->max_ack_ms, ms);
    } else if (in_.has_reject()) {
      std::lock_guard<std::mutex> lock(totals_->mu);
      totals_->last_error = in_.reject().message();
    }
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& s) override {
    {
      std::lock_guard<std::mutex> lock(totals_->mu);
      ++totals_->ended;
      if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
        totals_->last_error = s.error_message();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    done_cv_.notify_all();
  }

 private:
  void Enqueue(v1::WorkerMessage m) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(m));
    }
    StartNext();
  }
  // One write at a time (writing_, set under mu_); the next starts from
  // OnWriteDone. StartWrite is called outside mu_: gRPC may run a reaction
  // inline.
  void StartNext() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_ || queue_.empty()) return;
      writing_msg_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    StartWrite(&writing_msg_);
  }

  Totals* const totals_;
  grpc::ClientContext context_;
  v1::ControllerMessage in_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::deque<v1::WorkerMessage> queue_;
  v1::WorkerMessage writing_msg_;
  bool writing_ = false;
  std::map<uint64_t, Clock::time_point> sent_;  // by seq, until acknowledged
  uint64_t seq_ = 0;
};

struct Options {
  std::string daemon;
  std::string out;
  int ranks = 10'000;
  double minutes = 10;
  double step_seconds = 3;
  int layers = 8;
  int channels = 16;
  int small_ranks = 10;
  // Runs of one rank each for the per-run RSS figure (0: skipped).
  int runs = 500;
};

struct PhaseResult {
  int64_t steps = 0;
  int64_t catalog_bytes = 0;
  // Run-level step records: rows and payload bytes; per-rank rows.
  int64_t step_rows = 0;
  int64_t step_record_bytes = 0;
  int64_t rank_rows = 0;
};

// What the catalog holds per step and per rank, read after shutdown.
void ReadCatalogRows(const std::string& db, PhaseResult* out) {
  sqlite3* conn = nullptr;
  if (sqlite3_open_v2(db.c_str(), &conn, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    Die("cannot open " + db);
  }
  auto one = [&](const char* sql, int64_t* a, int64_t* b) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(conn, sql, -1, &st, nullptr) != SQLITE_OK) {
      Die(absl::StrCat("catalog query failed: ", sqlite3_errmsg(conn)));
    }
    if (sqlite3_step(st) == SQLITE_ROW) {
      *a = sqlite3_column_int64(st, 0);
      if (b != nullptr) *b = sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
  };
  one("SELECT COUNT(*), COALESCE(SUM(LENGTH(record)), 0) FROM step_telemetry", &out->step_rows,
      &out->step_record_bytes);
  one("SELECT COUNT(*) FROM rank_progress", &out->rank_rows, nullptr);
  sqlite3_close(conn);
}

// --channels HTTP/2 connections to the daemon (distinct channel args keep
// gRPC from sharing one), a WorkerService stub on each.
struct Connections {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  v1::WorkerService::Stub* For(int i) { return stubs[i % stubs.size()].get(); }
};

Connections Connect(const std::string& address, int n) {
  Connections c;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("spikeguard_bench_channel", i);  // distinct connections
    c.channels.push_back(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    c.stubs.push_back(v1::WorkerService::NewStub(c.channels.back()));
  }
  return c;
}

// Until `n` streams were welcomed (dies after 300 s or when one ended).
void AwaitWelcomes(Totals& totals, int n, const char* what) {
  const auto start = Clock::now();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(totals.mu);
      if (totals.welcomed == n) return;
      if (totals.ended > 0) Die("a stream ended before its welcome: " + totals.last_error);
      if (Clock::now() - start > std::chrono::seconds(300)) {
        Die(absl::StrCat("only ", totals.welcomed, " of ", n, " ", what, " welcomed in 300 s"));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Until every batch handed to `streams` is acknowledged.
void AwaitAllAcked(const std::vector<std::unique_ptr<RankStream>>& streams,
                   std::chrono::seconds limit) {
  const auto start = Clock::now();
  while (true) {
    double oldest = 0;
    const auto now = Clock::now();
    for (auto& st : streams) oldest = std::max(oldest, st->OldestUnackedMs(now));
    if (oldest == 0) return;
    if (now - start > limit) {
      Die(absl::StrCat("batches unacknowledged after ", limit.count(), " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// RSS per run: `runs` runs of one rank each, every rank attached and
// reporting `steps` steps (so each run has its detectors, pipeline, cache
// and stream), against the same daemon before the first run was created.
std::string RunsPhase(const Options& opt, const std::string& dir, int runs, int steps) {
  DaemonProcess daemon(opt.daemon, dir, runs);
  const int64_t rss_idle = ProcStatus(daemon.pid, "VmRSS");
  Connections conns = Connect(daemon.address(), opt.channels);
  Totals totals;
  std::vector<std::unique_ptr<RankStream>> streams;
  for (int i = 0; i < runs; ++i) {
    const std::string run = absl::StrCat("run-", i);
    CreateRun(daemon.address(), run, 1);
    streams.push_back(std::make_unique<RankStream>(conns.For(i), run, 0, 1, &totals));
  }
  AwaitWelcomes(totals, runs, "runs");
  TraceSpec spec;
  spec.layers = opt.layers;
  spec.seed = 4;
  TraceModel model(spec);
  for (int k = 0; k < steps; ++k) {
    for (auto& st : streams) st->Report(model.Report(0, k));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  AwaitAllAcked(streams, std::chrono::seconds(600));
  std::this_thread::sleep_for(std::chrono::seconds(2));  // pipelines drained
  const int64_t rss = ProcStatus(daemon.pid, "VmRSS");
  for (auto& st : streams) st->Cancel();
  for (auto& st : streams) st->WaitDone();
  return absl::StrFormat(
      "%d runs of one rank each, %d steps each, %d layers: daemon RSS %.1f -> %.1f MiB, %.1f KiB "
      "per run (with its one connected rank)",
      runs, steps, opt.layers, static_cast<double>(rss_idle) / 1024,
      static_cast<double>(rss) / 1024, static_cast<double>(rss - rss_idle) / runs);
}

// Holds `ranks` ranks for `seconds`; prints the 10 s samples when `verbose`.
PhaseResult RunPhase(const Options& opt, const std::string& dir, int ranks, double seconds,
                     double step_seconds, bool verbose, std::string* md) {
  DaemonProcess daemon(opt.daemon, dir, ranks);
  const std::string run = "scale";
  CreateRun(daemon.address(), run, static_cast<uint32_t>(ranks));
  // The daemon before any rank attached: the base of the per-rank figure.
  const int64_t rss_idle = ProcStatus(daemon.pid, "VmRSS");
  Connections conns = Connect(daemon.address(), opt.channels);
  Totals totals;
  std::vector<std::unique_ptr<RankStream>> streams;
  const auto connect_start = Clock::now();
  for (int r = 0; r < ranks; ++r) {
    streams.push_back(std::make_unique<RankStream>(conns.For(r), run, static_cast<uint32_t>(r),
                                                   static_cast<uint32_t>(ranks), &totals));
  }
  AwaitWelcomes(totals, ranks, "ranks");
  const double connect_s = Ms(Clock::now() - connect_start) / 1e3;
  if (verbose) {
    std::cout << absl::StrFormat("%d ranks attached in %.1f s over %d connections\n", ranks,
                                 connect_s, opt.channels);
    *md += absl::StrFormat("%d ranks attached in %.1f s over %d connections.\n\n", ranks,
                           connect_s, opt.channels);
    *md += "| t s | acks | ack p50 ms | ack p99 ms | ack max ms | oldest unacked ms | daemon RSS "
           "MiB | daemon threads | catalog MiB | run steps |\n|---:|---:|---:|---:|---:|---:|---:|"
           "---:|---:|---:|\n";
  }

  TraceSpec spec;
  spec.layers = opt.layers;
  spec.seed = 3;
  TraceModel model(spec);
  // Rank r reports step k at start + (k + r / ranks) * step_seconds.
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(seconds));
  std::vector<int64_t> next_step(ranks, 0);
  auto due = [&](int r, int64_t k) {
    return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                       (static_cast<double>(k) + static_cast<double>(r) / ranks) * step_seconds));
  };
  auto next_sample = start + std::chrono::seconds(10);
  double worst_unacked = 0;
  int64_t rss_first = -1, rss_last = -1, threads_min = 1 << 30, threads_max = 0;
  while (Clock::now() < end) {
    const auto now = Clock::now();
    for (int r = 0; r < ranks; ++r) {
      while (due(r, next_step[r]) <= now) {
        streams[r]->Report(model.Report(static_cast<uint32_t>(r), next_step[r]));
        ++next_step[r];
      }
    }
    if (now >= next_sample) {
      next_sample += std::chrono::seconds(10);
      double oldest = 0;
      for (auto& s : streams) oldest = std::max(oldest, s->OldestUnackedMs(now));
      worst_unacked = std::max(worst_unacked, oldest);
      std::vector<double> lat;
      int64_t acks;
      {
        std::lock_guard<std::mutex> lock(totals.mu);
        lat.swap(totals.ack_ms);
        acks = totals.acks;
        if (totals.rejected > 0) Die("reports rejected: " + totals.last_error);
      }
      const int64_t rss = ProcStatus(daemon.pid, "VmRSS");
      const int64_t threads = ProcStatus(daemon.pid, "Threads");
      if (rss_first < 0) rss_first = rss;
      rss_last = rss;
      threads_min = std::min(threads_min, threads);
      threads_max = std::max(threads_max, threads);
      const double t = Ms(now - start) / 1e3;
      const double mib = static_cast<double>(CatalogBytes(daemon.catalog())) / (1 << 20);
      const int64_t steps = StepsCompleted(daemon.address(), run);
      if (verbose) {
        const std::string row = absl::StrFormat(
            "| %.0f | %d | %.2f | %.2f | %.2f | %.0f | %.1f | %d | %.1f | %d |", t, acks,
            Percentile(lat, 0.5), Percentile(lat, 0.99),
            lat.empty() ? 0.0 : *std::max_element(lat.begin(), lat.end()), oldest,
            static_cast<double>(rss) / 1024, threads, mib, steps);
        std::cout << row << "\n" << std::flush;
        *md += row + "\n";
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Drain: every batch acknowledged.
  AwaitAllAcked(streams, std::chrono::seconds(120));
  PhaseResult result;
  result.steps = StepsCompleted(daemon.address(), run);
  for (auto& s : streams) s->Cancel();
  for (auto& s : streams) s->WaitDone();
  if (verbose) {
    double max_ack;
    {
      std::lock_guard<std::mutex> lock(totals.mu);
      max_ack = totals.max_ack_ms;
    }
    const std::string summary = absl::StrFormat(
        "%d ranks, %.0f s, one step every %.1f s per rank, %d layers: %d acks, ack max %.1f ms, "
        "oldest unacknowledged batch at any sample %.0f ms; daemon RSS %.1f -> %.1f MiB, "
        "%.1f MiB before any rank attached: %.1f KiB per connected rank at the end "
        "((RSS - idle RSS) / ranks), threads %d..%d",
        ranks, seconds, step_seconds, opt.layers, totals.acks, max_ack, worst_unacked,
        static_cast<double>(rss_first) / 1024, static_cast<double>(rss_last) / 1024,
        static_cast<double>(rss_idle) / 1024,
        static_cast<double>(rss_last - rss_idle) / ranks, threads_min, threads_max);
    std::cout << summary << "\n";
    *md += "\n" + summary + ".\n\n";
  }
  streams.clear();
  // The catalog after a clean shutdown (the WAL checkpointed).
  kill(daemon.pid, SIGTERM);
  int status = 0;
  waitpid(daemon.pid, &status, 0);
  daemon.pid = -1;
  result.catalog_bytes = CatalogBytes(daemon.catalog());
  ReadCatalogRows(daemon.catalog(), &result);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    auto number = [&](double* out) {
      if (!absl::SimpleAtod(value(), out)) Die("not a number after " + a);
    };
    double d = 0;
    if (a == "--daemon") {
      opt.daemon = value();
    } else if (a == "--out") {
      opt.out = value();
    } else if (a == "--ranks") {
      number(&d);
      opt.ranks = static_cast<int>(d);
    } else if (a == "--minutes") {
      number(&opt.minutes);
    } else if (a == "--step-seconds") {
      number(&opt.step_seconds);
    } else if (a == "--layers") {
      number(&d);
      opt.layers = static_cast<int>(d);
    } else if (a == "--channels") {
      number(&d);
      opt.channels = std::max(1, static_cast<int>(d));
    } else if (a == "--small-ranks") {
      number(&d);
      opt.small_ranks = static_cast<int>(d);
    } else if (a == "--runs") {
      number(&d);
      opt.runs = static_cast<int>(d);
    } else {
      Die("usage: scale_bench --daemon PATH --out DIR [--ranks N] [--minutes M] "
          "[--step-seconds S] [--layers L] [--channels C] [--small-ranks N] [--runs N]");
    }
  }
  if (opt.daemon.empty() || opt.out.empty()) Die("--daemon and --out are required");
  if (opt.ranks < 1 || opt.small_ranks < 1 || opt.step_seconds <= 0 || opt.minutes <= 0) {
    Die("--ranks, --small-ranks, --step-seconds and --minutes must be positive");
  }
  std::filesystem::create_directories(opt.out);
  std::string tmpl = (std::filesystem::temp_directory_path() / "scale-bench-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp failed");
  const std::string scratch = tmpl;

  std::string md = "# Scale run\n\n";
  const PhaseResult big =
      RunPhase(opt, scratch + "/big", opt.ranks, opt.minutes * 60, opt.step_seconds, true, &md);
  // The same number of steps at few ranks, quickly.
  const double small_step = 0.05;
  const PhaseResult small = RunPhase(opt, scratch + "/small", opt.small_ranks,
                                     static_cast<double>(big.steps) * small_step, small_step,
                                     false, &md);
  auto per = [](int64_t bytes, int64_t rows) {
    return rows > 0 ? static_cast<double>(bytes) / static_cast<double>(rows) : 0.0;
  };
  const std::string growth = absl::StrFormat(
      "catalog after a clean shutdown: %d ranks: %d step rows, %.0f record bytes per step, %d "
      "rank rows, file %d bytes; %d ranks: %d step rows, %.0f record bytes per step, %d rank "
      "rows, file %d bytes",
      opt.ranks, big.step_rows, per(big.step_record_bytes, big.step_rows), big.rank_rows,
      big.catalog_bytes, opt.small_ranks, small.step_rows,
      per(small.step_record_bytes, small.step_rows), small.rank_rows, small.catalog_bytes);
  std::cout << growth << "\n";
  md += growth + ".\n";
  if (opt.runs > 0) {
    const std::string per_run = RunsPhase(opt, scratch + "/runs", opt.runs, 200);
    std::cout << per_run << "\n";
    md += "\n" + per_run + ".\n";
  }
  std::ofstream(opt.out + "/scale_bench.md") << md;
  std::cout << "wrote " << opt.out << "/scale_bench.md\n";
  std::error_code ec;
  std::filesystem::remove_all(scratch, ec);
  return 0;
}
