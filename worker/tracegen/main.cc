// spikeguard-tracegen: streams a deterministic synthetic run into spikeguardd
// through the same client library that workers use.
//
//   spikeguard-tracegen --addr=127.0.0.1:7070 --run=demo --ranks=8 --steps=2000
//       --layers=4 --seed=1 --spike-at=1200 --nan-at=1800
//       [--checkpoint-every=100 --checkpoint-dir=DATA_DIR/runs/demo/ckpt]
//
// Exit codes: 0 every report acknowledged; 1 failure; 2 usage; 3 rejected by
// the daemon (unknown run, stale generation, invalid hello).
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "base/flag_dashes.h"
#include "base/flag_usage.h"
#include "daemon/detect/eval/trace_gen.h"
#include "daemon/detect/eval/trace_io.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"
#include "storage/checkpoint/checkpoint.h"
#include "storage/checkpoint/checkpoint_uri.h"
#include "storage/checkpoint/checksum.h"
#include "worker/client/worker_client.h"

ABSL_FLAG(std::string, addr, "127.0.0.1:7070", "spikeguardd address");
ABSL_FLAG(std::string, token_file, "",
          "bearer token file (default $SPIKEGUARD_TOKEN, else $SPIKEGUARD_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of the daemon's certificate; turns TLS on "
                                   "(default $SPIKEGUARD_TLS_CA; also $SPIKEGUARD_TLS_CERT, "
                                   "$SPIKEGUARD_TLS_KEY, $SPIKEGUARD_TLS_SERVER_NAME)");
ABSL_FLAG(std::string, run, "", "run name");
ABSL_FLAG(int, ranks, 1, "number of ranks (one stream each)");
ABSL_FLAG(int64_t, steps, 1000, "steps to stream");
ABSL_FLAG(int64_t, start_step, 0, "first step");
ABSL_FLAG(int, layers, 4, "layers per report");
ABSL_FLAG(uint64_t, seed, 1, "noise seed");
ABSL_FLAG(std::vector<std::string>, spike_at, {}, "steps at which the loss peaks (comma list)");
ABSL_FLAG(std::vector<std::string>, nan_at, {}, "steps with a NaN loss (comma list)");
ABSL_FLAG(int64_t, generation, 0, "generation the ranks claim");
ABSL_FLAG(int, batch, 32, "reports per batch");
ABSL_FLAG(double, steps_per_second, 0, "pace per rank (0: as fast as acknowledged)");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "every K steps rank 0 writes a small checkpoint file in --checkpoint-dir and registers it "
          "(CheckpointSaved)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where --checkpoint-every writes its files (reference-worker format, XXH64 trailer); "
          "must be inside the run's checkpoint root: DATA_DIR/runs/RUN for a run without a "
          "launch profile, else the profile's checkpoint_root");
ABSL_FLAG(bool, create_run, false, "create the run first if it does not exist");
ABSL_FLAG(std::string, out, "",
          "write rank 0's reports as a JSONL trace (one StepReport per line) instead of "
          "streaming to a daemon, plus OUT.labels.json with the spikes placed");
ABSL_FLAG(int, flush_timeout_s, 300, "how long to wait for the last acknowledgements");

