#include "daemon/server/audit_interceptor.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "daemon/auth/authorizer.h"
#include "daemon/ingest/limits.h"
#include "google/protobuf/message.h"
#include "spikeguard/v1/supervisor.pb.h"
#include "storage/catalog/catalog.h"

namespace spikeguard::daemon {
namespace {

namespace exp = grpc::experimental;
using google::protobuf::Message;

constexpr size_t kMaxDetail = 512;

const std::set<std::string>& MutatingRpcs() {
  static const auto* rpcs = new std::set<std::string>{
      "CreateRun", "SetRunProfile", "RegisterCheckpoint", "PinCheckpoint", "Rewind",
      "Replay",    "Skip",          "Pause",              "Resume",        "Approve",
      "Abort",     "SetPolicy",     "AddQuarantine",      "Attach"};
  return *rpcs;
}

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}


// The run a request names: a top-level "run" (or "name" for the run calls),
// or the "run" of its first message field (checkpoint, entry, hello).
std::string RunOf(const Message& m, const std::string& method) {
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  auto string_field = [&](const Message& msg, const char* name) -> std::string {
    const auto* f = msg.GetDescriptor()->FindFieldByName(name);
    if (f == nullptr || f->type() != google::protobuf::FieldDescriptor::TYPE_STRING ||
        f->is_repeated()) {
      return "";
    }
    return msg.GetReflection()->GetString(msg, f);
  };
  if (std::string run = string_field(m, "run"); !run.empty()) return run;
  if (method == "CreateRun" || method == "GetRun") return string_field(m, "name");
  for (int i = 0; i < d->field_count(); ++i) {
    const auto* f = d->field(i);
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE || f->is_repeated()) continue;
    if (!r->HasField(m, f)) continue;
    if (std::string run = string_field(r->GetMessage(m, f), "run"); !run.empty()) return run;
  }
  return "";
}

class AuditInterceptor : public exp::Interceptor {
 public:
  AuditInterceptor(exp::ServerRpcInfo* info, const auth::Authorizer* authorizer,
                   storage::Catalog* catalog, std::string method)
      : info_(info), authorizer_(authorizer), catalog_(catalog), method_(std::move(method)) {}

