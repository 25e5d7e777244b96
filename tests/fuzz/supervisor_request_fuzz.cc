// Fuzz target: what an operator's client sends to SupervisorService.
//
// The first input byte picks one of the service's unary RPCs (found through
// the descriptor pool, so RPCs added to supervisor.proto are fuzzed without
// touching this file); the rest is that RPC's serialized request. Two stages:
//
// 1. The daemon's own request checks, called directly: the UTF-8 walk over
//    the raw bytes (FindInvalidUtf8Field), run names (ValidateRunName), free
//    text (ValidateText), CreateRun (ValidateCreateRunRequest), step windows
//    (ValidateStepWindow), telemetry metric names (ValidateMetricNames /
//    FilterMetrics) and a policy from SetPolicy (MergePolicy +
//    ValidatePolicy).
// 2. The request sent to a real in-process daemon (Daemon::Start on a
//    loopback port, a catalog and tokens file in a temp dir) through a
//    generic stub, mostly with the generated admin token, sometimes with
//    none or a wrong one (then: UNAUTHENTICATED, or INVALID_ARGUMENT for a
//    request that does not parse). The
//    daemon must answer every request, and never with INTERNAL or UNKNOWN:
//    bad input is INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION /
//    OUT_OF_RANGE / ..., naming what is wrong. A crash, a sanitizer report or
//    a hang (-timeout) in any handler is a finding.
//
// Requests that are well-formed but for invalid UTF-8 in a string field go
// to the daemon as they are, and must be answered INVALID_ARGUMENT naming
// that field (FindInvalidUtf8Field's path).
//
// What the fuzzer may not do: make the daemon start programs. Every RunSpec
// in a request is cleared before it is sent, and requests that can carry
// one are never sent raw (launch commands are the launcher's business, not
// a fuzzer's to run on this machine).
//
// SG_FUZZ_NO_DAEMON=1 skips stage 2.
#include <stdlib.h>
#include <unistd.h>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#define SPIKEGUARD_FUZZ_PROTOBUF
#include "tests/fuzz/fuzz_common.h"
#include "daemon/daemon.h"
#include "daemon/incident/policy.h"
#include "daemon/ingest/limits.h"
#include "daemon/control/operator_handler.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/message.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"

namespace {

namespace v1 = spikeguard::v1;
namespace pb = google::protobuf;
using spikeguard::daemon::Limits;

std::vector<const pb::MethodDescriptor*>& Methods() {
  static std::vector<const pb::MethodDescriptor*> methods = [] {
    std::vector<const pb::MethodDescriptor*> out;
    const pb::ServiceDescriptor* service =
        pb::DescriptorPool::generated_pool()->FindServiceByName(
            v1::SupervisorService::service_full_name());
    for (int i = 0; i < service->method_count(); ++i) {
      const pb::MethodDescriptor* m = service->method(i);
      if (!m->client_streaming() && !m->server_streaming()) out.push_back(m);
    }
    return out;
  }();
  return methods;
}

// Clears every RunSpec (at any depth) so that no request can launch anything.
void ClearRunSpecs(pb::Message* msg, int depth = 0) {
  if (depth > 8) return;
  const pb::Reflection* refl = msg->GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  refl->ListFields(*msg, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->message_type()->full_name() == "spikeguard.v1.RunSpec") {
      refl->ClearField(msg, f);
      continue;
    }
    if (f->is_repeated()) {
      for (int i = 0; i < refl->FieldSize(*msg, f); ++i) {
        ClearRunSpecs(refl->MutableRepeatedMessage(msg, f, i), depth + 1);
      }
    } else {
      ClearRunSpecs(refl->MutableMessage(msg, f), depth + 1);
    }
  }
}

// "reports.reports[2].domain" -> "domain": the field a message must name
// (the daemon may spell the path its own way).
std::string LastName(const std::string& path) {
  std::string name = path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
  return name.substr(0, name.find('['));
}

// Whether a message of type `d` can hold a RunSpec (at any depth).
bool MayLaunch(const pb::Descriptor* d, int depth = 0) {
  if (d->full_name() == "spikeguard.v1.RunSpec") return true;
  if (depth > 8) return false;
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE &&
        MayLaunch(f->message_type(), depth + 1)) {
      return true;
    }
  }
  return false;
}

