// http_connections.h
// -----------------------------------------------------------------------------
// The web view's connection layer: an accept loop of its own in front of
// cpp-httplib's request parser and router. cpp-httplib 0.11's own loop hands
// each connection to one of 8 pool threads for as long as the client sends a
// byte within the read timeout, so a few clients sending one header line every
// few seconds held every thread (/healthz timed out) and were never closed.
// Here:
//   - at most max_connections are open at once; one more is answered
//     "503 too many connections" at once (TLS: closed) instead of waiting;
//   - every open connection has a thread of its own (bounded by the cap), so
//     a slow one never delays another;
//   - a TLS handshake, and each request's head and body, must arrive within
//     request_deadline (counted from the accept for the first request, from
//     its first byte for the next ones): a client trickling bytes is closed
//     when it passes, whatever its pace;
//   - a keep-alive connection waits idle_timeout for its next request, and
//     serves at most max_requests; each write must progress within
//     write_timeout.
//
//   auto server = std::make_unique<StreamServer<httplib::Server>>();
//   server->Get("/healthz", ...);
//   server->bind_to_any_port("127.0.0.1");
//   auto loop = ConnectionLoop::Start(server.get(), nullptr, ConnectionLimits());
//   ...
//   (*loop)->Stop();   // closes the listener and every open connection
#pragma once

#include <openssl/ssl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <thread>

#include <httplib.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace spikeguard::daemon {

struct ConnectionLimits {
  int max_connections = 64;
  absl::Duration request_deadline = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(5);
  absl::Duration write_timeout = absl::Seconds(10);
  int max_requests = 100;
};

// The HTTP side of one request on a stream the caller owns.
class RequestServer {
 public:
  virtual ~RequestServer() = default;
  // Reads one request from `stream`, routes it and writes the answer; false
  // when the stream failed or the request could not be read.
  // `close_connection`: answer with "Connection: close". `*closed`: the
  // client asked to close.
  virtual bool ServeRequest(httplib::Stream& stream, bool close_connection, bool* closed) = 0;
  // The socket bound by bind_to_port / bind_to_any_port; the caller takes it.
  virtual int TakeListenSocket() = 0;
};

// cpp-httplib's server (Base: httplib::Server or httplib::SSLServer) with its
// parser and router reachable for a stream the caller owns.
template <typename Base>
class StreamServer final : public Base, public RequestServer {
 public:
  using Base::Base;
  bool ServeRequest(httplib::Stream& stream, bool close_connection, bool* closed) override {
    return this->process_request(stream, close_connection, *closed, nullptr);
  }
  int TakeListenSocket() override { return this->svr_sock_.exchange(INVALID_SOCKET); }
};

// A stream over a connected socket (and an SSL session over it when `ssl` is
// not null) whose reads fail once the read deadline passes.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, SSL* ssl, absl::Duration write_timeout)
      : fd_(fd), ssl_(ssl), write_timeout_(write_timeout) {}

  void set_read_deadline(absl::Time deadline) { read_deadline_ = deadline; }
  // A read failed because the deadline passed.
  bool timed_out() const { return timed_out_; }
  // Waits until a byte can be read (true) or `deadline` passes.
  bool WaitReadable(absl::Time deadline) const;

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

 private:
  const int fd_;
  SSL* const ssl_;
  const absl::Duration write_timeout_;
  absl::Time read_deadline_ = absl::InfiniteFuture();
  bool timed_out_ = false;
};

class ConnectionLoop {
 public:
  // Serves the connections of `server`'s bound socket (taken from it) on a
  // thread of its own. `ssl_ctx`: TLS on every connection (null: clear text).
  static absl::StatusOr<std::unique_ptr<ConnectionLoop>> Start(RequestServer* server,
                                                               SSL_CTX* ssl_ctx,
                                                               ConnectionLimits limits);
  ~ConnectionLoop();

  // Stops accepting, closes every open connection and waits for their threads.
  void Stop();

  int open_connections();
  // Connections refused at the cap, and closed for passing a deadline.
  int64_t refused() const { return refused_.load(); }
  int64_t timed_out() const { return timed_out_.load(); }

 private:
  ConnectionLoop(RequestServer* server, SSL_CTX* ssl_ctx, ConnectionLimits limits)
      : server_(server), ssl_ctx_(ssl_ctx), limits_(limits) {}
  void AcceptLoop();
  void Serve(int fd, absl::Time accepted);

  RequestServer* const server_;
  SSL_CTX* const ssl_ctx_;
  const ConnectionLimits limits_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread acceptor_;
  std::atomic<int64_t> refused_{0}, timed_out_{0};
  // Shared with the connections' threads, which end by leaving it: it lives
  // until the last of them has let go of its mutex.
  struct Open {
    absl::Mutex mu;
    std::set<int> fds ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };
  const std::shared_ptr<Open> open_ = std::make_shared<Open>();
};

}  // namespace spikeguard::daemon
