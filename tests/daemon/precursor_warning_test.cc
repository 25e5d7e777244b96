// Precursor warnings through a real daemon: a worker streams a trace whose
// max attention logit (layer 1) climbs from ~20 past the critical level
// (1e4) and holds there; the supervisor turns the persisting critical
// precursor into one warning with its own state, stored in the catalog
// (it survives a restart), shown by spikectl, the web view, /metrics and the
// incident watch, scoped by token like incidents; it clears when the logit
// falls back, it is linked to an incident that opens while it is active,
// and policy precursor.on_critical = PRECURSOR_INCIDENT opens an incident
// instead.
#include <httplib.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/secret.h"
#include "cli/spikectl.h"
#include "gmock/gmock.h"
#include "tests/daemon/daemon_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char kAdmin[] = "admin-token-warn-00000000000000000000000000000000000000000000000";
const char kViewerA[] = "viewer-a-token-warn-00000000000000000000000000000000000000000000";

// Layer 1's max attention logit: ~20 until step 300, then ×1000 by step 480
// (past 1e4 from about step 460), held at 2e4 until `drop_at`, 50 after.
double Logit(int64_t step, int64_t drop_at) {
  if (step >= drop_at) return 50.0;
  if (step < 300) return 20.0 * (1.0 + 0.01 * std::sin(0.9 * step));
  if (step < 480) return 20.0 * std::exp(std::log(1000.0) * static_cast<double>(step - 300) / 180.0);
  return 2e4;
}

struct Trace {
  int64_t drop_at = 1 << 30;
  // A loss and grad-norm spike at this step (0: none).
  int64_t spike_at = 0;

  v1::StepReport At(int64_t step) const {
    v1::StepReport r;
    r.set_step(step);
    r.set_data_position(step);
    double loss = 2.0 + 0.01 * std::sin(0.7 * step);
    double grad = 0.5 + 0.01 * std::cos(1.3 * step);
    if (spike_at > 0 && step >= spike_at && step < spike_at + 4) {
      loss *= 3;
      grad *= 40;
    }
    r.set_loss(loss);
    r.set_grad_norm(grad);
    r.set_lr(1e-3);
    r.set_tokens(1024);
    for (int l = 0; l < 2; ++l) {
      auto* ls = r.add_layers();
      ls->set_layer(l);
      ls->set_max_attn_logit(l == 1 ? Logit(step, drop_at) : 20.0 + std::sin(0.3 * step));
      ls->set_grad_norm(0.3);
      ls->set_update_ratio(1e-3);
      ls->set_act_rms(1.0);
    }
    return r;
  }
};

class PrecursorWarningTest : public DaemonFixture {
 protected:
  void ConfigureDaemon(daemon::Daemon::Options& options) override {
    std::ofstream(dir_.File("tokens")) << "root admin * " << HashToken(kAdmin) << "\n"
                                       << "dave viewer run-a " << HashToken(kViewerA) << "\n";
    options.allow_anonymous = false;
    options.tokens_file = dir_.File("tokens");
    options.http_listen = "127.0.0.1:0";
  }

  static void As(grpc::ClientContext* ctx, const char* token) {
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }

