// client_driver: the C++ WorkerClient behind the conformance suite's line
// protocol (tests/conformance/client_driver.py is the Python twin, and
// test_client_conformance.py holds the scenarios and documents the protocol).
//
// One JSON object per line on stdin, one JSON answer per line on stdout.
// StepReports and Commands travel as protobuf JSON. The driver decides
// nothing: it calls the client and says what came back.
#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "spikeguard/v1/worker.pb.h"
#include "worker/client/worker_client.h"

namespace {

namespace v1 = spikeguard::v1;
using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;
using spikeguard::worker::WorkerClient;

double Num(const Struct& s, const std::string& key, double fallback) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? fallback : it->second.number_value();
}

std::string Str(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? std::string() : it->second.string_value();
}

bool Has(const Struct& s, const std::string& key) { return s.fields().count(key) > 0; }

absl::Duration Seconds(const Struct& s, const std::string& key, double fallback) {
  return absl::Seconds(Num(s, key, fallback));
}

Value NumberValue(double v) {
  Value out;
  out.set_number_value(v);
  return out;
}

Value StringValue(std::string v) {
  Value out;
  out.set_string_value(std::move(v));
  return out;
}

Value BoolValue(bool v) {
  Value out;
  out.set_bool_value(v);
  return out;
}

Value NullValue() {
  Value out;
  out.set_null_value(google::protobuf::NULL_VALUE);
  return out;
}

// A protobuf message as a JSON Value (the client's message in protobuf JSON).
template <typename Message>
Value MessageValue(const Message& m) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(m, &json);
  Value out;
  (void)google::protobuf::util::JsonStringToMessage(json, &out);
  return out;
}

template <typename Message>
absl::Status FromValue(const Value& v, Message* m) {
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(v, &json); !s.ok()) {
    return absl::InvalidArgumentError(s.ToString());
  }
  if (auto s = google::protobuf::util::JsonStringToMessage(json, m); !s.ok()) {
    return absl::InvalidArgumentError(s.ToString());
  }
  return absl::OkStatus();
}

class Driver {
 public:
  ~Driver() { Close(); }

  Struct Handle(const Struct& in) {
    const std::string op = Str(in, "op");
    if (op == "defaults") return Defaults();
    if (op == "start") return StartClient(in);
    if (client_ == nullptr) return Error("no client: send start first");
    if (op == "report") return Report(in);
    if (op == "report_async") return ReportAsync(in);
    if (op == "progress") return Progress();
    if (op == "flush") return Outcome(client_->Flush(Seconds(in, "timeout_s", 30)));
    if (op == "stats") return Stats();
    if (op == "poll_command") return PollCommand(in);
    if (op == "command_result") {
      v1::CommandResult r;
      r.set_command_id(Str(in, "id"));
      r.set_ok(in.fields().at("ok").bool_value());
      r.set_message(Str(in, "message"));
      r.set_step(static_cast<int64_t>(Num(in, "step", 0)));
      client_->SendCommandResult(r);
      return Ok();
    }
    if (op == "checkpoint_saved") {
      v1::CheckpointSaved c;
      c.set_step(static_cast<int64_t>(Num(in, "step", 0)));
      c.set_data_position(static_cast<int64_t>(Num(in, "data_position", 0)));
      c.set_uri(Str(in, "uri"));
      c.set_has_rng_state(true);
      c.set_has_data_loader_state(true);
      c.set_complete(true);
      client_->ReportCheckpoint(c);
      return Ok();
    }
    if (op == "checkpoint_deleted") {
      v1::CheckpointDeleted d;
      d.set_step(static_cast<int64_t>(Num(in, "step", 0)));
      d.set_uri(Str(in, "uri"));
      client_->ReportCheckpointDeleted(d);
      return Ok();
    }
    if (op == "generation_ended") {
      v1::GenerationEnded e;
      e.set_generation(static_cast<int64_t>(Num(in, "generation", 0)));
      e.set_last_step(static_cast<int64_t>(Num(in, "last_step", 0)));
      e.set_reason(Str(in, "reason"));
      client_->SendGenerationEnded(e);
      return Ok();
    }
    if (op == "await_checkpoint_answers") {
      Struct out;
      (*out.mutable_fields())["ok"] =
          BoolValue(client_->AwaitCheckpointAnswers(Seconds(in, "timeout_s", 10)));
      return out;
    }
    if (op == "take_pins") {
      Struct out = Ok();
      std::optional<std::vector<std::string>> pins = client_->TakePins();
      if (!pins.has_value()) {
        (*out.mutable_fields())["pins"] = NullValue();
      } else {
        Value list;
        for (auto& p : *pins) *list.mutable_list_value()->add_values() = StringValue(p);
        (*out.mutable_fields())["pins"] = list;
      }
      return out;
    }
    if (op == "close") {
      Close();
      return Ok();
    }
    return Error(absl::StrCat("unknown op '", op, "'"));
  }

