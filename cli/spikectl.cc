#include "cli/spikectl.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/args.h"
#include "base/secret.h"
#include "cli/format.h"
#include "cli/telemetry_metrics.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "report/incident_report.h"
#include "spikeguard/v1/supervisor.grpc.pb.h"
#include "worker/client/client_security.h"

namespace spikeguard::cli {
namespace {

namespace v1 = ::spikeguard::v1;
using Stub = v1::SupervisorService::Stub;

constexpr char kDefaultAddr[] = "127.0.0.1:7070";
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

constexpr char kGlobalFlagsHelp[] =
    "Global flags:\n"
    "  --addr=HOST:PORT       spikeguardd address (default $SPIKEGUARD_ADDR or 127.0.0.1:7070)\n"
    "  --output=table|json    output format (default table)\n"
    "  --timeout=SECONDS      deadline of each request (default 10)\n"
    "  --token-file=FILE      bearer token: the file's first line (default $SPIKEGUARD_TOKEN,\n"
    "                         else $SPIKEGUARD_TOKEN_FILE); --token=TOKEN gives it directly\n"
    "                         (visible to other users in ps: prefer the file)\n"
    "  --tls-ca=FILE          PEM CA that signed spikeguardd's certificate; turns TLS on\n"
    "                         (default $SPIKEGUARD_TLS_CA)\n"
    "  --tls-cert=FILE        client certificate for mutual TLS (default $SPIKEGUARD_TLS_CERT)\n"
    "  --tls-key=FILE         its private key (default $SPIKEGUARD_TLS_KEY)\n"
    "  --tls-server-name=NAME name checked in the daemon's certificate\n"
    "                         (default $SPIKEGUARD_TLS_SERVER_NAME, else the address's host)\n"
    "  -h, --help             show help\n";

struct GlobalOptions {
  std::string addr;
  bool json = false;
  absl::Duration timeout = absl::Seconds(10);
  // Token and TLS: the environment, then the flags over it.
  ClientSecurity security = ClientSecurity::FromEnv();
};

const std::vector<FlagSpec>& GlobalFlags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"addr", FlagSpec::kValue},     {"output", FlagSpec::kValue},
      {"timeout", FlagSpec::kValue},  {"token", FlagSpec::kValue},
      {"token-file", FlagSpec::kValue}, {"tls-ca", FlagSpec::kValue},
      {"tls-cert", FlagSpec::kValue}, {"tls-key", FlagSpec::kValue},
      {"tls-server-name", FlagSpec::kValue}};
  return *flags;
}

// Global flags that take a value (for "--addr host:port" before the command).
bool GlobalFlagTakesValue(absl::string_view word) {
  if (!absl::StartsWith(word, "--") || absl::StrContains(word, '=')) return false;
  for (const FlagSpec& f : GlobalFlags()) {
    if (word.substr(2) == f.name) return f.kind != FlagSpec::kBool;
  }
  return false;
}

// Folds global flags found in `args` into `options`.
absl::Status ApplyGlobalFlags(const ParsedArgs& args, GlobalOptions& options) {
  if (auto addr = args.Get("addr")) {
    if (addr->empty()) return absl::InvalidArgumentError("empty --addr");
    options.addr = *addr;
  }
  if (auto output = args.Get("output")) {
    if (*output == "json") {
      options.json = true;
    } else if (*output == "table") {
      options.json = false;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value for --output: '", *output, "' (want table or json)"));
    }
  }
  if (auto timeout = args.Get("timeout")) {
    absl::StatusOr<double> seconds = ParseDouble("--timeout", *timeout);
    if (!seconds.ok()) return seconds.status();
    if (*seconds <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value for --timeout: '", *timeout, "' (want seconds > 0)"));
    }
    options.timeout = absl::Seconds(*seconds);
  }
  // Both given: refuse rather than guess which one was meant.
  if (args.Has("token") && args.Has("token-file")) {
    return absl::InvalidArgumentError("give --token or --token-file, not both");
  }
  if (auto token = args.Get("token")) {
    if (token->empty()) return absl::InvalidArgumentError("empty --token");
    options.security.SetToken(*token, "--token");
  }
  if (auto path = args.Get("token-file")) {
    if (path->empty()) return absl::InvalidArgumentError("empty --token-file");
    options.security.SetTokenFile(*path, "--token-file");
  }
  struct PathFlag {
    const char* name;
    void (ClientSecurity::*set)(std::string, std::string);
  };
  for (const PathFlag& f : {PathFlag{"tls-ca", &ClientSecurity::SetTlsCa},
                            PathFlag{"tls-cert", &ClientSecurity::SetTlsCert},
                            PathFlag{"tls-key", &ClientSecurity::SetTlsKey},
                            PathFlag{"tls-server-name", &ClientSecurity::SetTlsServerName}}) {
    if (auto value = args.Get(f.name)) {
      if (value->empty()) return absl::InvalidArgumentError(absl::StrCat("empty --", f.name));
      (options.security.*f.set)(*value, absl::StrCat("--", f.name));
    }
  }
  return absl::OkStatus();
}

class Session;
using Handler = int (*)(Session&, const ParsedArgs&);

struct CommandDef {
  std::string group;  // "runs" for "runs list"; empty for top-level commands
  std::string name;
  std::string synopsis;  // arguments after the command words
  std::string summary;   // one line, for the overview
  std::string details;   // flag descriptions, for --help
  std::vector<FlagSpec> flags;
  std::vector<std::string> positional;
  size_t min_positional = 0;
  std::vector<std::string> required_flags;
  Handler handler = nullptr;
  // Does not talk to the daemon (no token or TLS files are read).
  bool offline = false;

  std::string FullName() const { return group.empty() ? name : absl::StrCat(group, " ", name); }
  std::string Usage() const {
    std::string usage = absl::StrCat("usage: spikectl [global flags] ", FullName());
    if (!synopsis.empty()) absl::StrAppend(&usage, " ", synopsis);
    absl::StrAppend(&usage, "\n\n", summary, "\n");
    if (!details.empty()) absl::StrAppend(&usage, "\n", details);
    absl::StrAppend(&usage, "\n", kGlobalFlagsHelp);
    return usage;
  }
};

const std::vector<CommandDef>& Commands();

std::string OverviewUsage() {
  std::string usage =
      "usage: spikectl [--addr=HOST:PORT] [--output=table|json] [--timeout=SECONDS] COMMAND ...\n"
      "\nspikectl talks to spikeguardd, the loss-spike supervisor of a training run.\n"
      "\nCommands:\n";
  size_t width = 0;
  for (const CommandDef& c : Commands()) width = std::max(width, c.FullName().size());
  for (const CommandDef& c : Commands()) {
    absl::StrAppend(&usage, "  ", c.FullName(), std::string(width - c.FullName().size() + 2, ' '),
                    c.summary, "\n");
  }
  absl::StrAppend(&usage, "\n", kGlobalFlagsHelp,
                  "\nRun 'spikectl COMMAND --help' for a command's flags. Exit codes: 0 ok, "
                  "1 the daemon refused or failed, 2 usage error.\n");
  return usage;
}

