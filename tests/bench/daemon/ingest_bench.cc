// ingest_bench: the daemon's own figures.
//
//   ingest_bench --out DIR [--reports N] [--latency-samples N]
//                [--memory-steps N] [--catalog-steps N]
//
// Everything runs in this one process, on loopback, against a real
// spikeguardd (`daemon::Daemon`, real SQLite file in a temp dir) and real
// `WorkerClient`s — the library every trainer links:
//
//   1. ingest rate: StepReports per second with 32-layer stats over 1, 8 and
//      64 concurrent rank streams of one run, next to the same streams into a
//      null WorkerService (a tiny gRPC server that acknowledges every batch
//      and does nothing else — the transport's own limit), and their ratio;
//   2. detection latency: from the moment the client is handed the report of
//      a spike step to the moment the "opened" incident update arrives on a
//      WatchIncidents stream (an operator's view), p50 / p99; and in the
//      daemon, from a record's arrival to the decision on it
//      and, for the records that opened an incident, to its "opened" event
//      durable and published;
//   3. memory: RSS of this process every 10,000 steps while one run streams
//      100,000+ steps (4 layers): flat means bounded windows;
//   4. catalog growth: bytes of catalog.db (+ -wal, -shm) per step for a
//      64-layer model at 1 and 8 ranks, measured after a clean shutdown.
//
// Writes DIR/ingest_bench.md and DIR/ingest_bench.json. A benchmark prints
// figures; it fails (exit 1) only when it cannot run or the daemon lost
// reports.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/barrier.h"
#include "daemon/daemon.h"
#include "grpcpp/grpcpp.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"
#include "spikeguard/v1/worker.grpc.pb.h"
#include "worker/client/worker_client.h"
#include "daemon/detect/eval/trace_gen.h"
#include "tests/bench/daemon/bench_util.h"

namespace {

namespace v1 = spikeguard::v1;
using spikeguard::bench::CatalogBytes;
using spikeguard::bench::Percentile;
using spikeguard::daemon::Daemon;
using spikeguard::metrics::DetectionLatency;
using spikeguard::worker::TraceModel;
using spikeguard::worker::TraceSpec;
using spikeguard::worker::WorkerClient;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "ingest_bench: " << what << "\n";
  std::exit(1);
}

// A fresh directory under the system temp dir, removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ingest-bench-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

int64_t RssKb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kb = 0;
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 6 - 3)), &kb);
      return kb;
    }
  }
  return -1;
}

// The transport's own limit: welcomes every stream and acknowledges every
// batch as accepted, storing nothing. A synchronous service (a thread per
// stream): the fastest way to answer few streams, so the ratio is a
// conservative share of the transport's limit for the daemon's callback
// service.
class NullWorkerService final : public v1::WorkerService::Service {
 public:
  grpc::Status Attach(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::ControllerMessage, v1::WorkerMessage>* stream)
      override {
    v1::WorkerMessage msg;
    if (!stream->Read(&msg) || !msg.has_hello()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no hello");
    }
    v1::ControllerMessage welcome;
    welcome.mutable_welcome()->set_run(msg.hello().run());
    welcome.mutable_welcome()->set_generation(msg.hello().generation());
    welcome.mutable_welcome()->set_committed_step(-1);
    if (!stream->Write(welcome)) return grpc::Status::OK;
    while (stream->Read(&msg)) {
      if (!msg.has_reports()) continue;
      v1::ControllerMessage ack;
      ack.mutable_ack()->set_seq(msg.reports().seq());
      ack.mutable_ack()->set_accepted(msg.reports().reports_size());
      if (!stream->Write(ack)) break;
    }
    return grpc::Status::OK;
  }
};