 private:
  static Struct Ok() {
    Struct out;
    (*out.mutable_fields())["ok"] = BoolValue(true);
    return out;
  }

  static Struct Error(std::string message) {
    Struct out;
    (*out.mutable_fields())["ok"] = BoolValue(false);
    (*out.mutable_fields())["error"] = StringValue(std::move(message));
    return out;
  }

  // ok, or the error with the rejection's reason when the daemon refused.
  Struct Outcome(const absl::Status& status) {
    if (status.ok()) return Ok();
    Struct out = Error(status.ToString());
    AddRejection(&out);
    return out;
  }

  void AddRejection(Struct* out) {
    if (std::optional<v1::Reject> r = client_->rejection(); r.has_value()) {
      (*out->mutable_fields())["reason"] = StringValue(v1::Reject::Reason_Name(r->reason()));
    }
  }

  static Struct Defaults() {
    const WorkerClient::Options o;
    Struct out = Ok();
    auto& f = *out.mutable_fields();
    f["max_batch_reports"] = NumberValue(o.max_batch_reports);
    f["flush_interval_s"] = NumberValue(absl::ToDoubleSeconds(o.flush_interval));
    f["heartbeat_interval_s"] = NumberValue(absl::ToDoubleSeconds(o.heartbeat_interval));
    f["initial_backoff_s"] = NumberValue(absl::ToDoubleSeconds(o.initial_backoff));
    f["max_backoff_s"] = NumberValue(absl::ToDoubleSeconds(o.max_backoff));
    f["max_queued_reports"] = NumberValue(static_cast<double>(o.max_queued_reports));
    f["close_grace_s"] = NumberValue(absl::ToDoubleSeconds(o.close_grace));
    f["welcome_timeout_s"] = NumberValue(absl::ToDoubleSeconds(WorkerClient::kDefaultWelcomeTimeout));
    f["flush_timeout_s"] = NumberValue(absl::ToDoubleSeconds(WorkerClient::kDefaultFlushTimeout));
    return out;
  }

  Struct StartClient(const Struct& in) {
    if (client_ != nullptr) return Error("already started");
    WorkerClient::Options o;
    o.address = Str(in, "address");
    o.run = Str(in, "run");
    o.rank = static_cast<uint32_t>(Num(in, "rank", 0));
    o.world_size = static_cast<uint32_t>(Num(in, "world_size", 1));
    o.generation = static_cast<int64_t>(Num(in, "generation", 0));
    o.host = "conformance";
    Struct opts;
    if (Has(in, "options")) opts = in.fields().at("options").struct_value();
    o.max_batch_reports = static_cast<int>(Num(opts, "max_batch_reports", o.max_batch_reports));
    o.flush_interval = Seconds(opts, "flush_interval", absl::ToDoubleSeconds(o.flush_interval));
    o.heartbeat_interval =
        Seconds(opts, "heartbeat_interval", absl::ToDoubleSeconds(o.heartbeat_interval));
    o.initial_backoff = Seconds(opts, "initial_backoff", absl::ToDoubleSeconds(o.initial_backoff));
    o.max_backoff = Seconds(opts, "max_backoff", absl::ToDoubleSeconds(o.max_backoff));
    o.max_queued_reports = static_cast<size_t>(
        Num(opts, "max_queued_reports", static_cast<double>(o.max_queued_reports)));
    o.close_grace = Seconds(opts, "close_grace", absl::ToDoubleSeconds(o.close_grace));
    absl::StatusOr<std::unique_ptr<WorkerClient>> client = WorkerClient::Start(std::move(o));
    if (!client.ok()) return Error(client.status().ToString());
    client_ = *std::move(client);
    return Outcome(client_->WaitForWelcome(Seconds(in, "timeout_s", 20)));
  }

