// Fuzz target: the web view's request path below the routes. The input is
// the bytes a client sends on one connection; they are read through the
// connection layer's stream interface by cpp-httplib's request parser and
// router (daemon/http/http_connections.h's StreamServer), as the daemon
// serves them, keep-alive included: request after request until the parser
// stops. Routes like the daemon's (a fixed page, a regex capture, a query)
// and the Authorization header as the web view reads it
// (auth::BearerFromHttpAuthorization).
//
// Invariants: every input ends (no request is served past the input's end,
// at most 64 requests per input); what is written back is HTTP/1.1 status
// lines; a header value the web view turns into metadata is a legal gRPC
// metadata value.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "daemon/auth/authorizer.h"
#include "daemon/http/http_connections.h"
#include "grpc/grpc.h"
#include "grpc/slice.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

using spikeguard::daemon::StreamServer;

// The client's bytes in, the answers out.
class MemoryStream final : public httplib::Stream {
 public:
  MemoryStream(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool is_readable() const override { return at_ < size_; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, size_ - at_);
    std::memcpy(ptr, data_ + at_, n);
    at_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (written_.size() < (1 << 20)) written_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 40000;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 8080;
  }
  socket_t socket() const override { return -1; }
  size_t consumed() const { return at_; }
  const std::string& written() const { return written_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
  std::string written_;
};

void Authorize(const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<std::string> bearer =
      spikeguard::auth::BearerFromHttpAuthorization(req.get_header_value("Authorization"));
  if (!bearer.ok() || bearer->empty()) {
    res.status = 401;
    return;
  }
  grpc_slice slice = grpc_slice_from_copied_buffer(bearer->data(), bearer->size());
  FUZZ_CHECK(grpc_header_nonbin_value_is_legal(slice));
  grpc_slice_unref(slice);
  res.set_content("ok", "text/plain");
}

StreamServer<httplib::Server>* Server() {
  static StreamServer<httplib::Server>* server = [] {
    auto* s = new StreamServer<httplib::Server>();
    s->set_payload_max_length(64 << 10);
    s->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    s->Get("/", Authorize);
    s->Get(R"(/runs/(.+))", [](const httplib::Request& req, httplib::Response& res) {
      Authorize(req, res);
      if (res.status != 401) res.set_content(req.matches[1].str(), "text/plain");
    });
    s->Get(R"(/incidents/([^/]+))", Authorize);
    s->Get("/metrics", [](const httplib::Request& req, httplib::Response& res) {
      Authorize(req, res);
      if (res.status != 401) res.set_content(req.get_param_value("run"), "text/plain");
    });
    return s;
  }();
  return server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemoryStream stream(data, size);
  for (int count = 64; count > 0; --count) {
    const size_t before = stream.consumed();
    bool closed = false;
    const bool served = Server()->ServeRequest(stream, count == 1, &closed);
    if (!served || closed || stream.consumed() == before || stream.consumed() >= size) break;
  }
  FUZZ_CHECK(stream.consumed() <= size);
  if (!stream.written().empty()) FUZZ_CHECK(stream.written().rfind("HTTP/1.1 ", 0) == 0);
  return 0;
}