bool IsGroup(absl::string_view word) {
  for (const CommandDef& c : Commands()) {
    if (c.group == word) return true;
  }
  return false;
}

std::string GroupUsage(absl::string_view group) {
  std::string usage = absl::StrCat("usage: spikectl [global flags] ", group, " COMMAND ...\n\nCommands:\n");
  size_t width = 0;
  for (const CommandDef& c : Commands()) {
    if (c.group == group) width = std::max(width, c.FullName().size());
  }
  for (const CommandDef& c : Commands()) {
    if (c.group != group) continue;
    absl::StrAppend(&usage, "  ", c.FullName(), std::string(width - c.FullName().size() + 2, ' '),
                    c.summary, "\n");
  }
  absl::StrAppend(&usage, "\nRun 'spikectl ", group, " COMMAND --help' for a command's flags.\n");
  return usage;
}

// Status codes are numbered alike in gRPC and Abseil.
std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// Collects text-format parse errors as "line L column C: message".
class TextErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error_.empty()) error_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

// Reads `path` as a text-format `message`; the error names the flag and file.
absl::Status ReadTextProto(absl::string_view flag, const std::string& path,
                           google::protobuf::Message* message) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", flag, " file '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  TextErrorCollector errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), message)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", flag, " file '", path, "': ", errors.error()));
  }
  return absl::OkStatus();
}

// Whether `addr` ("host:port", "dns:///host:port", "unix:path") stays on
// this machine.
bool IsLoopback(absl::string_view addr) {
  if (absl::StartsWith(addr, "unix:") || absl::StartsWith(addr, "unix-abstract:")) return true;
  absl::ConsumePrefix(&addr, "dns:///");
  absl::ConsumePrefix(&addr, "ipv4:");
  absl::ConsumePrefix(&addr, "ipv6:");
  std::string host(addr);
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == std::string::npos ? std::string::npos
                                                               : host.find(']') - 1);
  } else if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1";
}

// A random idempotency key: a retried invocation must not act twice, two
// invocations must not be merged.
std::string NewRequestId() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();
  return absl::StrFormat("spikectl-%016x", (hi << 32) ^ lo);
}

// One invocation: the chosen command, where to print, and the connection.
class Session {
 public:
  Session(const CommandDef& command, GlobalOptions options, ResolvedSecurity security,
          std::ostream& out, std::ostream& err)
      : command_(command),
        options_(std::move(options)),
        security_(std::move(security)),
        out_(out),
        err_(err) {}

  const GlobalOptions& options() const { return options_; }
  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }

  // Adds the bearer token (if any) to a context the caller made itself
  // (streams); Call() does it for unary RPCs.
  void Authorize(grpc::ClientContext* context) const { security_.Authorize(context); }

  // Prints "spikectl: <reason>" and the command's usage; returns exit code 2.
  int UsageError(absl::string_view reason) {
    err_ << "spikectl: " << reason << "\n" << command_.Usage();
    return kExitUsage;
  }
  int UsageError(const absl::Status& status) { return UsageError(status.message()); }

  // Prints the response as JSON or as `table`.
  void Emit(const google::protobuf::Message& response, const std::string& table) {
    if (options_.json) {
      out_ << ToJson(response) << "\n";
    } else {
      out_ << table;
    }
    out_.flush();
  }

  // Runs one unary RPC, `rpc(stub, context)`, under the deadline. On failure
  // prints the reason and returns false.
  template <typename Rpc>
  bool Call(Rpc rpc) {
    if (!Connect()) return false;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(options_.timeout));
    security_.Authorize(&context);
    grpc::Status status = rpc(stub_.get(), &context);
    if (status.ok()) return true;
    ReportRpcError(status);
    return false;
  }

  // As Call, but says nothing on failure: for an extra the output can go
  // without (an older daemon without the RPC).
  template <typename Rpc>
  bool TryCall(Rpc rpc) {
    if (stub_ == nullptr) return false;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(options_.timeout));
    security_.Authorize(&context);
    return rpc(stub_.get(), &context).ok();
  }

  // For server streams: connects under the deadline; the stream itself has
  // none, it lasts until the server ends it.
  bool Connect() {
    if (stub_ == nullptr) {
      if (!security_.tls && !security_.token.empty() && !IsLoopback(options_.addr)) {
        err_ << "spikectl: warning: the token from " << security_.token_origin
             << " goes in clear text to " << options_.addr
             << " (no --tls-ca or SPIKEGUARD_TLS_CA)\n";
      }
      channel_ = CreateClientChannel(options_.addr, security_, grpc::ChannelArguments());
      stub_ = v1::SupervisorService::NewStub(channel_);
    }
    const auto deadline =
        std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.timeout);
    grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY) {
      // A refused connection fails at once instead of waiting out the
      // deadline in reconnect backoff.
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
        const std::string why = ConnectionError();
        err_ << "spikectl: UNAVAILABLE: cannot reach spikeguardd at " << options_.addr << why
             << "\n";
        // Nothing listens there: no TLS setting would help.
        if (!absl::StrContains(why, "Connection refused")) PrintHint(grpc::StatusCode::UNAVAILABLE);
        return false;
      }
      if (!channel_->WaitForStateChange(state, deadline)) {
        err_ << "spikectl: UNAVAILABLE: cannot reach spikeguardd at " << options_.addr
             << " (no connection within " << absl::FormatDuration(options_.timeout) << ")\n";
        PrintHint(grpc::StatusCode::UNAVAILABLE);
        return false;
      }
      state = channel_->GetState(/*try_to_connect=*/true);
    }
    return true;
  }

  Stub* stub() { return stub_.get(); }

  void ReportRpcError(const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && channel_ != nullptr &&
        channel_->GetState(false) != GRPC_CHANNEL_READY) {
      err_ << "spikectl: UNAVAILABLE: cannot reach spikeguardd at " << options_.addr << " ("
           << status.error_message() << ")\n";
      PrintHint(grpc::StatusCode::UNAVAILABLE);
      return;
    }
    err_ << "spikectl: " << CodeName(status.error_code()) << ": " << status.error_message()
         << "\n";
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      PrintHint(status.error_code());
    }
  }

  void PrintHint(grpc::StatusCode code) {
    const std::string hint = security_.Hint(code);
    if (!hint.empty()) err_ << "spikectl: hint: " << hint << "\n";
  }

  // An action the daemon answered but did not accept is a refusal: exit 1.
  int EmitAction(const v1::ActionResponse& response) {
    Emit(response, FormatAction(response));
    if (response.accepted()) return kExitOk;
    err_ << "spikectl: not accepted: "
         << (response.message().empty() ? "the daemon gave no reason" : response.message())
         << "\n";
    return kExitFailed;
  }

 private:
  // Why the channel failed to connect, as " (reason)" or "": the states say
  // only that it failed, a call fails with gRPC's reason (for TLS, what the
  // handshake did not like).
  std::string ConnectionError() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    context.set_wait_for_ready(false);
    v1::ServerStatus ignored;
    // No token: this call only probes the connection and is never served.
    const grpc::Status status = stub_->GetStatus(&context, v1::GetStatusRequest(), &ignored);
    if (status.ok() || status.error_message().empty()) return "";
    return absl::StrCat(" (", status.error_message(), ")");
  }

  const CommandDef& command_;
  GlobalOptions options_;
  const ResolvedSecurity security_;
  std::ostream& out_;
  std::ostream& err_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
};