// Stage 1: the checks the service applies, on every string the request holds.
void ValidateStrings(const pb::Message& msg, const Limits& limits, int depth = 0) {
  if (depth > 8) return;
  const pb::Reflection* refl = msg.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  refl->ListFields(msg, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
      std::vector<std::string> values;
      if (f->is_repeated()) {
        for (int i = 0; i < refl->FieldSize(msg, f); ++i) {
          values.push_back(refl->GetRepeatedString(msg, f, i));
        }
      } else {
        values.push_back(refl->GetString(msg, f));
      }
      for (const std::string& v : values) {
        if (f->name() == "run" || f->name() == "name") {
          absl::Status s = spikeguard::daemon::ValidateRunName(v, limits);
          FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kInvalidArgument);
        }
        absl::Status s = spikeguard::daemon::ValidateText(f->name(), v, limits.max_string_length);
        FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kInvalidArgument);
      }
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
      if (f->is_repeated()) {
        for (int i = 0; i < refl->FieldSize(msg, f) && i < 16; ++i) {
          ValidateStrings(refl->GetRepeatedMessage(msg, f, i), limits, depth + 1);
        }
      } else {
        ValidateStrings(refl->GetMessage(msg, f), limits, depth + 1);
      }
    }
  }
}

// Every pair of the request's int64 fields as a step window (Skip, Replay).
void ValidateWindows(const pb::Message& req, const Limits& limits) {
  const pb::Reflection* refl = req.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  refl->ListFields(req, &fields);
  std::vector<int64_t> values = {-1, 0, std::numeric_limits<int64_t>::max()};
  for (const pb::FieldDescriptor* f : fields) {
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64 && !f->is_repeated()) {
      values.push_back(refl->GetInt64(req, f));
    }
  }
  for (int64_t from : values) {
    for (int64_t to : values) {
      absl::Status s = spikeguard::daemon::ValidateStepWindow("from", from, "to", to, limits);
      FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kInvalidArgument);
      if (s.ok()) {
        FUZZ_CHECK(from >= 0 && to >= from);
        FUZZ_CHECK(static_cast<__int128>(to) - from <= limits.max_step_ahead);
      }
    }
  }
}

void ValidateKnown(const pb::Message& req) {
  if (const auto* q = dynamic_cast<const v1::QueryTelemetryRequest*>(&req)) {
    absl::Status s = spikeguard::daemon::ValidateMetricNames(q->metrics());
    if (s.ok()) {
      v1::StepRecord record;
      record.set_step(3);
      record.set_loss(1.5);
      record.add_layers()->set_layer(2);
      (void)spikeguard::daemon::FilterMetrics(record, q->metrics());
    }
  }
  if (const auto* c = dynamic_cast<const v1::CreateRunRequest*>(&req)) {
    static const Limits limits;
    absl::Status s = spikeguard::daemon::ValidateCreateRunRequest(*c, limits);
    FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kInvalidArgument);
  }
  if (const auto* p = dynamic_cast<const v1::SetPolicyRequest*>(&req)) {
    namespace incident = spikeguard::incident;
    const v1::Policy merged = incident::MergePolicy(incident::DefaultPolicy(), p->policy());
    absl::Status s = incident::ValidatePolicy(merged);
    FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kInvalidArgument);
  }
}

struct Server {
  std::string token;  // the admin token the daemon generated
  std::string dir;
  std::unique_ptr<spikeguard::daemon::Daemon> daemon;
  std::shared_ptr<grpc::Channel> channel;
};