namespace {

bool ParseSteps(const std::vector<std::string>& in, std::vector<int64_t>* out) {
  for (const auto& s : in) {
    int64_t v;
    if (!absl::SimpleAtoi(s, &v) || v < 0) {
      std::cerr << "spikeguard-tracegen: not a step: '" << s << "'\n";
      return false;
    }
    out->push_back(v);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // --help lists the flags of this file (absl would look for spikeguard-tracegen.cc).
  spikeguard::SetFlagsUsage(
      "spikeguard-tracegen --addr=HOST:PORT --run=NAME --ranks=N --steps=N --layers=L --seed=S "
      "[--spike-at=STEP,...] [--nan-at=STEP,...]",
      {__FILE__});
  std::vector<std::string> args = spikeguard::DashesToUnderscores(argc, argv);
  std::vector<char*> argv_ptrs = spikeguard::ArgvPointers(args);
  absl::ParseCommandLine(static_cast<int>(args.size()), argv_ptrs.data());
  const std::string run = absl::GetFlag(FLAGS_run);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if ((run.empty() && absl::GetFlag(FLAGS_out).empty()) || ranks <= 0 || steps < 0 ||
      absl::GetFlag(FLAGS_layers) < 0) {
    std::cerr << "spikeguard-tracegen: --run (or --out) is required; --ranks must be > 0, --steps and "
                 "--layers >= 0\n";
    return 2;
  }
  std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (absl::GetFlag(FLAGS_checkpoint_every) < 0) {
    std::cerr << "spikeguard-tracegen: --checkpoint-every must be >= 0\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_checkpoint_every) > 0 && absl::GetFlag(FLAGS_out).empty()) {
    // The daemon registers only checkpoints that are files inside the run's
    // checkpoint root, named by a file:// URI of an absolute path.
    if (checkpoint_dir.empty()) {
      std::cerr << "spikeguard-tracegen: --checkpoint-every needs --checkpoint-dir, a directory "
                   "inside the run's checkpoint root (DATA_DIR/runs/RUN for a run without a "
                   "launch profile)\n";
      return 2;
    }
    std::error_code ec;
    checkpoint_dir = std::filesystem::absolute(checkpoint_dir, ec).lexically_normal().string();
    while (checkpoint_dir.size() > 1 && checkpoint_dir.back() == '/') checkpoint_dir.pop_back();
  }
  spikeguard::worker::TraceSpec spec;
  spec.layers = absl::GetFlag(FLAGS_layers);
  spec.seed = absl::GetFlag(FLAGS_seed);
  if (!ParseSteps(absl::GetFlag(FLAGS_spike_at), &spec.spikes) ||
      !ParseSteps(absl::GetFlag(FLAGS_nan_at), &spec.nan_steps)) {
    return 2;
  }
  const spikeguard::worker::TraceModel model(spec);

  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    // A labeled trace file, the format of spikeguard-worker --no-daemon and
    // spikeguard-detect --trace.
    std::ofstream f(out);
    google::protobuf::util::JsonPrintOptions opts;
    opts.preserve_proto_field_names = true;
    opts.always_print_primitive_fields = true;
    const int64_t first = absl::GetFlag(FLAGS_start_step);
    for (int64_t step = first; step < first + steps; ++step) {
      std::string line;
      (void)google::protobuf::util::MessageToJsonString(model.Report(0, step), &line, opts);
      f << line << '\n';
    }
    // Labels as the detector benchmark reads them (eval/trace_io.h).
    std::ofstream labels(out.substr(0, out.rfind(".jsonl")) + ".labels.json");
    labels << spikeguard::detect::LabelsToJson("tracegen-" + std::to_string(spec.seed), steps,
                                               model.Labels())
           << "\n";
    std::cout << "spikeguard-tracegen: wrote " << steps << " steps to " << out << "\n";
    return f.good() ? 0 : 1;
  }

  spikeguard::ClientSecurity security = spikeguard::ClientSecurity::FromEnv();
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    security.SetTokenFile(absl::GetFlag(FLAGS_token_file), "--token-file");
  }
  if (!absl::GetFlag(FLAGS_tls_ca).empty()) security.SetTlsCa(absl::GetFlag(FLAGS_tls_ca), "--tls-ca");
  absl::StatusOr<spikeguard::ResolvedSecurity> resolved = security.Resolve();
  if (!resolved.ok()) {
    std::cerr << "spikeguard-tracegen: " << resolved.status().message() << "\n";
    return 2;
  }

  if (absl::GetFlag(FLAGS_create_run)) {
    auto channel =
        spikeguard::CreateClientChannel(absl::GetFlag(FLAGS_addr), *resolved, grpc::ChannelArguments());
    auto stub = spikeguard::v1::SupervisorService::NewStub(channel);
    grpc::ClientContext ctx;
    resolved->Authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.set_wait_for_ready(true);
    spikeguard::v1::CreateRunRequest req;
    req.set_name(run);
    req.set_world_size(ranks);
    spikeguard::v1::Run out;
    grpc::Status s = stub->CreateRun(&ctx, req, &out);
    if (!s.ok() && s.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
      std::cerr << "spikeguard-tracegen: create run: " << s.error_message();
      if (const std::string hint = resolved->Hint(s.error_code()); !hint.empty()) {
        std::cerr << " (" << hint << ")";
      }
      std::cerr << "\n";
      return 1;
    }
  }