// --- argument helpers --------------------------------------------------------

// Parses an optional integer flag; a bad number is a usage error.
absl::StatusOr<std::optional<int64_t>> OptionalInt(const ParsedArgs& args, absl::string_view flag) {
  std::optional<std::string> text = args.Get(flag);
  if (!text.has_value()) return std::nullopt;
  absl::StatusOr<int64_t> value = ParseInt64(absl::StrCat("--", flag), *text);
  if (!value.ok()) return value.status();
  return *value;
}

absl::StatusOr<int64_t> RequiredInt(const ParsedArgs& args, absl::string_view flag) {
  // Presence was checked against CommandDef::required_flags.
  return ParseInt64(absl::StrCat("--", flag), args.Get(flag).value_or(""));
}

absl::StatusOr<int64_t> NonNegative(absl::StatusOr<int64_t> value, absl::string_view what) {
  if (value.ok() && *value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must not be negative: ", *value));
  }
  return value;
}

// "observe" -> MODE_OBSERVE.
absl::StatusOr<v1::Mode> ParseMode(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "observe") return v1::MODE_OBSERVE;
  if (lower == "propose") return v1::MODE_PROPOSE;
  if (lower == "auto") return v1::MODE_AUTO;
  return absl::InvalidArgumentError(
      absl::StrCat("bad value for --mode: '", text, "' (want observe, propose or auto)"));
}

// Case-insensitive enum value names, '-' accepted for '_'
// ("awaiting-approval" -> AWAITING_APPROVAL).
template <typename Enum>
absl::StatusOr<Enum> ParseEnumFlag(absl::string_view flag, absl::string_view text,
                                   const google::protobuf::EnumDescriptor* descriptor) {
  std::string upper = absl::AsciiStrToUpper(text);
  std::replace(upper.begin(), upper.end(), '-', '_');
  const google::protobuf::EnumValueDescriptor* value = descriptor->FindValueByName(upper);
  if (value == nullptr || value->number() == 0) {
    std::vector<std::string> names;
    for (int i = 1; i < descriptor->value_count(); ++i) {
      names.push_back(absl::AsciiStrToLower(descriptor->value(i)->name()));
    }
    return absl::InvalidArgumentError(absl::StrCat("bad value for --", flag, ": '", text,
                                                   "' (want one of ", absl::StrJoin(names, ", "),
                                                   ")"));
  }
  return static_cast<Enum>(value->number());
}

// --- handlers ------------------------------------------------------------------

#define SPIKECTL_USAGE_IF_ERROR(session, expr)                 \
  do {                                                         \
    const ::absl::Status spikectl_status_ = (expr);            \
    if (!spikectl_status_.ok()) return (session).UsageError(spikectl_status_); \
  } while (0)