Server* StartServer() {
  if (const char* off = std::getenv("SG_FUZZ_NO_DAEMON"); off != nullptr && *off == '1') {
    return nullptr;
  }
  auto* server = new Server;
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                      "/sg-supervisor-fuzz-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  FUZZ_CHECK(::mkdtemp(buf.data()) != nullptr);
  server->dir = buf.data();
  spikeguard::daemon::Daemon::Options options;
  options.listen = "127.0.0.1:0";
  options.data_dir = server->dir;
  auto d = spikeguard::daemon::Daemon::Start(options);
  if (!d.ok()) {
    std::fprintf(stderr, "supervisor_request_fuzz: cannot start the daemon: %s\n",
                 std::string(d.status().message()).c_str());
    std::abort();
  }
  server->daemon = std::move(*d);
  {
    // The admin token the daemon wrote on first start (a tokens file is
    // the default: no anonymous access).
    std::ifstream in(server->daemon->generated_admin_token_file());
    std::getline(in, server->token);
    while (!server->token.empty() && std::isspace(static_cast<unsigned char>(server->token.back()))) {
      server->token.pop_back();
    }
    FUZZ_CHECK(!server->token.empty());
  }
  server->channel = grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server->daemon->port()), grpc::InsecureChannelCredentials());
  static Server* const cleanup = server;
  std::atexit([] {
    cleanup->daemon->Shutdown(absl::Seconds(1));
    std::error_code ec;
    std::filesystem::remove_all(cleanup->dir, ec);  // the catalog, nothing else
  });
  return server;
}

// How the daemon answered, printed at exit: a run where everything is
// UNAUTHENTICATED or INVALID_ARGUMENT reached no handler's logic.
void Tally(grpc::StatusCode code) {
  static int* const counts = [] {
    static int c[17] = {};
    std::atexit([] {
      std::fprintf(stderr, "supervisor_request_fuzz: answers by status code:");
      for (int i = 0; i < 17; ++i) {
        if (c[i] > 0) std::fprintf(stderr, " %d:%d", i, c[i]);
      }
      std::fprintf(stderr, "\n");
    });
    return c;
  }();
  const int i = static_cast<int>(code);
  if (i >= 0 && i < 17) ++counts[i];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Limits limits;
  static Server* server = StartServer();
  if (size == 0) return 0;
  const auto& methods = Methods();
  const pb::MethodDescriptor* method = methods[data[0] % methods.size()];
  std::unique_ptr<pb::Message> req(
      pb::MessageFactory::generated_factory()->GetPrototype(method->input_type())->New());
  const absl::string_view raw(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string bad_field =
      spikeguard::daemon::FindInvalidUtf8Field(method->input_type(), raw);
  std::string bytes;
  if (req->ParseFromArray(raw.data(), static_cast<int>(raw.size()))) {
    FUZZ_CHECK(bad_field.empty());
    ClearRunSpecs(req.get());
    ValidateStrings(*req, limits);
    ValidateKnown(*req);
    ValidateWindows(*req, limits);
    FUZZ_CHECK(req->SerializeToString(&bytes));
  } else if (!bad_field.empty() && !MayLaunch(method->input_type())) {
    // Well-formed but for invalid UTF-8 in `bad_field`: sent as it is, the
    // daemon must answer INVALID_ARGUMENT naming the field.
    // Not for requests that can carry a RunSpec: those are only ever sent
    // with their specs cleared.
    bytes.assign(raw.data(), raw.size());
  } else {
    return 0;
  }

  if (server == nullptr) return 0;
  const std::string path =
      "/" + method->service()->full_name() + "/" + method->name();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  // Who asks: mostly the admin (to reach the handlers), sometimes nobody or
  // a wrong token (the authorization path).
  const int who = (data[0] / methods.size()) % 4;
  if (who <= 1) ctx.AddMetadata("authorization", "Bearer " + server->token);
  if (who == 3) ctx.AddMetadata("authorization", "Bearer sg-not-a-token");
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      server->channel.get(),
      grpc::internal::RpcMethod(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC), &ctx,
      request, &response);
  Tally(status.error_code());
  if (who >= 2) {
    FUZZ_CHECK(status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
               status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  if (status.error_code() == grpc::StatusCode::INTERNAL ||
      status.error_code() == grpc::StatusCode::UNKNOWN ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      (who <= 1 && !bad_field.empty() && (status.error_code() != grpc::StatusCode::INVALID_ARGUMENT ||
                              status.error_message().find(LastName(bad_field)) ==
                                  std::string::npos))) {
    std::fprintf(stderr,
                 "supervisor_request_fuzz: %s answered %d: %s\n(invalid UTF-8 in: '%s')\n"
                 "request: %s\n",
                 path.c_str(), static_cast<int>(status.error_code()),
                 status.error_message().c_str(), bad_field.c_str(),
                 req->ShortDebugString().substr(0, 2000).c_str());
    std::abort();
  }
  return 0;
}