  std::atomic<int> exit_code{0};
  std::vector<std::thread> threads;
  const auto start = absl::Now();
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      spikeguard::worker::WorkerClient::Options options;
      options.address = absl::GetFlag(FLAGS_addr);
      options.security = security;
      options.run = run;
      options.rank = static_cast<uint32_t>(rank);
      options.world_size = static_cast<uint32_t>(ranks);
      options.generation = absl::GetFlag(FLAGS_generation);
      options.host = "tracegen";
      options.max_batch_reports = absl::GetFlag(FLAGS_batch);
      auto client = spikeguard::worker::WorkerClient::Start(options);
      if (!client.ok()) {
        std::cerr << "spikeguard-tracegen: rank " << rank << ": " << client.status() << "\n";
        exit_code = 1;
        return;
      }
      if (auto s = (*client)->WaitForWelcome(absl::Seconds(60)); !s.ok()) {
        std::cerr << "spikeguard-tracegen: rank " << rank << ": " << s.message() << "\n";
        exit_code = absl::IsFailedPrecondition(s) ? 3 : 1;
        return;
      }
      const double pace = absl::GetFlag(FLAGS_steps_per_second);
      const int64_t first = absl::GetFlag(FLAGS_start_step);
      const int64_t every = absl::GetFlag(FLAGS_checkpoint_every);
      for (int64_t step = first; step < first + steps; ++step) {
        (*client)->Report(model.Report(static_cast<uint32_t>(rank), step));
        (*client)->SetCurrentStep(step);
        if (rank == 0 && every > 0 && step > 0 && step % every == 0) {
          // A real (small) file the daemon can confine and verify, named by
          // its file:// URI.
          spikeguard::storage::Checkpoint ckpt;
          ckpt.generation = absl::GetFlag(FLAGS_generation);
          ckpt.step = step;
          ckpt.data_position = step;
          ckpt.config_fingerprint = "spikeguard-tracegen";
          const std::string state = absl::StrCat("seed=", spec.seed, " step=", step);
          ckpt.AddSection("trace", state.data(), state.size());
          absl::StatusOr<spikeguard::storage::CheckpointFileInfo> saved =
              spikeguard::storage::CheckpointDir(checkpoint_dir).Write(ckpt);
          if (!saved.ok()) {
            std::cerr << "spikeguard-tracegen: checkpoint at step " << step << ": "
                      << saved.status().message() << "\n";
            exit_code = 1;
            break;
          }
          spikeguard::v1::CheckpointSaved c;
          c.set_step(step);
          c.set_data_position(step);
          c.set_uri(spikeguard::storage::CheckpointUriOfPath(saved->path));
          c.set_bytes(static_cast<int64_t>(saved->bytes));
          c.set_checksum(spikeguard::storage::ChecksumHex(saved->checksum));
          c.set_complete(true);
          c.set_has_rng_state(true);
          c.set_has_data_loader_state(true);
          (*client)->ReportCheckpoint(c);
        }
        if (pace > 0) absl::SleepFor(absl::Seconds(1.0 / pace));
        if ((*client)->rejection().has_value()) break;
      }
      if (auto s = (*client)->Flush(absl::Seconds(absl::GetFlag(FLAGS_flush_timeout_s))); !s.ok()) {
        std::cerr << "spikeguard-tracegen: rank " << rank << ": " << s.message() << "\n";
        exit_code = absl::IsFailedPrecondition(s) ? 3 : 1;
        return;
      }
      const auto stats = (*client)->stats();
      if (stats.reports_rejected > 0) {
        std::cerr << "spikeguard-tracegen: rank " << rank << ": " << stats.reports_rejected
                  << " reports refused: " << stats.last_ack_message << "\n";
        exit_code = 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  if (exit_code == 0) {
    std::cout << "spikeguard-tracegen: " << ranks << " ranks x " << steps << " steps of run '"
              << run << "' acknowledged in " << secs << " s ("
              << static_cast<double>(ranks * steps) / secs << " reports/s)\n";
  }
  return exit_code;
}