// Binds `lhs` to the value of a StatusOr or returns a usage error.
#define SPIKECTL_ASSIGN_OR_USAGE(session, lhs, expr)     \
  auto lhs##_or = (expr);                                \
  if (!lhs##_or.ok()) return (session).UsageError(lhs##_or.status()); \
  auto lhs = *std::move(lhs##_or)

int Status(Session& s, const ParsedArgs& args) {
  v1::ServerStatus response;
  if (!s.Call([&](Stub* stub, grpc::ClientContext* ctx) {
        return stub->GetStatus(ctx, v1::GetStatusRequest(), &response);
      })) {
    return kExitFailed;
  }
  // The active precursor warnings of the runs the caller may see, by run.
  v1::ListWarningsRequest request;
  request.set_state(v1::WARNING_ACTIVE);
  v1::ListWarningsResponse warnings;
  const bool listed = s.TryCall([&](Stub* stub, grpc::ClientContext* ctx) {
    return stub->ListWarnings(ctx, request, &warnings);
  });
  std::string text = FormatStatus(response);
  if (listed) text += FormatActiveWarnings(warnings);
  s.Emit(response, text);
  return kExitOk;
}

// Calls one unary RPC with `request` and prints the response with `format`
// (table) or as JSON; the exit code of spikectl.
template <typename Response, typename Request, typename Format>
int CallAndEmit(Session& s,
                grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                const Request& request, Format format) {
  Response response;
  if (!s.Call([&](Stub* stub, grpc::ClientContext* ctx) {
        return (stub->*rpc)(ctx, request, &response);
      })) {
    return kExitFailed;
  }
  s.Emit(response, format(response));
  return kExitOk;
}

// A list RPC whose responses come in pages (the daemon keeps each under a
// byte budget): follows next_page_token and prints every page as one
// response.
template <typename Response, typename Request, typename Format>
int CallAllPagesAndEmit(Session& s,
                        grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                        Request request, Format format) {
  Response all;
  std::vector<std::string> seen_tokens;
  while (true) {
    Response page;
    if (!s.Call([&](Stub* stub, grpc::ClientContext* ctx) {
          return (stub->*rpc)(ctx, request, &page);
        })) {
      return kExitFailed;
    }
    const std::string next = page.next_page_token();
    all.MergeFrom(page);  // appends the page's items
    if (next.empty()) break;
    // A daemon that hands out a page token twice would loop forever.
    if (std::find(seen_tokens.begin(), seen_tokens.end(), next) != seen_tokens.end()) {
      s.err() << "spikectl: INTERNAL: spikeguardd repeated the page token '" << next << "'\n";
      return kExitFailed;
    }
    seen_tokens.push_back(next);
    request.set_page_token(next);
  }
  all.clear_next_page_token();
  s.Emit(all, format(all));
  return kExitOk;
}

int RunsList(Session& s, const ParsedArgs& args) {
  return CallAllPagesAndEmit<v1::ListRunsResponse>(s, &Stub::ListRuns, v1::ListRunsRequest(),
                                                   FormatRunList);
}

int RunsCreate(Session& s, const ParsedArgs& args) {
  v1::CreateRunRequest request;
  request.set_name(args.positional[0]);
  SPIKECTL_ASSIGN_OR_USAGE(s, world_size, OptionalInt(args, "world-size"));
  if (world_size.has_value()) {
    if (*world_size < 1 || *world_size > std::numeric_limits<uint32_t>::max()) {
      return s.UsageError(absl::StrCat("bad value for --world-size: ", *world_size,
                                       " (want a positive rank count)"));
    }
    request.set_world_size(static_cast<uint32_t>(*world_size));
  } else {
    request.set_world_size(1);
  }
  if (auto mode = args.Get("mode")) {
    SPIKECTL_ASSIGN_OR_USAGE(s, parsed, ParseMode(*mode));
    request.set_mode(parsed);
  }
  if (auto spec = args.Get("spec")) {
    SPIKECTL_USAGE_IF_ERROR(s, ReadTextProto("--spec", *spec, request.mutable_spec()));
    request.set_launch(true);
    if (!world_size.has_value() && !request.spec().profile().empty()) {
      // A launch profile has no rank count: the run's world size is the
      // number of ranks the daemon starts. Said, so a DDP trainer meant for
      // several ranks does not quietly train on one.
      s.err() << "spikectl: warning: no --world-size: the daemon launches 1 rank of profile '"
              << request.spec().profile() << "' (--world-size=N launches N ranks; workers "
              << "of another world size are refused)\n";
    }
  }
  return CallAndEmit<v1::Run>(s, &Stub::CreateRun, request, FormatRun);
}

int RunsSetProfile(Session& s, const ParsedArgs& args) {
  v1::SetRunProfileRequest request;
  request.set_run(args.positional[0]);
  request.set_profile(*args.Get("profile"));
  for (const std::string& kv : args.GetAll("param")) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return s.UsageError(absl::StrCat("bad value for --param: '", kv, "' (want NAME=VALUE)"));
    }
    (*request.mutable_params())[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return CallAndEmit<v1::Run>(s, &Stub::SetRunProfile, request, FormatRun);
}

int RunsShow(Session& s, const ParsedArgs& args) {
  v1::GetRunRequest request;
  request.set_name(args.positional[0]);
  return CallAndEmit<v1::Run>(s, &Stub::GetRun, request, FormatRun);
}

int CheckpointsList(Session& s, const ParsedArgs& args) {
  v1::ListCheckpointsRequest request;
  request.set_run(*args.Get("run"));
  return CallAllPagesAndEmit<v1::ListCheckpointsResponse>(s, &Stub::ListCheckpoints, request,
                                                          FormatCheckpoints);
}

int Telemetry(Session& s, const ParsedArgs& args) {
  v1::QueryTelemetryRequest request;
  request.set_run(*args.Get("run"));
  SPIKECTL_ASSIGN_OR_USAGE(s, gen, OptionalInt(args, "gen"));
  if (gen.has_value()) request.set_generation(*gen);
  SPIKECTL_ASSIGN_OR_USAGE(s, from, OptionalInt(args, "from"));
  if (from.has_value()) request.set_from_step(*from);
  SPIKECTL_ASSIGN_OR_USAGE(s, to, OptionalInt(args, "to"));
  if (to.has_value()) request.set_to_step(*to);
  if (from.has_value() && to.has_value() && *from > *to) {
    return s.UsageError(absl::StrCat("--from ", *from, " is after --to ", *to));
  }
  SPIKECTL_ASSIGN_OR_USAGE(s, limit, OptionalInt(args, "limit"));
  if (limit.has_value()) {
    if (*limit < 1 || *limit > std::numeric_limits<int32_t>::max()) {
      return s.UsageError(absl::StrCat("bad value for --limit: ", *limit, " (want a positive count)"));
    }
    request.set_limit(static_cast<int32_t>(*limit));
  }
  std::vector<std::string> names;
  for (const std::string& list : args.GetAll("metrics")) {
    for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
      names.emplace_back(absl::StripAsciiWhitespace(name));
    }
  }
  if (args.Has("metrics") && names.empty()) return s.UsageError("empty --metrics");
  if (names.empty()) names = DefaultTelemetryMetrics();
  SPIKECTL_ASSIGN_OR_USAGE(s, metrics, ParseTelemetryMetrics(names));
  // The table needs only its columns. JSON prints whole records, every field
  // included, so without --metrics it asks for everything: a projection to
  // the default columns printed data_position, tokens, loss_hash and unix_ms
  // as 0.
  if (!s.options().json || args.Has("metrics")) {
    for (std::string& field : RequestFields(metrics)) request.add_metrics(std::move(field));
  }

  // The daemon pages telemetry by rows and by bytes: follow next_from_step
  // until the range (or --limit) is done.
  v1::QueryTelemetryResponse response;
  while (true) {
    v1::QueryTelemetryResponse page;
    if (!s.Call([&](Stub* stub, grpc::ClientContext* ctx) {
          return stub->QueryTelemetry(ctx, request, &page);
        })) {
      return kExitFailed;
    }
    for (v1::StepRecord& r : *page.mutable_records()) *response.add_records() = std::move(r);
    response.set_truncated(page.truncated());
    response.set_next_from_step(page.next_from_step());
    if (!page.truncated()) break;
    if (limit.has_value() && response.records_size() >= *limit) break;
    // An older daemon sets no next_from_step: it stays cut, as it said.
    if (page.next_from_step() <= request.from_step()) break;
    request.set_from_step(page.next_from_step());
    if (limit.has_value()) request.set_limit(static_cast<int32_t>(*limit - response.records_size()));
  }
  s.Emit(response, FormatTelemetry(response, metrics));
  return kExitOk;
}

int IncidentsList(Session& s, const ParsedArgs& args) {
  v1::ListIncidentsRequest request;
  if (auto run = args.Get("run")) request.set_run(*run);
  if (auto state = args.Get("state")) {
    SPIKECTL_ASSIGN_OR_USAGE(
        s, parsed, ParseEnumFlag<v1::IncidentState>("state", *state, v1::IncidentState_descriptor()));
    request.set_state(parsed);
  }
  if (auto verdict = args.Get("verdict")) {
    SPIKECTL_ASSIGN_OR_USAGE(
        s, parsed, ParseEnumFlag<v1::Verdict>("verdict", *verdict, v1::Verdict_descriptor()));
    request.set_verdict(parsed);
  }
  // Precursor warnings are not incidents: one line says how many the same
  // runs have and where to see them.
  v1::ListWarningsRequest warnings_request;
  warnings_request.set_run(request.run());
  return CallAllPagesAndEmit<v1::ListIncidentsResponse>(
      s, &Stub::ListIncidents, request, [&](const v1::ListIncidentsResponse& incidents) {
        std::string text = FormatIncidentList(incidents);
        v1::ListWarningsResponse warnings;
        if (s.TryCall([&](Stub* stub, grpc::ClientContext* ctx) {
              return stub->ListWarnings(ctx, warnings_request, &warnings);
            })) {
          text += FormatWarningSummary(warnings);
        }
        return text;
      });
}

absl::StatusOr<v1::WarningState> ParseWarningState(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "active") return v1::WARNING_ACTIVE;
  if (lower == "cleared") return v1::WARNING_CLEARED;
  if (lower == "preceded") return v1::WARNING_PRECEDED_INCIDENT;
  return absl::InvalidArgumentError(
      absl::StrCat("bad value for --state: '", text, "' (want active, cleared or preceded)"));
}

int WarningsList(Session& s, const ParsedArgs& args) {
  v1::ListWarningsRequest request;
  if (auto run = args.Get("run")) request.set_run(*run);
  if (auto state = args.Get("state")) {
    SPIKECTL_ASSIGN_OR_USAGE(s, parsed, ParseWarningState(*state));
    request.set_state(parsed);
  }
  return CallAllPagesAndEmit<v1::ListWarningsResponse>(s, &Stub::ListWarnings, request,
                                                       FormatWarningList);
}