class NullServer {
 public:
  NullServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) Die("null WorkerService did not start");
  }
  ~NullServer() { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5)); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  NullWorkerService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Exact in-daemon detection latencies (Daemon::Options::
// detection_latency_observer): calm records (arrival -> detectors and engine
// done), and the records that opened an incident, twice: arrival -> the
// engine's decision to open it, and -> its "opened" event durable and
// published.
struct LatencySamples {
  std::mutex mu;
  std::vector<double> calm_ms, decided_ms, opened_ms;
};

std::unique_ptr<Daemon> StartDaemon(const std::string& data_dir,
                                    LatencySamples* samples = nullptr) {
  Daemon::Options options;
  options.listen = "127.0.0.1:0";
  options.data_dir = data_dir;
  options.allow_anonymous = true;  // the benchmark measures ingest, not authentication
  if (samples != nullptr) {
    options.detection_latency_observer = [samples](const DetectionLatency& latency) {
      const double ms = absl::ToDoubleMilliseconds(latency.decision);
      std::lock_guard<std::mutex> lock(samples->mu);
      if (!latency.opened) {
        samples->calm_ms.push_back(ms);
        return;
      }
      samples->decided_ms.push_back(ms);
      samples->opened_ms.push_back(absl::ToDoubleMilliseconds(*latency.opened));
    };
  }
  auto daemon = Daemon::Start(options);
  if (!daemon.ok()) Die(absl::StrCat("daemon did not start: ", daemon.status().ToString()));
  return std::move(*daemon);
}

std::unique_ptr<v1::SupervisorService::Stub> SupervisorStub(int port) {
  return v1::SupervisorService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
}

void CreateRun(int port, const std::string& run, uint32_t world_size) {
  auto stub = SupervisorStub(port);
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

std::unique_ptr<WorkerClient> Connect(const std::string& address, const std::string& run,
                                      uint32_t rank, uint32_t world_size, int batch_reports) {
  WorkerClient::Options o;
  o.address = address;
  o.run = run;
  o.rank = rank;
  o.world_size = world_size;
  o.host = "bench";
  o.max_batch_reports = batch_reports;
  auto client = WorkerClient::Start(o);
  if (!client.ok()) Die(absl::StrCat("client: ", client.status().ToString()));
  if (auto s = (*client)->WaitForWelcome(absl::Seconds(30)); !s.ok()) {
    Die(absl::StrCat("rank ", rank, " of ", run, ": ", s.ToString()));
  }
  return std::move(*client);
}

// Reports of a healthy run late in its decay (nearly flat loss), reused
// cyclically with the step rewritten so that building them costs the same
// (almost nothing) against both servers.
std::vector<v1::StepReport> ReportPool(int layers, int n) {
  TraceSpec spec;
  spec.layers = layers;
  spec.seed = 11;
  TraceModel model(spec);
  std::vector<v1::StepReport> pool;
  for (int i = 0; i < n; ++i) pool.push_back(model.Report(0, 20'000 + i));
  return pool;
}

struct StreamResult {
  double seconds = 0;
  int64_t reports = 0;
  int64_t acked = 0;
  double rate() const { return seconds > 0 ? static_cast<double>(reports) / seconds : 0; }
};

// `ranks` concurrent streams of `run`, `steps` reports each, timed from the
// moment every stream is welcomed until every report is acknowledged.
StreamResult StreamRanks(const std::string& address, const std::string& run, int ranks,
                         int64_t steps, const std::vector<v1::StepReport>& pool,
                         int batch_reports) {
  std::vector<std::unique_ptr<WorkerClient>> clients(ranks);
  std::vector<std::thread> connect;
  for (int r = 0; r < ranks; ++r) {
    connect.emplace_back([&, r] { clients[r] = Connect(address, run, r, ranks, batch_reports); });
  }
  for (auto& t : connect) t.join();

  absl::Barrier* start = new absl::Barrier(ranks + 1);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      WorkerClient& c = *clients[r];
      if (start->Block()) delete start;
      v1::StepReport report;
      for (int64_t s = 0; s < steps; ++s) {
        report = pool[static_cast<size_t>(s + r) % pool.size()];
        report.set_step(s);
        report.set_data_position(s);
        c.Report(report);
      }
      if (!c.Flush(absl::Minutes(5)).ok()) failures.fetch_add(1);
    });
  }
  const auto t0 = Clock::now();
  if (start->Block()) delete start;
  for (auto& t : threads) t.join();
  StreamResult result;
  result.seconds = Seconds(Clock::now() - t0);
  result.reports = static_cast<int64_t>(ranks) * steps;
  for (auto& c : clients) {
    result.acked += c->stats().reports_acked;
    c->Close();
  }
  if (failures.load() > 0) Die(absl::StrCat(failures.load(), " stream(s) of ", run, " did not flush"));
  return result;
}

// Receives a WatchIncidents stream on its own thread and time-stamps each
// update on arrival.
class IncidentWatch {
 public:
  IncidentWatch(int port, const std::string& run) : stub_(SupervisorStub(port)) {
    v1::WatchIncidentsRequest req;
    req.set_run(run);
    reader_ = stub_->WatchIncidents(&ctx_, req);
    thread_ = std::thread([this] {
      v1::IncidentUpdate u;
      while (reader_->Read(&u)) {
        const auto now = Clock::now();
        std::lock_guard<std::mutex> lock(mu_);
        updates_.push_back({now, u});
        cv_.notify_all();
      }
    });
  }
  ~IncidentWatch() {
    ctx_.TryCancel();
    thread_.join();
    (void)reader_->Finish();
  }

  // Waits for an update matching `pred`; false on timeout.
  template <typename Pred>
  bool WaitFor(Pred pred, Clock::time_point* at, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = Clock::now() + timeout;
    while (true) {
      for (auto it = updates_.begin(); it != updates_.end(); ++it) {
        if (pred(it->second)) {
          if (at != nullptr) *at = it->first;
          updates_.erase(updates_.begin(), it + 1);
          return true;
        }
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) return false;
    }
  }

 private:
  std::unique_ptr<v1::SupervisorService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::IncidentUpdate>> reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<Clock::time_point, v1::IncidentUpdate>> updates_;
  std::thread thread_;
};

// This disk's durable-write latency as an opening group's commit meets it:
// ten write-ahead log frames (24-byte header and 4 KiB page, written apart,
// as SQLite writes them) then fdatasync, `samples` times, in a file beside
// the catalogs. Every commit waits for this; it is the floor under the
// opening latency, and it moves with the machine.
struct DiskFigures {
  double p50 = 0, p99 = 0, max = 0;
};
DiskFigures ProbeDisk(const std::string& dir, int samples) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/disk-probe";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) Die(absl::StrCat("cannot open ", path));
  constexpr int kFrames = 10;
  constexpr off_t kFrame = 24 + 4096;
  const std::string header(24, 'h'), page(4096, 'p');
  std::vector<double> ms;
  off_t at = 0;
  for (int i = 0; i < samples; ++i) {
    const auto t0 = Clock::now();
    for (int f = 0; f < kFrames; ++f, at += kFrame) {
      if (pwrite(fd, header.data(), header.size(), at) < 0 ||
          pwrite(fd, page.data(), page.size(), at + 24) < 0) {
        Die(absl::StrCat("cannot write ", path));
      }
    }
    if (fdatasync(fd) != 0) Die(absl::StrCat("cannot fdatasync ", path));
    ms.push_back(1e3 * Seconds(Clock::now() - t0));
    if (at > 1000 * kFrame) at = 0;  // a log that starts over, as after a checkpoint
  }
  close(fd);
  std::filesystem::remove(path);
  DiskFigures d;
  d.p50 = Percentile(ms, 0.50);
  d.p99 = Percentile(ms, 0.99);
  d.max = *std::max_element(ms.begin(), ms.end());
  return d;
}