  void Create(const std::string& run) {
    grpc::ClientContext ctx;
    As(&ctx, kAdmin);
    v1::CreateRunRequest req;
    req.set_name(run);
    req.set_world_size(1);
    v1::Run out;
    grpc::Status s = supervisor_->CreateRun(&ctx, req, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  grpc::Status SetPolicy(const std::string& run, const v1::Policy& policy) {
    grpc::ClientContext ctx;
    As(&ctx, kAdmin);
    v1::SetPolicyRequest req;
    req.set_run(run);
    *req.mutable_policy() = policy;
    v1::Policy out;
    return supervisor_->SetPolicy(&ctx, req, &out);
  }

  // Streams steps from..to of `trace` as rank 0 of generation 0.
  void Stream(const std::string& run, const Trace& trace, int64_t from, int64_t to) {
    grpc::ClientContext ctx;
    As(&ctx, kAdmin);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = worker_->Attach(&ctx);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_run(run);
    hello.mutable_hello()->set_world_size(1);
    ASSERT_TRUE(stream->Write(hello));
    v1::ControllerMessage in;
    ASSERT_TRUE(stream->Read(&in));
    ASSERT_TRUE(in.has_welcome()) << in.DebugString();
    uint64_t seq = 1;
    for (int64_t s = from; s <= to; s += 40) {
      std::vector<v1::StepReport> batch;
      for (int64_t k = s; k <= std::min(to, s + 39); ++k) batch.push_back(trace.At(k));
      EXPECT_EQ(SendBatch(stream.get(), seq++, batch).accepted(), static_cast<int>(batch.size()));
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }

  std::vector<v1::PrecursorWarning> Warnings(const std::string& run, const char* token = kAdmin,
                                             grpc::Status* status = nullptr) {
    grpc::ClientContext ctx;
    As(&ctx, token);
    v1::ListWarningsRequest req;
    req.set_run(run);
    v1::ListWarningsResponse out;
    grpc::Status s = supervisor_->ListWarnings(&ctx, req, &out);
    if (status != nullptr) *status = s;
    else EXPECT_TRUE(s.ok()) << s.error_message();
    return {out.warnings().begin(), out.warnings().end()};
  }

  std::vector<v1::Incident> Incidents(const std::string& run) {
    grpc::ClientContext ctx;
    As(&ctx, kAdmin);
    v1::ListIncidentsRequest req;
    req.set_run(run);
    v1::ListIncidentsResponse out;
    EXPECT_TRUE(supervisor_->ListIncidents(&ctx, req, &out).ok());
    return {out.incidents().begin(), out.incidents().end()};
  }

  // Detection runs on the run's pipeline after the acks: poll.
  static bool Eventually(const std::function<bool()>& done) {
    for (int i = 0; i < 300; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return done();
  }

  std::string Spikectl(std::vector<std::string> args, const char* token = kAdmin) {
    args.insert(args.begin(), {absl::StrCat("--addr=", address_), absl::StrCat("--token=", token)});
    std::ostringstream out, err;
    const int code = cli::RunSpikectl(args, out, err);
    EXPECT_EQ(code, 0) << err.str();
    return out.str();
  }

  httplib::Result Get(const std::string& path, const char* token) {
    httplib::Client client("127.0.0.1", daemon_->http_port());
    client.set_read_timeout(30, 0);
    return client.Get(path.c_str(), {{"Authorization", absl::StrCat("Bearer ", token)}});
  }
};

TEST_F(PrecursorWarningTest, ACriticalLogitBecomesOneWarningThatSurvivesARestartAndClears) {
  Create("run-a");
  // The watch is open before the logit climbs.
  grpc::ClientContext watch_ctx;
  As(&watch_ctx, kAdmin);
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  v1::WatchIncidentsRequest watch_req;
  watch_req.set_run("run-a");
  auto watch = supervisor_->WatchIncidents(&watch_ctx, watch_req);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  Trace trace;
  trace.drop_at = 521;
  Stream("run-a", trace, 0, 520);
  std::vector<v1::PrecursorWarning> seen;
  ASSERT_TRUE(Eventually([&] {
    seen = Warnings("run-a");
    return !seen.empty() && seen[0].last_step() >= 520;
  })) << "no warning for a max attention logit at 2e4 since step ~460";
  ASSERT_EQ(seen.size(), 1u) << "one warning per episode, not one per step";
  v1::PrecursorWarning w = seen[0];
  EXPECT_EQ(w.state(), v1::WARNING_ACTIVE);
  EXPECT_EQ(w.signal(), "max_attn_logit");
  EXPECT_EQ(w.layer(), 1);
  EXPECT_EQ(w.generation(), 0);
  EXPECT_EQ(w.threshold(), 1e4);
  EXPECT_EQ(w.clear_below(), 1e3);
  EXPECT_GE(w.raised_step(), 460);
  EXPECT_LE(w.raised_step(), 470);
  // The precursor began where the climb did, long before the level passed.
  EXPECT_GE(w.onset_step(), 280);
  EXPECT_LE(w.onset_step(), 460);
  EXPECT_EQ(w.last_step(), 520);
  EXPECT_EQ(w.lead_steps(), 520 - w.onset_step());
  EXPECT_EQ(w.peak_value(), 2e4);
  EXPECT_TRUE(Incidents("run-a").empty()) << "a warning is not an incident";

  // The watch streamed its opening, apart from incidents.
  v1::IncidentUpdate update;
  ASSERT_TRUE(watch->Read(&update));
  ASSERT_TRUE(update.has_warning()) << update.DebugString();
  EXPECT_FALSE(update.has_incident());
  EXPECT_EQ(update.event().kind(), "warning_opened");
  EXPECT_EQ(update.warning().id(), w.id());
  watch_ctx.TryCancel();

  // spikectl.
  const std::string list = Spikectl({"warnings", "list", "--run=run-a"});
  EXPECT_THAT(list, HasSubstr("max_attn_logit"));
  EXPECT_THAT(list, HasSubstr("ACTIVE"));
  EXPECT_THAT(Spikectl({"status"}), HasSubstr("Active precursor warnings:"));
  EXPECT_THAT(Spikectl({"incidents", "list", "--run=run-a"}),
              HasSubstr("Precursor warnings (not incidents): 1 active, 0 cleared, 0 preceded"));

  // /metrics and the run's page.
  std::string metrics;
  ASSERT_TRUE(Eventually([&] {
    auto res = Get("/metrics", kAdmin);
    metrics = res ? res->body : "";
    return metrics.find("spikeguard_precursor_warning_active") != std::string::npos;
  }));
  EXPECT_THAT(metrics, HasSubstr("spikeguard_precursor_warning_active{run=\"run-a\",signal=\"max_attn_logit\",layer=\"1\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("spikeguard_precursor_warning_lead_steps{run=\"run-a\",signal=\"max_attn_logit\",layer=\"1\"}"));
  auto page = Get("/runs/run-a", kAdmin);
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr("<h2>Precursor warnings</h2>"));
  EXPECT_THAT(page->body, HasSubstr("ACTIVE"));

  // A restart: the warning is read back from the catalog, still active, and
  // the steps that follow continue it rather than open another.
  RestartDaemon();
  seen = Warnings("run-a");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].id(), w.id());
  EXPECT_EQ(seen[0].state(), v1::WARNING_ACTIVE);
  EXPECT_EQ(seen[0].onset_step(), w.onset_step());

  Stream("run-a", trace, 521, 560);  // the logit is back at 50 from step 521
  ASSERT_TRUE(Eventually([&] {
    seen = Warnings("run-a");
    return !seen.empty() && seen[0].state() == v1::WARNING_CLEARED;
  })) << seen.size();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].id(), w.id());
  EXPECT_EQ(seen[0].last_step(), 525) << "clears after persistence_steps (5) steps under 1e3";
  EXPECT_EQ(seen[0].peak_value(), 2e4);
  EXPECT_EQ(seen[0].incident_id(), 0);
  EXPECT_THAT(Spikectl({"warnings", "list", "--run=run-a", "--state=cleared"}), HasSubstr("cleared"));
  ASSERT_TRUE(Eventually([&] {
    auto res = Get("/metrics", kAdmin);
    return res && res->body.find("spikeguard_precursor_warning_active{run=\"run-a\",signal=\"max_attn_logit\",layer=\"1\"} 0\n") != std::string::npos;
  }));
}