int IncidentsShow(Session& s, const ParsedArgs& args) {
  v1::GetIncidentRequest request;
  SPIKECTL_ASSIGN_OR_USAGE(s, id, ParseInt64("ID", args.positional[0]));
  request.set_id(id);
  return CallAndEmit<v1::Incident>(s, &Stub::GetIncident, request, FormatIncident);
}

int IncidentsWatch(Session& s, const ParsedArgs& args) {
  v1::WatchIncidentsRequest request;
  if (auto run = args.Get("run")) request.set_run(*run);
  if (!s.Connect()) return kExitFailed;
  grpc::ClientContext context;  // no deadline: a watch lasts until interrupted
  s.Authorize(&context);
  std::unique_ptr<grpc::ClientReader<v1::IncidentUpdate>> reader =
      s.stub()->WatchIncidents(&context, request);
  v1::IncidentUpdate update;
  while (reader->Read(&update)) s.Emit(update, FormatIncidentUpdate(update));
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    s.ReportRpcError(status);
    return kExitFailed;
  }
  return kExitOk;
}

absl::StatusOr<v1::SkipWindow> ParseSkipWindow(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  v1::SkipWindow window;
  int64_t from = 0, to = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &from) ||
      !absl::SimpleAtoi(parts[1], &to) || from < 0 || from > to) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad value for --skip: '", text, "' (want FROM:TO steps, FROM <= TO)"));
  }
  window.set_from_step(from);
  window.set_to_step(to);
  return window;
}

// Calls one action RPC and reports whether the daemon accepted it.
template <typename Request>
int CallAction(Session& s,
               grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&,
                                         v1::ActionResponse*),
               const Request& request) {
  v1::ActionResponse response;
  if (!s.Call([&](Stub* stub, grpc::ClientContext* ctx) {
        return (stub->*rpc)(ctx, request, &response);
      })) {
    return kExitFailed;
  }
  return s.EmitAction(response);
}

int Rewind(Session& s, const ParsedArgs& args) {
  v1::RewindRequest request;
  request.set_run(*args.Get("run"));
  SPIKECTL_ASSIGN_OR_USAGE(s, to_step, NonNegative(RequiredInt(args, "to-step"), "--to-step"));
  request.set_to_step(to_step);
  for (const std::string& text : args.GetAll("skip")) {
    SPIKECTL_ASSIGN_OR_USAGE(s, window, ParseSkipWindow(text));
    *request.add_skip() = window;
  }
  SPIKECTL_ASSIGN_OR_USAGE(s, stop_after, OptionalInt(args, "stop-after"));
  if (stop_after.has_value()) request.set_stop_after_step(*stop_after);
  request.set_request_id(NewRequestId());
  return CallAction(s, &Stub::Rewind, request);
}

int Replay(Session& s, const ParsedArgs& args) {
  v1::ReplayRequest request;
  request.set_run(*args.Get("run"));
  SPIKECTL_ASSIGN_OR_USAGE(s, from_step, NonNegative(RequiredInt(args, "from-step"), "--from-step"));
  request.set_from_step(from_step);
  SPIKECTL_ASSIGN_OR_USAGE(s, stop_after, OptionalInt(args, "stop-after"));
  if (stop_after.has_value()) request.set_stop_after_step(*stop_after);
  request.set_request_id(NewRequestId());
  return CallAction(s, &Stub::Replay, request);
}

int Skip(Session& s, const ParsedArgs& args) {
  v1::SkipRequest request;
  request.set_run(*args.Get("run"));
  SPIKECTL_ASSIGN_OR_USAGE(s, from, NonNegative(RequiredInt(args, "from"), "--from"));
  SPIKECTL_ASSIGN_OR_USAGE(s, to, NonNegative(RequiredInt(args, "to"), "--to"));
  if (from > to) return s.UsageError(absl::StrCat("--from ", from, " is after --to ", to));
  request.set_from_step(from);
  request.set_to_step(to);
  request.set_request_id(NewRequestId());
  return CallAction(s, &Stub::Skip, request);
}

int Pause(Session& s, const ParsedArgs& args) {
  v1::PauseRequest request;
  request.set_run(*args.Get("run"));
  return CallAction(s, &Stub::Pause, request);
}

int Resume(Session& s, const ParsedArgs& args) {
  v1::ResumeRequest request;
  request.set_run(*args.Get("run"));
  return CallAction(s, &Stub::Resume, request);
}

int Approve(Session& s, const ParsedArgs& args) {
  v1::ApproveRequest request;
  SPIKECTL_ASSIGN_OR_USAGE(s, id, ParseInt64("ID", args.positional[0]));
  request.set_incident_id(id);
  return CallAction(s, &Stub::Approve, request);
}

int Abort(Session& s, const ParsedArgs& args) {
  v1::AbortRequest request;
  SPIKECTL_ASSIGN_OR_USAGE(s, id, ParseInt64("ID", args.positional[0]));
  request.set_incident_id(id);
  if (auto reason = args.Get("reason")) request.set_reason(*reason);
  return CallAction(s, &Stub::Abort, request);
}

int PolicyGet(Session& s, const ParsedArgs& args) {
  v1::GetPolicyRequest request;
  if (auto run = args.Get("run")) request.set_run(*run);
  return CallAndEmit<v1::Policy>(s, &Stub::GetPolicy, request, FormatPolicy);
}

int PolicySet(Session& s, const ParsedArgs& args) {
  v1::SetPolicyRequest request;
  if (auto run = args.Get("run")) request.set_run(*run);
  SPIKECTL_USAGE_IF_ERROR(s, ReadTextProto("--file", *args.Get("file"), request.mutable_policy()));
  return CallAndEmit<v1::Policy>(s, &Stub::SetPolicy, request, FormatPolicy);
}

int Manifest(Session& s, const ParsedArgs& args) {
  v1::ResolveManifestRequest request;
  request.set_run(*args.Get("run"));
  SPIKECTL_ASSIGN_OR_USAGE(s, from, NonNegative(RequiredInt(args, "from"), "--from"));
  SPIKECTL_ASSIGN_OR_USAGE(s, to, NonNegative(RequiredInt(args, "to"), "--to"));
  if (from > to) return s.UsageError(absl::StrCat("--from ", from, " is after --to ", to));
  request.set_from_step(from);
  request.set_to_step(to);
  SPIKECTL_ASSIGN_OR_USAGE(s, gen, OptionalInt(args, "gen"));
  if (gen.has_value()) {
    request.set_generation(*gen);
  } else {
    // The request's 0 would mean generation 0: the current one is the run's.
    v1::GetRunRequest get;
    get.set_name(request.run());
    v1::Run run;
    if (!s.Call([&](Stub* stub, grpc::ClientContext* ctx) { return stub->GetRun(ctx, get, &run); })) {
      return kExitFailed;
    }
    request.set_generation(run.current_generation());
  }
  return CallAndEmit<v1::ResolveManifestResponse>(s, &Stub::ResolveManifest, request, FormatManifest);
}

int QuarantineList(Session& s, const ParsedArgs& args) {
  v1::ListQuarantineRequest request;
  request.set_run(*args.Get("run"));
  return CallAllPagesAndEmit<v1::ListQuarantineResponse>(s, &Stub::ListQuarantine, request,
                                                         FormatQuarantine);
}