struct Options {
  std::string out_dir;
  int64_t reports = 32'000;        // per ingest configuration
  int latency_samples = 500;
  int64_t memory_steps = 200'000;
  int64_t catalog_steps = 2'000;
  int batch_reports = 256;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(absl::StrCat(a, " needs a value"));
      return argv[++i];
    };
    auto number = [&](int64_t* v) {
      const std::string s = next();
      if (!absl::SimpleAtoi(s, v) || *v <= 0) Die(absl::StrCat(a, ": not a positive number: ", s));
    };
    int64_t n = 0;
    if (a == "--out") {
      opt.out_dir = next();
    } else if (a == "--reports") {
      number(&opt.reports);
    } else if (a == "--latency-samples") {
      number(&n);
      opt.latency_samples = static_cast<int>(n);
    } else if (a == "--memory-steps") {
      number(&opt.memory_steps);
    } else if (a == "--catalog-steps") {
      number(&opt.catalog_steps);
    } else if (a == "--batch-reports") {
      number(&n);
      opt.batch_reports = static_cast<int>(n);
    } else {
      std::cerr << "usage: ingest_bench --out DIR [--reports N] [--latency-samples N] "
                   "[--memory-steps N] [--catalog-steps N] [--batch-reports N]\n";
      return 2;
    }
  }
  if (opt.out_dir.empty()) Die("--out DIR is required");
  // The daemon logs every attach and incident; the figures are the output.
  setenv("SPIKEGUARD_LOG_LEVEL", "WARNING", /*overwrite=*/0);
  std::filesystem::create_directories(opt.out_dir);
  ScratchDir scratch;
  const unsigned cores = std::thread::hardware_concurrency();
  std::string md = absl::StrFormat(
      "# Daemon figures (ingest_bench)\n\nOne process on %u core(s): in-process spikeguardd on "
      "loopback with a real SQLite catalog, real WorkerClient streams. Client, server and "
      "storage share the cores.\n\n",
      cores);
  std::vector<std::string> json;

  // ---- 1. Ingest rate -------------------------------------------------------
  {
    const auto pool = ReportPool(32, 512);
    std::cout << "ingest: 32-layer StepReports, " << opt.reports << " per configuration, batches of "
              << opt.batch_reports << "\n";
    md += absl::StrFormat(
        "## Ingest rate (32-layer StepReports)\n\n| streams | daemon reports/s | null server "
        "reports/s | daemon / null | daemon steps/s | before: daemon / null |\n"
        "|---:|---:|---:|---:|---:|---:|\n");
    std::vector<std::string> rows;
    for (int ranks : {1, 8, 64}) {
      const int64_t steps = std::max<int64_t>(1, opt.reports / ranks);
      StreamResult null_result;
      {
        NullServer null_server;
        null_result = StreamRanks(null_server.address(), "null", ranks, steps, pool,
                                  opt.batch_reports);
      }
      StreamResult daemon_result;
      {
        auto daemon = StartDaemon(scratch.Sub(absl::StrCat("ingest-", ranks)));
        const std::string run = absl::StrCat("ingest-", ranks);
        CreateRun(daemon->port(), run, ranks);
        daemon_result = StreamRanks(absl::StrCat("127.0.0.1:", daemon->port()), run, ranks, steps,
                                    pool, opt.batch_reports);
        daemon->Shutdown(absl::Seconds(10));
      }
      if (daemon_result.acked != daemon_result.reports) {
        Die(absl::StrCat("daemon acknowledged ", daemon_result.acked, " of ",
                         daemon_result.reports, " reports at ", ranks, " streams"));
      }
      const double ratio = daemon_result.rate() / null_result.rate();
      std::cout << absl::StrFormat(
          "  %2d stream(s): daemon %8.0f reports/s, null server %8.0f reports/s, ratio %.3f "
          "(before: %.3f)\n",
          ranks, daemon_result.rate(), null_result.rate(), ratio,
          ranks == 1 ? 0.072 : ranks == 8 ? 0.284 : 0.173);
      // Measured with the binary of commit 2e2d7f9 (one transaction per
      // stream batch, detection on the RPC threads) on the 2-core build machine.
      const double before = ranks == 1 ? 0.072 : ranks == 8 ? 0.284 : 0.173;
      md += absl::StrFormat("| %d | %.0f | %.0f | %.3f | %.0f | %.3f |\n", ranks,
                            daemon_result.rate(), null_result.rate(), ratio,
                            daemon_result.rate() / ranks, before);
      rows.push_back(absl::StrFormat(
          "{\"streams\": %d, \"reports\": %d, \"daemon_reports_per_s\": %.1f, "
          "\"null_reports_per_s\": %.1f, \"ratio\": %.4f, \"daemon_seconds\": %.3f, "
          "\"null_seconds\": %.3f}",
          ranks, daemon_result.reports, daemon_result.rate(), null_result.rate(), ratio,
          daemon_result.seconds, null_result.seconds));
    }
    md += absl::StrFormat(
        "\nReports per second from the first report until every report is acknowledged "
        "(acknowledged = committed to SQLite and delivered to the detectors), %d-report batches; "
        "the null server acknowledges without doing anything, so daemon / null is the share of "
        "the transport's limit the daemon keeps. Daemon steps/s = run-level steps completed per "
        "second (all ranks reported).\n\n",
        opt.batch_reports);
    json.push_back(absl::StrCat("\"ingest\": {\"layers\": 32, \"batch_reports\": ",
                                opt.batch_reports, ", \"cores\": ", cores, ", \"rows\": [",
                                absl::StrJoin(rows, ", "), "]}"));
  }

  // ---- 2. Detection latency -------------------------------------------------
  const DiskFigures disk_before = ProbeDisk(scratch.Sub("disk"), 1000);
  md += "## Detection latency\n\n| streams | incident commit | spikes | p50 ms | p99 ms | max ms | "
        "batch ack p50 ms | batch ack p99 ms | before: p50 ms | before: p99 ms | in daemon, calm p50 "
        "ms | calm p99 ms | opening, decision p50 ms | decision p99 ms | opening, durable p50 ms | "
        "durable p99 ms | last stop: durable p99 ms | all (decision) p99 ms | before: all p99 ms "
        "|\n"
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|\n";
  std::vector<std::string> latency_rows;
  // The incident's "opened" write commits on its own, after the group that
  // carried the spike (the committer waits for nothing of detection's).
  for (const int ranks : {1, 8}) {
    const bool join = false;
    const char* commit = "own";
    LatencySamples in_daemon;
    auto daemon = StartDaemon(scratch.Sub(absl::StrCat("latency-", ranks)), &in_daemon);
    const std::string run = absl::StrCat("latency-", ranks);
    CreateRun(daemon->port(), run, ranks);
    auto watch = std::make_unique<IncidentWatch>(daemon->port(), run);
    std::vector<std::unique_ptr<WorkerClient>> clients;
    for (int r = 0; r < ranks; ++r) {
      clients.push_back(Connect(absl::StrCat("127.0.0.1:", daemon->port()), run,
                                static_cast<uint32_t>(r), static_cast<uint32_t>(ranks), 64));
    }
    TraceSpec spec;
    spec.layers = 32;
    spec.seed = 5;
    TraceModel model(spec);
    // A spike is a loss jump corroborated by the grad norm (run_monitor.h: a
    // lone one-step loss excursion is a blip, not an incident).
    auto report_all = [&](int64_t step, double scale) {
      for (int r = 0; r < ranks; ++r) {
        v1::StepReport report = model.Report(r, step);
        report.set_loss(report.loss() * scale);
        report.set_grad_norm(report.grad_norm() * (scale > 1 ? 10 * scale : 1));
        clients[r]->Report(report);
      }
    };
    // Every rank flushes at once (a sequential flush would add one round
    // trip per rank before the step is complete).
    auto flush_all = [&](const char* what) {
      std::atomic<bool> failed{false};
      std::vector<std::thread> flushers;
      for (auto& c : clients) {
        flushers.emplace_back([&failed, client = c.get()] {
          if (!client->Flush(absl::Seconds(60)).ok()) failed = true;
        });
      }
      for (auto& t : flushers) t.join();
      if (failed) Die(absl::StrCat(what, " did not flush"));
    };
    // Start late in the decay; warm the detector past min_samples.
    constexpr int64_t kFirst = 20'000, kWarm = 100, kGap = 30;
    int64_t step = kFirst;
    for (; step < kFirst + kWarm; ++step) report_all(step, 1.0);
    flush_all("latency warm-up");
    // The warm-up went out as one 100-step backlog: its records' latency is
    // that queue's, not a trainer's step. Let the pipeline finish it, then
    // count only what follows.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    {
      std::lock_guard<std::mutex> lock(in_daemon.mu);
      in_daemon.calm_ms.clear();
      in_daemon.decided_ms.clear();
      in_daemon.opened_ms.clear();
    }
    std::vector<double> detect_ms, ack_ms;
    for (int k = 0; k < opt.latency_samples; ++k) {
      const int64_t onset = step;
      const auto t0 = Clock::now();
      report_all(step, 3.0);  // far over every threshold, grad norm 30x
      flush_all("spike batch");
      const auto acked = Clock::now();
      Clock::time_point opened;
      const bool seen = watch->WaitFor(
          [&](const v1::IncidentUpdate& u) {
            return u.event().kind() == "opened" && u.incident().onset_step() == onset;
          },
          &opened, std::chrono::seconds(30));
      if (!seen) Die(absl::StrCat("no incident opened for the spike at step ", onset));
      // Observe mode closes the incident at once; the next spike opens a new one.
      if (!watch->WaitFor(
              [&](const v1::IncidentUpdate& u) {
                return u.incident().onset_step() == onset && u.incident().state() == v1::CLOSED;
              },
              nullptr, std::chrono::seconds(30))) {
        Die(absl::StrCat("incident of step ", onset, " did not close"));
      }
      detect_ms.push_back(1e3 * Seconds(opened - t0));
      ack_ms.push_back(1e3 * Seconds(acked - t0));
      ++step;
      // Calm steps as a trainer sends them: each step's reports on their
      // own (a real step takes far longer than a round trip), so each
      // record's latency is its own, not that of a 30-step backlog.
      for (int64_t end = step + kGap; step < end; ++step) {
        report_all(step, 1.0);
        flush_all("latency gap");
      }
    }
    for (auto& c : clients) c->Close();
    watch.reset();
    // Inside the daemon (report arrival -> decision), exact,
    // from the daemon's latency observer: every step's record (calm steps:
    // arrival -> detectors and engine done), and the records that raised a
    // detection, to the engine's decision to open the incident and to its
    // "opened" event durable and published.
    daemon->Shutdown(absl::Seconds(10));
    std::vector<double> in_calm, in_decided, in_opened;
    {
      std::lock_guard<std::mutex> lock(in_daemon.mu);
      in_calm = in_daemon.calm_ms;
      in_decided = in_daemon.decided_ms;
      in_opened = in_daemon.opened_ms;
    }
    if (in_calm.empty() || in_opened.empty()) Die("the daemon observed no detection latency");
    std::vector<double> in_all = in_calm;
    in_all.insert(in_all.end(), in_decided.begin(), in_decided.end());
    const double in_p50 = Percentile(in_all, 0.50), in_p99 = Percentile(in_all, 0.99);
    const double calm_p50 = Percentile(in_calm, 0.50), calm_p99 = Percentile(in_calm, 0.99);
    const double dec_p50 = Percentile(in_decided, 0.50), dec_p99 = Percentile(in_decided, 0.99);
    const double sp_p50 = Percentile(in_opened, 0.50), sp_p99 = Percentile(in_opened, 0.99);
    // Each opening from its decision to durable: the write that joined the
    // group, the group's COMMIT (its fdatasync) and the publishing.
    std::vector<double> in_commit;
    for (size_t i = 0; i < in_opened.size(); ++i) in_commit.push_back(in_opened[i] - in_decided[i]);
    const double cm_p50 = Percentile(in_commit, 0.50), cm_p99 = Percentile(in_commit, 0.99);
    // Before (commit 24ff69c: detection after the group's fsync, slices
    // measured as a whole, gap steps sent 30 at a time), from the
    // histogram's bucket bounds, all records.
    const std::string before_in_p99 = ranks == 1 ? "<= 10" : "<= 25";
    // Last stop (stop 22, 500 spikes, the two full runs of b97de7f, which
    // timed openings only to durable): opening p99 2.64, 2.45 / 2.99, 4.30
    // ms at 1 / 8 streams.
    const std::string last_open_p99 = ranks == 1 ? "2.64, 2.45" : "2.99, 4.30";
    std::cout << absl::StrFormat(
        "  %d stream(s), incident commit %s: in the daemon, arrival -> decision: calm records "
        "(%zu) p50 %.3f ms, p99 %.3f ms; records that opened an incident (%zu) p50 %.3f ms, p99 "
        "%.3f ms; all p99 %.3f ms. The openings to \"opened\" durable and published: p50 %.3f "
        "ms, p99 %.3f ms (last stop, joined: p99 %s ms; before: all p99 %s ms); of which decision "
        "-> durable (write, commit, publish): p50 %.3f ms, p99 %.3f ms\n",
        ranks, commit, in_calm.size(), calm_p50, calm_p99, in_decided.size(), dec_p50, dec_p99,
        in_p99, sp_p50, sp_p99, last_open_p99, before_in_p99, cm_p50, cm_p99);
    const double p50 = Percentile(detect_ms, 0.50), p99 = Percentile(detect_ms, 0.99);
    const double a50 = Percentile(ack_ms, 0.50), a99 = Percentile(ack_ms, 0.99);
    const double worst = *std::max_element(detect_ms.begin(), detect_ms.end());
    // Measured with the binary of commit 2e2d7f9 (before group commit and
    // the run pipelines) on the 2-core build machine; 1 stream only.
    const std::string before_p50 = ranks == 1 ? "18.58" : "-";
    const std::string before_p99 = ranks == 1 ? "35.07" : "-";
    std::cout << absl::StrFormat(
        "detection latency, %d stream(s), incident commit %s (%d spikes): p50 %.2f ms, p99 %.2f "
        "ms, max %.2f ms; batch ack p50 %.2f ms, p99 %.2f ms (before: p50 %s ms, p99 %s ms)\n",
        ranks, commit, opt.latency_samples, p50, p99, worst, a50, a99, before_p50, before_p99);
    md += absl::StrFormat(
        "| %d | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %.3f | %.3f | %.3f | %.3f | "
        "%.3f | %.3f | %s | %.3f | %s |\n",
        ranks, commit, opt.latency_samples, p50, p99, worst, a50, a99, before_p50, before_p99,
        calm_p50, calm_p99, dec_p50, dec_p99, sp_p50, sp_p99, join ? last_open_p99 : "-", in_p99,
        before_in_p99);
    latency_rows.push_back(absl::StrFormat(
        "{\"streams\": %d, \"join\": %s, \"samples\": %d, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
        "\"max_ms\": %.3f, \"ack_p50_ms\": %.3f, \"ack_p99_ms\": %.3f, "
        "\"in_daemon_p50_ms\": %.3f, \"in_daemon_p99_ms\": %.3f, "
        "\"in_daemon_calm_p50_ms\": %.3f, \"in_daemon_calm_p99_ms\": %.3f, "
        "\"in_daemon_opening_decision_p50_ms\": %.3f, "
        "\"in_daemon_opening_decision_p99_ms\": %.3f, "
        "\"in_daemon_opening_p50_ms\": %.3f, \"in_daemon_opening_p99_ms\": %.3f, "
        "\"in_daemon_decision_to_durable_p50_ms\": %.3f, "
        "\"in_daemon_decision_to_durable_p99_ms\": %.3f}",
        ranks, join ? "true" : "false", opt.latency_samples, p50, p99, worst, a50, a99, in_p50,
        in_p99, calm_p50, calm_p99, dec_p50, dec_p99, sp_p50, sp_p99, cm_p50, cm_p99));
  }
  md += "\nFrom handing the spike step's reports to WorkerClient (every rank, then Flush) until "
        "the incident's \"opened\" update arrives on a WatchIncidents stream (observe mode, 32 "
        "layers): client batching and send, group commit, run-level merge, the run's pipeline "
        "(detectors), incident persisted, and the operator's stream. Batch ack = the same "
        "reports' commit acknowledgement back at the clients. In daemon: from the arrival of the "
        "report that completed a step's record (its last rank's; before it the step cannot be "
        "judged) to the decision (calm records: detectors and engine done; opening "
        "records: the engine's decision to open the incident, formed and about to be written), "
        "and for the opening records also to the incident's \"opened\" event durable and "
        "published (the decision plus its group's commit), exact, from the daemon's latency "
        "observer; all (decision) = calm and opening records' decisions; calm steps are sent "
        "one step at a time, as a trainer sends them (before: 30 at a time); the 100-step "
        "warm-up backlog is not counted. "
        "Incident commit: \"own\": the incident and its \"opened\" event commit in a "
        "transaction of their own after the group that carried the spike (a second fsync; "
        "before, with the group held up to 3 ms for it, they joined that group's).\n\n";
  json.push_back(absl::StrCat("\"detection_latency\": [", absl::StrJoin(latency_rows, ", "), "]"));
  {
    const DiskFigures disk_after = ProbeDisk(scratch.Sub("disk"), 1000);
    const std::string line = absl::StrFormat(
        "disk (10 log frames + fdatasync, 1000 times) before the latency runs: p50 %.3f ms, p99 "
        "%.3f ms, max %.2f ms; after: p50 %.3f ms, p99 %.3f ms, max %.2f ms",
        disk_before.p50, disk_before.p99, disk_before.max, disk_after.p50, disk_after.p99,
        disk_after.max);
    std::cout << line << "\n";
    md += absl::StrCat(
        "Every opening waits for one commit of its group: this disk's own figure for such a "
        "commit's write and fdatasync, measured in this run beside the catalogs, is the floor "
        "under the opening latency and moves with the machine. ",
        absl::StrFormat("Before the latency runs: p50 %.3f ms, p99 %.3f ms, max %.2f ms; after: "
                        "p50 %.3f ms, p99 %.3f ms, max %.2f ms.\n\n",
                        disk_before.p50, disk_before.p99, disk_before.max, disk_after.p50,
                        disk_after.p99, disk_after.max));
    json.push_back(absl::StrFormat(
        "\"disk_fdatasync_ms\": {\"before\": {\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f}, "
        "\"after\": {\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f}}",
        disk_before.p50, disk_before.p99, disk_before.max, disk_after.p50, disk_after.p99,
        disk_after.max));
  }

  // ---- 3. Memory over a long run --------------------------------------------
  {
    auto daemon = StartDaemon(scratch.Sub("memory"));
    const std::string run = "memory";
    CreateRun(daemon->port(), run, 1);
    auto client = Connect(absl::StrCat("127.0.0.1:", daemon->port()), run, 0, 1, 2048);
    TraceSpec spec;
    spec.layers = 4;
    spec.seed = 3;
    TraceModel model(spec);
    const int64_t interval = 10'000;
    std::vector<std::pair<int64_t, int64_t>> rss;  // (steps, kB)
    rss.push_back({0, RssKb()});
    std::cout << "memory: one run, 4 layers, " << opt.memory_steps << " steps\n";
    std::cout << absl::StrFormat("  %7d steps  RSS %7d kB\n", 0, rss.back().second);
    const auto t0 = Clock::now();
    for (int64_t s = 0; s < opt.memory_steps; ++s) {
      client->Report(model.Report(0, s));
      if ((s + 1) % interval == 0 || s + 1 == opt.memory_steps) {
        if (!client->Flush(absl::Minutes(2)).ok()) Die("memory run did not flush");
        rss.push_back({s + 1, RssKb()});
        std::cout << absl::StrFormat("  %7d steps  RSS %7d kB\n", s + 1, rss.back().second);
      }
    }
    const double seconds = Seconds(Clock::now() - t0);
    const int64_t acked = client->stats().reports_acked;
    client->Close();
    daemon->Shutdown(absl::Seconds(10));
    if (acked != opt.memory_steps) {
      Die(absl::StrCat("memory run: ", acked, " of ", opt.memory_steps, " reports acknowledged"));
    }
    // Growth over the second half, where every window is long since full.
    const auto& mid = rss[rss.size() / 2];
    const double growth_kb_per_10k =
        rss.back().first > mid.first
            ? 1e4 * static_cast<double>(rss.back().second - mid.second) /
                  static_cast<double>(rss.back().first - mid.first)
            : 0;
    std::cout << absl::StrFormat("  %.0f steps/s; RSS growth over the second half %.1f kB per "
                                 "10k steps\n",
                                 opt.memory_steps / seconds, growth_kb_per_10k);
    md += "## Memory over a long run\n\n| steps | RSS kB |\n|---:|---:|\n";
    std::vector<std::string> points;
    for (const auto& [steps, kb] : rss) {
      md += absl::StrFormat("| %d | %d |\n", steps, kb);
      points.push_back(absl::StrFormat("{\"steps\": %d, \"rss_kb\": %d}", steps, kb));
    }
    md += absl::StrFormat(
        "\nRSS of the whole process (daemon + client) while one run streams %d steps with 4 "
        "layers (%.0f steps/s). Growth over the second half: %.1f kB per 10,000 steps — "
        "flat means the per-run windows are bounded; what remains is SQLite's page cache and "
        "allocator noise.\n\n",
        opt.memory_steps, opt.memory_steps / seconds, growth_kb_per_10k);
    json.push_back(absl::StrFormat(
        "\"memory\": {\"layers\": 4, \"steps\": %d, \"steps_per_s\": %.1f, "
        "\"growth_kb_per_10k_steps_second_half\": %.2f, \"rss\": [%s]}",
        opt.memory_steps, opt.memory_steps / seconds, growth_kb_per_10k,
        absl::StrJoin(points, ", ")));
  }

  // ---- 4. Catalog growth ----------------------------------------------------
  {
    md += "## Catalog growth (64 layers)\n\n| ranks | steps | bytes | bytes / step | bytes / "
          "step / rank |\n|---:|---:|---:|---:|---:|\n";
    std::vector<std::string> rows;
    for (int ranks : {1, 8}) {
      const std::string dir = scratch.Sub(absl::StrCat("catalog-", ranks));
      const std::string run = absl::StrCat("catalog-", ranks);
      int64_t before = 0;
      {
        auto daemon = StartDaemon(dir);
        CreateRun(daemon->port(), run, ranks);
        const std::string db = daemon->catalog_path();
        daemon->Shutdown(absl::Seconds(10));
        daemon.reset();
        before = CatalogBytes(db);
      }
      auto daemon = StartDaemon(dir);
      const std::string db = daemon->catalog_path();
      TraceSpec spec;
      spec.layers = 64;
      spec.seed = 9;
      TraceModel model(spec);
      // Distinct values per rank and step, so nothing is stored once for many.
      std::vector<std::unique_ptr<WorkerClient>> clients(ranks);
      for (int r = 0; r < ranks; ++r) {
        clients[r] = Connect(absl::StrCat("127.0.0.1:", daemon->port()), run, r, ranks, 256);
      }
      std::vector<std::thread> threads;
      std::atomic<int> failures{0};
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          for (int64_t s = 0; s < opt.catalog_steps; ++s) {
            clients[r]->Report(model.Report(static_cast<uint32_t>(r), 20'000 + s));
          }
          if (!clients[r]->Flush(absl::Minutes(5)).ok()) failures.fetch_add(1);
        });
      }
      for (auto& t : threads) t.join();
      if (failures.load() > 0) Die("catalog run did not flush");
      for (auto& c : clients) c->Close();
      daemon->Shutdown(absl::Seconds(10));
      daemon.reset();
      const int64_t after = CatalogBytes(db);
      const double per_step = static_cast<double>(after - before) / opt.catalog_steps;
      std::cout << absl::StrFormat(
          "catalog: 64 layers, %d rank(s), %d steps: %d bytes, %.0f bytes/step (%.0f per rank)\n",
          ranks, opt.catalog_steps, after - before, per_step, per_step / ranks);
      md += absl::StrFormat("| %d | %d | %d | %.0f | %.0f |\n", ranks, opt.catalog_steps,
                            after - before, per_step, per_step / ranks);
      rows.push_back(absl::StrFormat(
          "{\"ranks\": %d, \"steps\": %d, \"bytes\": %d, \"bytes_per_step\": %.1f}", ranks,
          opt.catalog_steps, after - before, per_step));
    }
    md += "\nGrowth of catalog.db plus its -wal and -shm files across a clean shutdown "
          "(so the WAL is checkpointed), divided by the steps streamed: the run-level record per "
          "step, per-layer stats included. The target is a few KB per step, independent "
          "of world size.\n";
    json.push_back(absl::StrCat("\"catalog\": {\"layers\": 64, \"rows\": [",
                                absl::StrJoin(rows, ", "), "]}"));
  }

  std::ofstream(opt.out_dir + "/ingest_bench.md") << md;
  std::ofstream(opt.out_dir + "/ingest_bench.json") << "{" << absl::StrJoin(json, ", ") << "}\n";
  std::cout << "wrote " << opt.out_dir << "/ingest_bench.{md,json}\n";
  return 0;
}