TEST_F(PrecursorWarningTest, AnIncidentWhileActiveIsLinkedAndAScopedTokenSeesOnlyItsRuns) {
  Create("run-a");
  Create("run-b");
  Trace trace;
  trace.spike_at = 560;
  Stream("run-b", trace, 0, 600);
  std::vector<v1::PrecursorWarning> seen;
  ASSERT_TRUE(Eventually([&] {
    seen = Warnings("run-b");
    return !seen.empty() && seen[0].state() == v1::WARNING_PRECEDED_INCIDENT;
  })) << (seen.empty() ? "no warning" : seen[0].DebugString());
  ASSERT_EQ(seen.size(), 1u);
  const std::vector<v1::Incident> incidents = Incidents("run-b");
  ASSERT_FALSE(incidents.empty());
  EXPECT_EQ(seen[0].incident_id(), incidents[0].id());
  EXPECT_EQ(seen[0].incident_onset_step(), incidents[0].onset_step());
  EXPECT_EQ(seen[0].incident_lead_steps(), incidents[0].onset_step() - seen[0].onset_step());
  EXPECT_GT(seen[0].incident_lead_steps(), 90) << "the warning came well before the spike";
  EXPECT_THAT(Spikectl({"warnings", "list"}), HasSubstr("preceded incident"));

  // A viewer scoped to run-a sees none of run-b's warnings.
  EXPECT_TRUE(Warnings("", kViewerA).empty());
  grpc::Status denied;
  Warnings("run-b", kViewerA, &denied);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(Spikectl({"warnings", "list"}, kViewerA), HasSubstr("No precursor warnings."));
  std::string everything;
  ASSERT_TRUE(Eventually([&] {
    auto res = Get("/metrics", kAdmin);
    everything = res ? res->body : "";
    return everything.find("spikeguard_precursor_warning_lead_steps{run=\"run-b\"") != std::string::npos;
  }));
  auto scoped = Get("/metrics", kViewerA);
  ASSERT_TRUE(scoped);
  EXPECT_THAT(scoped->body, Not(HasSubstr("spikeguard_precursor_warning")));
  EXPECT_THAT(scoped->body, Not(HasSubstr("run=\"run-b\"")));
}

TEST_F(PrecursorWarningTest, PolicyIncidentOpensAnIncidentInsteadAndABadValueIsRefused) {
  Create("run-c");
  v1::Policy bad;
  bad.mutable_precursor()->set_on_critical(static_cast<v1::PrecursorAction>(9));
  grpc::Status refused = SetPolicy("run-c", bad);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("precursor.on_critical"));

  v1::Policy incident;
  incident.mutable_precursor()->set_on_critical(v1::PRECURSOR_INCIDENT);
  grpc::Status set = SetPolicy("run-c", incident);
  ASSERT_TRUE(set.ok()) << set.error_message();
  Stream("run-c", Trace(), 0, 500);
  std::vector<v1::Incident> incidents;
  ASSERT_TRUE(Eventually([&] {
    incidents = Incidents("run-c");
    return !incidents.empty();
  })) << "no incident for a persisting critical logit under PRECURSOR_INCIDENT";
  EXPECT_EQ(incidents.size(), 1u);
  EXPECT_EQ(incidents[0].trigger(), "precursor");
  EXPECT_EQ(incidents[0].precursor(), "max_attn_logit");
  EXPECT_LT(incidents[0].precursor_onset_step(), incidents[0].onset_step());
  EXPECT_TRUE(Warnings("run-c").empty());
}

}  // namespace
}  // namespace spikeguard::testing