int Audit(Session& s, const ParsedArgs& args) {
  v1::ListAuditRequest request;
  if (auto run = args.Get("run")) request.set_run(*run);
  if (auto principal = args.Get("principal")) request.set_principal(*principal);
  SPIKECTL_ASSIGN_OR_USAGE(s, since, OptionalInt(args, "since"));
  if (since.has_value()) {
    if (*since < 0) return s.UsageError(absl::StrCat("bad value for --since: ", *since,
                                                     " (want unix milliseconds >= 0)"));
    request.set_since_unix_ms(*since);
  }
  SPIKECTL_ASSIGN_OR_USAGE(s, limit, OptionalInt(args, "limit"));
  if (limit.has_value() && (*limit < 1 || *limit > std::numeric_limits<int32_t>::max())) {
    return s.UsageError(absl::StrCat("bad value for --limit: ", *limit, " (want a positive count)"));
  }
  // Every page, into one response; --limit counts entries over all pages.
  v1::ListAuditResponse all;
  std::vector<std::string> seen_tokens;
  while (true) {
    if (limit.has_value()) {
      request.set_limit(static_cast<int32_t>(*limit - all.entries_size()));
    }
    v1::ListAuditResponse page;
    if (!s.Call([&](Stub* stub, grpc::ClientContext* ctx) {
          return stub->ListAudit(ctx, request, &page);
        })) {
      return kExitFailed;
    }
    for (v1::AuditEntry& e : *page.mutable_entries()) {
      if (limit.has_value() && all.entries_size() >= *limit) break;
      *all.add_entries() = std::move(e);
    }
    if (page.next_page_token().empty()) break;
    if (limit.has_value() && all.entries_size() >= *limit) break;
    // A daemon that hands out a page token twice would loop forever.
    if (std::find(seen_tokens.begin(), seen_tokens.end(), page.next_page_token()) !=
        seen_tokens.end()) {
      s.err() << "spikectl: INTERNAL: spikeguardd repeated the page token '"
              << page.next_page_token() << "' of ListAudit\n";
      return kExitFailed;
    }
    seen_tokens.push_back(page.next_page_token());
    request.set_page_token(page.next_page_token());
  }
  s.Emit(all, FormatAudit(all));
  return kExitOk;
}

// One word: the tokens file splits on whitespace and '#' starts a comment.
absl::Status CheckTokensFileWord(absl::string_view flag, absl::string_view word) {
  if (word.empty()) return absl::InvalidArgumentError(absl::StrCat("empty --", flag));
  for (char c : word) {
    if (c <= 0x20 || c >= 0x7f || c == '#') {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad value for --", flag, ": '", word,
          "' (want printable ASCII without spaces or '#')"));
    }
  }
  return absl::OkStatus();
}