  static absl::Status Reports(const Struct& in, std::vector<v1::StepReport>* out) {
    if (!Has(in, "reports")) return absl::OkStatus();
    for (const Value& v : in.fields().at("reports").list_value().values()) {
      if (auto s = FromValue(v, &out->emplace_back()); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  Struct Report(const Struct& in) {
    std::vector<v1::StepReport> reports;
    if (auto s = Reports(in, &reports); !s.ok()) return Error(s.ToString());
    int reported = 0;
    for (const auto& r : reports) {
      if (client_->rejection().has_value()) break;
      client_->Report(r);
      ++reported;
    }
    Struct out = Ok();
    // Report() after a Reject returns at once, without queueing: say so.
    if (client_->rejection().has_value()) {
      out = Error("rejected");
      AddRejection(&out);
    }
    (*out.mutable_fields())["reported"] = NumberValue(reported);
    return out;
  }

  Struct ReportAsync(const Struct& in) {
    std::vector<v1::StepReport> reports;
    if (auto s = Reports(in, &reports); !s.ok()) return Error(s.ToString());
    if (reporter_.joinable()) reporter_.join();
    reported_ = 0;
    reporting_ = true;
    const absl::Duration interval = Seconds(in, "interval_s", 0);
    reporter_ = std::thread([this, interval, reports = std::move(reports)] {
      for (const auto& r : reports) {
        client_->Report(r);
        ++reported_;
        if (interval > absl::ZeroDuration()) absl::SleepFor(interval);
      }
      reporting_ = false;
    });
    return Ok();
  }

  Struct Progress() {
    Struct out = Ok();
    (*out.mutable_fields())["reported"] = NumberValue(reported_.load());
    (*out.mutable_fields())["done"] = BoolValue(!reporting_.load());
    return out;
  }

  Struct Stats() {
    const WorkerClient::Stats s = client_->stats();
    Struct out = Ok();
    auto& f = *out.mutable_fields();
    f["acked"] = NumberValue(static_cast<double>(s.reports_acked));
    f["duplicate"] = NumberValue(static_cast<double>(s.reports_duplicate));
    f["rejected"] = NumberValue(static_cast<double>(s.reports_rejected));
    // The C++ client resends what the Welcome says is stored (the daemon
    // counts it as duplicate); it never drops it itself.
    f["already_committed"] = NumberValue(0);
    f["batches_sent"] = NumberValue(static_cast<double>(s.batches_sent));
    f["heartbeats_sent"] = NumberValue(static_cast<double>(s.heartbeats_sent));
    f["connects"] = NumberValue(static_cast<double>(s.connects));
    f["connected"] = BoolValue(client_->connected());
    f["last_ack_message"] = StringValue(s.last_ack_message);
    AddRejection(&out);
    return out;
  }

  Struct PollCommand(const Struct& in) {
    Struct out = Ok();
    std::optional<v1::Command> c = client_->WaitCommand(Seconds(in, "timeout_s", 0));
    (*out.mutable_fields())["command"] = c.has_value() ? MessageValue(*c) : NullValue();
    return out;
  }

  void Close() {
    if (client_ == nullptr) return;
    client_->Close();  // unblocks a Report() waiting under backpressure
    if (reporter_.joinable()) reporter_.join();
  }

  std::unique_ptr<WorkerClient> client_;
  std::thread reporter_;
  std::atomic<int> reported_{0};
  std::atomic<bool> reporting_{false};
};

}  // namespace

int main() {
  Driver driver;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    Struct in;
    Struct out;
    if (auto s = google::protobuf::util::JsonStringToMessage(line, &in); !s.ok()) {
      (*out.mutable_fields())["ok"] = BoolValue(false);
      (*out.mutable_fields())["error"] = StringValue(absl::StrCat("bad line: ", s.ToString()));
    } else {
      out = driver.Handle(in);
    }
    std::string json;
    (void)google::protobuf::util::MessageToJsonString(out, &json);
    std::cout << json << '\n' << std::flush;
  }
  return 0;
}