  void Intercept(exp::InterceptorBatchMethods* methods) override {
    if (method_.empty()) {
      methods->Proceed();
      return;
    }
    if (methods->QueryInterceptionHookPoint(exp::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      if (auto* md = methods->GetRecvInitialMetadata(); md != nullptr) {
        auto it = md->find("authorization");
        if (it != md->end()) {
          authorization_ = std::string(it->second.data(), it->second.size());
          has_authorization_ = true;
        }
      }
    }
    if (methods->QueryInterceptionHookPoint(exp::InterceptionHookPoints::POST_RECV_MESSAGE) &&
        !have_request_) {
      // The generated sync handlers deserialize into the request message.
      if (void* raw = methods->GetRecvMessage(); raw != nullptr) {
        const auto* m = static_cast<const Message*>(raw);
        run_ = RunOf(*m, method_);
        if (run_.empty() && (method_ == "Approve" || method_ == "Abort")) {
          const auto* f = m->GetDescriptor()->FindFieldByName("incident_id");
          if (f != nullptr) {
            const int64_t id = m->GetReflection()->GetInt64(*m, f);
            auto incident = catalog_->GetIncident(id);
            if (incident.ok()) run_ = incident->run();
          }
        }
        request_ = m->ShortDebugString();
        have_request_ = true;
      }
    }
    if (methods->QueryInterceptionHookPoint(exp::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void Record(const grpc::Status& status) {
    const grpc::StatusCode code = status.error_code();
    const bool refused = code == grpc::StatusCode::UNAUTHENTICATED ||
                         code == grpc::StatusCode::PERMISSION_DENIED;
    if (!IsMutatingRpc(method_) && !refused) return;
    spikeguard::v1::AuditEntry e;
    auto principal = authorizer_->Authenticate(has_authorization_ ? &authorization_ : nullptr);
    if (principal.ok()) {
      e.set_principal(principal->name);
      e.set_role(auth::RoleName(principal->role));
    } else {
      e.set_principal("unauthenticated");
    }
    e.set_rpc(method_);
    e.set_run(run_.substr(0, 256));
    e.set_outcome(CodeName(code));
    // Escaped (control characters, bytes that are not UTF-8) and cut, as
    // worker text is for the log: the row is a proto3 string.
    e.set_detail(LogText(status.ok() ? request_ : status.error_message(), kMaxDetail));
    if (info_->server_context() != nullptr) e.set_peer(info_->server_context()->peer());
    if (auto s = catalog_->AppendAudit(e); !s.ok()) {
      SG_LOG(WARNING) << "audit: could not record " << method_ << ": " << s.status().message();
    }
  }

  exp::ServerRpcInfo* info_;
  const auth::Authorizer* authorizer_;
  storage::Catalog* catalog_;
  std::string method_;
  std::string authorization_;
  bool has_authorization_ = false;
  bool have_request_ = false;
  std::string run_;
  std::string request_;
};

class AuditFactory : public exp::ServerInterceptorFactoryInterface {
 public:
  AuditFactory(const auth::Authorizer* authorizer, storage::Catalog* catalog)
      : authorizer_(authorizer), catalog_(catalog) {}

  exp::Interceptor* CreateServerInterceptor(exp::ServerRpcInfo* info) override {
    std::string method = info->method() == nullptr ? "" : info->method();
    // "/spikeguard.v1.SupervisorService/Rewind" -> "Rewind".
    // Other services (health) pass through with an empty method.
    method = absl::StartsWith(method, "/spikeguard.v1.") ? method.substr(method.rfind('/') + 1)
                                                         : std::string();
    // A worker stream carries thousands of messages: it records its own
    // refusal (AuditRefusedStream) instead of passing every message here.
    if (method.empty() || method == "Attach") return nullptr;
    return new AuditInterceptor(info, authorizer_, catalog_, std::move(method));
  }

 private:
  const auth::Authorizer* authorizer_;
  storage::Catalog* catalog_;
};

}  // namespace

bool IsMutatingRpc(const std::string& method) { return MutatingRpcs().count(method) > 0; }

void AuditRefusedStream(const auth::Authorizer* authorizer, storage::Catalog* catalog,
                        const grpc::ServerContextBase& context, const std::string& rpc,
                        const std::string& run, const grpc::Status& status) {
  const grpc::StatusCode code = status.error_code();
  if (code != grpc::StatusCode::UNAUTHENTICATED && code != grpc::StatusCode::PERMISSION_DENIED) {
    return;
  }
  spikeguard::v1::AuditEntry e;
  if (authorizer != nullptr) {
    auto principal = authorizer->Authenticate(context);
    if (principal.ok()) {
      e.set_principal(principal->name);
      e.set_role(auth::RoleName(principal->role));
    } else {
      e.set_principal("unauthenticated");
    }
  }
  e.set_rpc(rpc);
  e.set_run(run.substr(0, 256));
  e.set_outcome(CodeName(code));
  e.set_detail(LogText(status.error_message(), kMaxDetail));
  e.set_peer(context.peer());
  if (auto s = catalog->AppendAudit(e); !s.ok()) {
    SG_LOG(WARNING) << "audit: could not record " << rpc << ": " << s.status().message();
  }
}

void AuditRefusedBeforeRead(storage::Catalog* catalog, const std::string& method,
                            const grpc::Status& status) {
  if (!absl::StartsWith(method, "/spikeguard.v1.")) return;
  spikeguard::v1::AuditEntry e;
  e.set_principal("unauthenticated");
  e.set_rpc(LogText(method.substr(method.rfind('/') + 1), 128));
  e.set_outcome(CodeName(status.error_code()));
  e.set_detail(LogText(absl::StrCat(status.error_message(), " (refused before its request was read)"),
                       kMaxDetail));
  if (auto s = catalog->AppendAudit(e); !s.ok()) {
    SG_LOG(WARNING) << "audit: could not record " << e.rpc() << ": " << s.status().message();
  }
}

std::unique_ptr<exp::ServerInterceptorFactoryInterface> MakeAuditInterceptorFactory(
    const auth::Authorizer* authorizer, storage::Catalog* catalog) {
  return std::make_unique<AuditFactory>(authorizer, catalog);
}

}  // namespace spikeguard::daemon