// `report ID [--out=FILE]`: the incident as one self-contained HTML page
// (report/incident_report.h), built from GetIncident, GetRun and
// QueryTelemetry. --out=- writes the page to stdout.
int Report(Session& s, const ParsedArgs& args) {
  SPIKECTL_ASSIGN_OR_USAGE(s, id, ParseInt64("ID", args.positional[0]));
  std::string path = absl::StrCat("incident-", id, ".html");
  if (auto out = args.Get("out")) {
    if (out->empty()) return s.UsageError("empty --out");
    path = *out;
  }
  if (!s.Connect()) return kExitFailed;
  const absl::Duration timeout = s.options().timeout;
  absl::StatusOr<report::ReportData> data = report::FetchReportData(
      s.stub(),
      [&](grpc::ClientContext* ctx) {
        ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
        s.Authorize(ctx);
      },
      id);
  if (!data.ok()) {
    s.ReportRpcError(grpc::Status(static_cast<grpc::StatusCode>(data.status().code()),
                                  std::string(data.status().message())));
    return kExitFailed;
  }
  for (const std::string& w : data->warnings) s.err() << "spikectl: warning: " << w << "\n";
  const std::string html = report::RenderIncidentReport(*data);
  if (path == "-") {
    s.out() << html;
    s.out().flush();
    return kExitOk;
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    file << html;
    file.close();
    if (!file) {
      s.err() << "spikectl: cannot write '" << tmp << "'\n";
      std::remove(tmp.c_str());
      return kExitFailed;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    s.err() << "spikectl: cannot write '" << path << "'\n";
    std::remove(tmp.c_str());
    return kExitFailed;
  }
  google::protobuf::Struct json;
  (*json.mutable_fields())["path"].set_string_value(path);
  (*json.mutable_fields())["bytes"].set_number_value(static_cast<double>(html.size()));
  s.Emit(json, absl::StrCat("wrote ", path, " (", html.size(), " bytes)\n"));
  return kExitOk;
}

int TokenNew(Session& s, const ParsedArgs& args) {
  const std::string principal = *args.Get("principal");
  SPIKECTL_USAGE_IF_ERROR(s, CheckTokensFileWord("principal", principal));
  const std::string role = absl::AsciiStrToLower(*args.Get("role"));
  if (role != "worker" && role != "viewer" && role != "operator" && role != "admin") {
    return s.UsageError(absl::StrCat("bad value for --role: '", *args.Get("role"),
                                     "' (want worker, viewer, operator or admin)"));
  }
  std::string runs = args.Get("runs").value_or("*");
  if (runs != "*") {
    std::vector<std::string> names;
    for (absl::string_view name : absl::StrSplit(runs, ',')) {
      name = absl::StripAsciiWhitespace(name);
      if (name == "*") return s.UsageError("bad value for --runs: '*' stands alone (every run)");
      SPIKECTL_USAGE_IF_ERROR(s, CheckTokensFileWord("runs", name));
      names.emplace_back(name);
    }
    runs = absl::StrJoin(names, ",");
    // The daemon refuses such a line (daemon/auth/tokens.cc): say so now.
    if (role == "admin") {
      return s.UsageError(
          "--role=admin acts on every run: leave --runs out (or give '*'); a principal scoped "
          "to some runs is an operator");
    }
  }
  const std::string token = NewToken();
  const std::string line = absl::StrJoin({principal, role, runs, HashToken(token)}, " ");
  if (s.options().json) {
    google::protobuf::Struct json;
    auto& fields = *json.mutable_fields();
    fields["token"].set_string_value(token);
    fields["principal"].set_string_value(principal);
    fields["role"].set_string_value(role);
    fields["runs"].set_string_value(runs);
    fields["tokens_file_line"].set_string_value(line);
    s.out() << ToJson(json) << "\n";
  } else {
    // The token alone on stdout (TOKEN=$(spikectl token new ...)); the line
    // for the daemon's tokens file, which holds only the hash, on stderr.
    s.out() << token << "\n";
    s.err() << "tokens-file line (add it to spikeguardd's --tokens file, then SIGHUP the daemon; "
               "the token itself is shown only once):\n"
            << line << "\n";
  }
  s.out().flush();
  return kExitOk;
}

#undef SPIKECTL_USAGE_IF_ERROR
#undef SPIKECTL_ASSIGN_OR_USAGE

// --- the command table ---------------------------------------------------------

const std::vector<CommandDef>& Commands() {
  using F = FlagSpec;
  static const auto* commands = new std::vector<CommandDef>{
      {"", "status", "", "Show the daemon's version, uptime, ingest counters and active precursor warnings.", "", {}, {}, 0, {},
       &Status},
      {"runs", "list", "", "List runs.", "", {}, {}, 0, {}, &RunsList},
      {"runs", "create", "NAME [--world-size=N] [--mode=observe|propose|auto] [--spec=FILE]",
       "Create a run; with --spec the daemon also launches its ranks.",
       "Flags:\n"
       "  --world-size=N     number of ranks (default 1)\n"
       "  --mode=MODE        observe (report only), propose (actions wait for approve),\n"
       "                     auto (diagnose and fix unattended); default: the daemon's policy\n"
       "  --spec=FILE        RunSpec in protobuf text format: a launch profile of the\n"
       "                     daemon's and its params, the manifest, ... (no command)\n",
       {{"world-size"}, {"mode"}, {"spec"}}, {"NAME"}, 1, {}, &RunsCreate},
      {"runs", "show", "NAME", "Show a run, its ranks (last step, last seen) and its generations.",
       "", {}, {"NAME"}, 1, {}, &RunsShow},
      {"runs", "set-profile", "NAME --profile=PROFILE [--param=KEY=VALUE ...]",
       "Map a run to a daemon-side launch profile (admin; how a run created with a free "
       "command line before launch profiles is launched again).",
       "Flags:\n"
       "  --profile=PROFILE  a launch profile of the daemon's (--launch-profiles)\n"
       "  --param=KEY=VALUE  a value for one of the profile's parameters (repeatable)\n",
       {{"profile"}, {"param", F::kRepeated}}, {"NAME"}, 1, {"profile"}, &RunsSetProfile},
      {"checkpoints", "list", "--run=NAME", "List a run's checkpoints.",
       "Flags:\n  --run=NAME         the run (required)\n", {{"run"}}, {}, 0, {"run"},
       &CheckpointsList},
      {"", "telemetry",
       "--run=NAME [--gen=G] [--from=S] [--to=S] [--metrics=loss,grad_norm,...] [--limit=N]",
       "Show a run's per-step telemetry.",
       "Flags:\n"
       "  --run=NAME         the run (required)\n"
       "  --gen=G            generation (default: the run's current one)\n"
       "  --from=S, --to=S   step range, inclusive\n"
       "  --metrics=LIST     comma-separated columns (default loss,grad_norm,lr,clipped,\n"
       "                     lse_max,nonfinite,max_attn_logit,step_time_s); also data_position,\n"
       "                     tokens, lse_mean, loss_scale, loss_hash, update_ratio, act_rms,\n"
       "                     param_norm (max over layers) and layerN.max_attn_logit,\n"
       "                     layerN.grad_norm, layerN.update_ratio, layerN.act_rms,\n"
       "                     layerN.param_norm; --output=json without --metrics prints\n"
       "                     whole records\n"
       "  --limit=N          at most N records\n",
       {{"run"}, {"gen"}, {"from"}, {"to"}, {"metrics", F::kRepeated}, {"limit"}}, {}, 0, {"run"},
       &Telemetry},
      {"incidents", "list", "[--run=R] [--state=S] [--verdict=V]", "List incidents.",
       "Flags:\n"
       "  --run=R            only this run\n"
       "  --state=S          detected, replaying, skipping, bisecting, transplanting, fixing,\n"
       "                     verifying, awaiting_approval, closed, aborted\n"
       "  --verdict=V        transient, data, fragility, numerics, inconclusive\n",
       {{"run"}, {"state"}, {"verdict"}}, {}, 0, {}, &IncidentsList},
      {"warnings", "list", "[--run=R] [--state=active|cleared|preceded]",
       "List precursor warnings (a critical precursor that persisted; not incidents).",
       "Each warning: its run, signal and layer, its state (active; cleared once the signal\n"
       "stays under the warn level; preceded: an incident opened while it was active), the\n"
       "step its precursor began (onset), its peak, and its lead in steps (to the last step\n"
       "seen, or to the incident it preceded).\n"
       "Flags:\n  --run=R            only this run\n"
       "  --state=S          active, cleared or preceded\n",
       {{"run"}, {"state"}}, {}, 0, {}, &WarningsList},
      {"incidents", "show", "ID",
       "Show an incident: evidence (probes), documents, fix, recommendations, cost.", "", {},
       {"ID"}, 1, {}, &IncidentsShow},
      {"incidents", "watch", "[--run=R]", "Print incident updates as they happen (until Ctrl-C).",
       "Flags:\n  --run=R            only this run\n", {{"run"}}, {}, 0, {}, &IncidentsWatch},
      {"", "report", "ID [--out=FILE.html]",
       "Write an incident's report: one self-contained HTML page with plots.",
       "The page has the verdict, confidence and evidence, plots of loss, grad norm, clip\n"
       "rate, lse and per-layer max attention logits, update ratios and activation RMS from\n"
       "the rewind checkpoint to past the horizon (the original generation and every probe's\n"
       "overlaid; onset, peak, skip hole and culprit batch marked), the localization, the\n"
       "culprit documents, the fix and its verification, and the cost. No scripts and no\n"
       "network fetches: open it in any browser, or attach it to a ticket.\n"
       "\nFlags:\n"
       "  --out=FILE         where to write it (default incident-ID.html; - for stdout)\n",
       {{"out"}}, {"ID"}, 1, {}, &Report},
      {"", "rewind", "--run=R --to-step=N [--skip=A:B ...] [--stop-after=S]",
       "Rewind a run to the checkpoint at step N, optionally skipping batches.",
       "Flags:\n"
       "  --run=R            the run (required)\n"
       "  --to-step=N        checkpoint step to restart from (required)\n"
       "  --skip=A:B         skip the batches of steps A..B (repeatable)\n"
       "  --stop-after=S     stop after step S and wait (probe horizon)\n",
       {{"run"}, {"to-step"}, {"skip", F::kRepeated}, {"stop-after"}}, {}, 0, {"run", "to-step"},
       &Rewind},
      {"", "replay", "--run=R --from-step=N [--stop-after=S]",
       "Replay a run's batches from the checkpoint at step N.",
       "Flags:\n"
       "  --run=R            the run (required)\n"
       "  --from-step=N      checkpoint step to replay from (required)\n"
       "  --stop-after=S     stop after step S and wait\n",
       {{"run"}, {"from-step"}, {"stop-after"}}, {}, 0, {"run", "from-step"}, &Replay},
      {"", "skip", "--run=R --from=A --to=B", "Skip the batches of steps A..B from now on.",
       "Flags:\n  --run=R            the run (required)\n"
       "  --from=A, --to=B   the step window (required)\n",
       {{"run"}, {"from"}, {"to"}}, {}, 0, {"run", "from", "to"}, &Skip},
      {"", "pause", "--run=R", "Pause a run's ranks.", "Flags:\n  --run=R            the run (required)\n",
       {{"run"}}, {}, 0, {"run"}, &Pause},
      {"", "resume", "--run=R", "Resume a paused run.", "Flags:\n  --run=R            the run (required)\n",
       {{"run"}}, {}, 0, {"run"}, &Resume},
      {"", "approve", "ID", "Approve the pending step of an incident (propose mode).", "", {},
       {"ID"}, 1, {}, &Approve},
      {"", "abort", "ID [--reason=TEXT]", "Abort an incident's diagnosis.",
       "Flags:\n  --reason=TEXT      recorded with the incident\n", {{"reason"}}, {"ID"}, 1, {},
       &Abort},
      {"policy", "get", "[--run=R]", "Print the policy (text format; the default one without --run).",
       "Flags:\n  --run=R            this run's policy\n", {{"run"}}, {}, 0, {}, &PolicyGet},
      {"policy", "set", "[--run=R] --file=FILE", "Replace the policy with FILE (text format).",
       "Flags:\n  --run=R            this run's policy (default: the daemon's)\n"
       "  --file=FILE        Policy in protobuf text format (required)\n",
       {{"run"}, {"file"}}, {}, 0, {"file"}, &PolicySet},
      {"", "manifest", "--run=R --from=S --to=S [--gen=G]",
       "Resolve steps to data positions and document ids.",
       "Flags:\n  --run=R            the run (required)\n"
       "  --from=S, --to=S   step range, inclusive (required)\n"
       "  --gen=G            generation (default: the current one)\n",
       {{"run"}, {"from"}, {"to"}, {"gen"}}, {}, 0, {"run", "from", "to"}, &Manifest},
      {"", "audit", "[--run=R] [--principal=P] [--since=UNIX_MS] [--limit=N]",
       "List the audit log: every mutating call, who made it and how it ended (admin).",
       "Flags:\n"
       "  --run=R            only calls naming this run\n"
       "  --principal=P      only calls by this principal\n"
       "  --since=UNIX_MS    only calls at or after this time (unix milliseconds)\n"
       "  --limit=N          at most N entries (newest first)\n",
       {{"run"}, {"principal"}, {"since"}, {"limit"}}, {}, 0, {}, &Audit},
      {"token", "new", "--principal=NAME --role=ROLE [--runs=a,b|*]",
       "Make a bearer token; prints it, and the daemon's tokens-file line (its hash).",
       "Flags:\n"
       "  --principal=NAME   who uses the token (audit entries name it; required)\n"
       "  --role=ROLE        worker, viewer, operator or admin (required)\n"
       "  --runs=LIST        comma-separated run names, or * for every run (default *)\n"
       "\n"
       "stdout has the token alone; stderr the line NAME ROLE RUNS sha256:HEX for the\n"
       "daemon's --tokens file. With --output=json both are fields of one object. Nothing\n"
       "is sent to the daemon and the token is kept nowhere: hand it to its user now.\n",
       {{"principal"}, {"role"}, {"runs"}}, {}, 0, {"principal", "role"}, &TokenNew, true},
      {"quarantine", "list", "--run=R", "List a run's quarantined documents.",
       "Flags:\n  --run=R            the run (required)\n", {{"run"}}, {}, 0, {"run"},
       &QuarantineList},
  };
  return *commands;
}

const CommandDef* FindCommand(absl::string_view group, absl::string_view name) {
  for (const CommandDef& c : Commands()) {
    if (c.group == group && c.name == name) return &c;
  }
  return nullptr;
}

int OverviewError(std::ostream& err, absl::string_view reason) {
  err << "spikectl: " << reason << "\n" << OverviewUsage();
  return kExitUsage;
}

}  // namespace

