#include "daemon/server/parse_errors.h"

#include <map>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/stubs/logging.h"

namespace spikeguard::daemon {
namespace {

namespace exp = grpc::experimental;

thread_local std::string last_parse_error;

// Fields that failed to parse on a stream, by call, until its handler asks.
absl::Mutex stream_errors_mu(absl::kConstInit);
std::map<const grpc::ServerContextBase*, std::string>& StreamErrors() {
  static auto* errors = new std::map<const grpc::ServerContextBase*, std::string>();
  return *errors;
}
google::protobuf::LogHandler* previous_handler = nullptr;

void CaptureHandler(google::protobuf::LogLevel level, const char* filename, int line,
                    const std::string& message) {
  // "String field 'spikeguard.v1.Hello.run' contains invalid UTF-8 data when
  // parsing a protocol buffer. ..."
  if (absl::StrContains(message, "invalid UTF-8") && absl::StrContains(message, "parsing")) {
    const size_t open = message.find('\'');
    const size_t close = open == std::string::npos ? open : message.find('\'', open + 1);
    last_parse_error = close == std::string::npos
                           ? std::string("a string field")
                           : message.substr(open + 1, close - open - 1);
  }
  if (previous_handler != nullptr) previous_handler(level, filename, line, message);
}

class ParseErrorInterceptor : public exp::Interceptor {
 public:
  void Intercept(exp::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(exp::InterceptionHookPoints::POST_RECV_MESSAGE) &&
        !received_) {
      received_ = true;
      // Deserialization ran on this thread just before this hook.
      std::string field = TakeParseError();
      if (methods->GetRecvMessage() == nullptr) {
        parse_failed_ = true;
        failed_field_ = std::move(field);
      }
    }
    if (methods->QueryInterceptionHookPoint(exp::InterceptionHookPoints::PRE_SEND_STATUS) &&
        parse_failed_) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::INTERNAL && status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                               ParseErrorMessage(failed_field_, "the request")));
      }
    }
    methods->Proceed();
  }

 private:
  bool received_ = false;
  bool parse_failed_ = false;
  std::string failed_field_;  // "" when the bytes were malformed otherwise
};

// Client-streaming calls read in their handler (callback API: on whatever
// thread completes the read), so the field is kept by call for the handler
// to ask with TakeStreamParseError.
class StreamParseErrorInterceptor : public exp::Interceptor {
 public:
  explicit StreamParseErrorInterceptor(const grpc::ServerContextBase* context)
      : context_(context) {}
  ~StreamParseErrorInterceptor() override {
    absl::MutexLock lock(&stream_errors_mu);
    StreamErrors().erase(context_);
  }
  void Intercept(exp::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(exp::InterceptionHookPoints::POST_RECV_MESSAGE)) {
      // Deserialization ran on this thread just before this hook.
      std::string field = TakeParseError();
      if (methods->GetRecvMessage() == nullptr && !field.empty()) {
        absl::MutexLock lock(&stream_errors_mu);
        StreamErrors()[context_] = std::move(field);
      }
    }
    methods->Proceed();
  }

 private:
  const grpc::ServerContextBase* const context_;
};

class ParseErrorFactory : public exp::ServerInterceptorFactoryInterface {
 public:
  exp::Interceptor* CreateServerInterceptor(exp::ServerRpcInfo* info) override {
    if (info->type() == exp::ServerRpcInfo::Type::UNARY ||
        info->type() == exp::ServerRpcInfo::Type::SERVER_STREAMING) {
      return new ParseErrorInterceptor();
    }
    return new StreamParseErrorInterceptor(info->server_context());
  }
};

}  // namespace

void InstallParseErrorCapture() {
  static std::once_flag once;
  std::call_once(once, [] { previous_handler = google::protobuf::SetLogHandler(&CaptureHandler); });
}

std::string TakeParseError() {
  std::string out;
  out.swap(last_parse_error);
  return out;
}

std::string TakeStreamParseError(const grpc::ServerContextBase* context) {
  absl::MutexLock lock(&stream_errors_mu);
  auto it = StreamErrors().find(context);
  if (it == StreamErrors().end()) return "";
  std::string out = std::move(it->second);
  StreamErrors().erase(it);
  return out;
}

std::string ParseErrorMessage(const std::string& field, const char* what) {
  if (field.empty()) {
    return absl::StrCat(what, " could not be parsed (malformed protobuf)");
  }
  // "spikeguard.v1.DomainLoss.domain" -> field "domain" of DomainLoss.
  return absl::StrCat(field, ": not valid UTF-8; ", what,
                      " could not be parsed (string fields must hold UTF-8; use escapes)");
}

std::unique_ptr<exp::ServerInterceptorFactoryInterface> MakeParseErrorInterceptorFactory() {
  return std::make_unique<ParseErrorFactory>();
}

}  // namespace spikeguard::daemon