std::string DefaultAddress() {
  const char* env = std::getenv("SPIKEGUARD_ADDR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(kDefaultAddr);
}

int RunSpikectl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  GlobalOptions options;
  options.addr = DefaultAddress();

  // Global flags before the command.
  size_t i = 0;
  std::vector<std::string> leading;
  for (; i < args.size() && absl::StartsWith(args[i], "-"); ++i) {
    if (args[i] == "-h" || args[i] == "--help") {
      out << OverviewUsage();
      return kExitOk;
    }
    leading.push_back(args[i]);
    // "--addr host:port": the value is the next word.
    const bool takes_value = GlobalFlagTakesValue(args[i]);
    if (takes_value && i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
      leading.push_back(args[++i]);
    }
  }
  absl::StatusOr<ParsedArgs> globals = ParseArgs(leading, GlobalFlags(), {}, 0);
  if (!globals.ok()) return OverviewError(err, globals.status().message());
  if (absl::Status s = ApplyGlobalFlags(*globals, options); !s.ok()) {
    return OverviewError(err, s.message());
  }

  if (i == args.size()) return OverviewError(err, "missing command");
  const std::string& first = args[i++];
  const CommandDef* command = nullptr;
  if (IsGroup(first)) {
    if (i == args.size()) {
      err << "spikectl: missing " << first << " command\n" << GroupUsage(first);
      return kExitUsage;
    }
    const std::string& second = args[i];
    if (second == "-h" || second == "--help") {
      out << GroupUsage(first);
      return kExitOk;
    }
    command = FindCommand(first, second);
    if (command == nullptr) {
      err << "spikectl: unknown command '" << first << " " << second << "'\n" << GroupUsage(first);
      return kExitUsage;
    }
    ++i;
  } else {
    command = FindCommand("", first);
    if (command == nullptr) return OverviewError(err, absl::StrCat("unknown command '", first, "'"));
  }

  std::vector<FlagSpec> flags = command->flags;
  flags.insert(flags.end(), GlobalFlags().begin(), GlobalFlags().end());
  const std::vector<std::string> rest(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs(rest, flags, command->positional, command->min_positional);
  if (!parsed.ok()) {
    err << "spikectl: " << parsed.status().message() << "\n" << command->Usage();
    return kExitUsage;
  }
  if (parsed->help) {
    out << command->Usage();
    return kExitOk;
  }
  for (const std::string& flag : command->required_flags) {
    if (!parsed->Has(flag)) {
      err << "spikectl: missing required flag --" << flag << "\n" << command->Usage();
      return kExitUsage;
    }
  }
  if (absl::Status s = ApplyGlobalFlags(*parsed, options); !s.ok()) {
    err << "spikectl: " << s.message() << "\n" << command->Usage();
    return kExitUsage;
  }
  ResolvedSecurity security;
  if (!command->offline) {
    // A token or PEM file that cannot be read is the caller's to fix: usage.
    absl::StatusOr<ResolvedSecurity> resolved = options.security.Resolve();
    if (!resolved.ok()) {
      err << "spikectl: " << resolved.status().message() << "\n";
      return kExitUsage;
    }
    security = *std::move(resolved);
  }
  Session session(*command, std::move(options), std::move(security), out, err);
  return command->handler(session, *parsed);
}

int RunSpikectl(int argc, char** argv, std::ostream& out, std::ostream& err) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return RunSpikectl(args, out, err);
}

}  // namespace spikeguard::cli
