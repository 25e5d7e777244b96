#include "daemon/http/http_connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace spikeguard::daemon {
namespace {

constexpr char kTooMany[] =
    "HTTP/1.1 503 Service Unavailable\r\n"
    "Content-Type: text/plain\r\n"
    "Content-Length: 21\r\n"
    "Retry-After: 1\r\n"
    "Connection: close\r\n\r\n"
    "too many connections\n";

// Waits for `events` on `fd` until `deadline`; true when they came.
bool WaitFor(int fd, short events, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60'000));
    const int n = poll(&p, 1, ms);
    if (n > 0) return true;  // ready, or an error / hang-up the next call reports
    if (n < 0 && errno != EINTR) return false;
  }
}

std::string AddressOf(const sockaddr_storage& addr, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    *port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    *port = ntohs(a->sin6_port);
  }
  return text;
}

// Runs an SSL call that may want to read or write on a non-blocking socket
// until it succeeds (> 0), fails, or `deadline` passes (then *timed_out).
template <typename Fn>
int SslRetry(SSL* ssl, int fd, absl::Time deadline, bool* timed_out, Fn fn) {
  while (true) {
    const int n = fn();
    if (n > 0) return n;
    const int error = SSL_get_error(ssl, n);
    short events = 0;
    if (error == SSL_ERROR_WANT_READ) {
      events = POLLIN;
    } else if (error == SSL_ERROR_WANT_WRITE) {
      events = POLLOUT;
    } else {
      return -1;
    }
    if (!WaitFor(fd, events, deadline)) {
      if (timed_out != nullptr) *timed_out = true;
      return -1;
    }
  }
}

}  // namespace

bool DeadlineStream::WaitReadable(absl::Time deadline) const {
  if (ssl_ != nullptr && SSL_pending(ssl_) > 0) return true;
  return WaitFor(fd_, POLLIN, deadline);
}

bool DeadlineStream::is_readable() const { return WaitReadable(read_deadline_); }

bool DeadlineStream::is_writable() const {
  return WaitFor(fd_, POLLOUT, absl::Now() + write_timeout_);
}

ssize_t DeadlineStream::read(char* ptr, size_t size) {
  if (size == 0) return 0;
  const int want = static_cast<int>(std::min<size_t>(size, 1 << 20));
  if (ssl_ != nullptr) {
    return SslRetry(ssl_, fd_, read_deadline_, &timed_out_,
                    [&] { return SSL_read(ssl_, ptr, want); });
  }
  while (true) {
    if (!WaitFor(fd_, POLLIN, read_deadline_)) {
      timed_out_ = absl::Now() >= read_deadline_;
      return -1;
    }
    const ssize_t n = recv(fd_, ptr, want, MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
  }
}

ssize_t DeadlineStream::write(const char* ptr, size_t size) {
  if (size == 0) return 0;
  const int want = static_cast<int>(std::min<size_t>(size, 1 << 20));
  const absl::Time deadline = absl::Now() + write_timeout_;
  if (ssl_ != nullptr) {
    return SslRetry(ssl_, fd_, deadline, nullptr, [&] { return SSL_write(ssl_, ptr, want); });
  }
  while (true) {
    if (!WaitFor(fd_, POLLOUT, deadline)) return -1;
    const ssize_t n = send(fd_, ptr, want, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
  }
}

void DeadlineStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  port = -1;
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip = AddressOf(addr, &port);
}

void DeadlineStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  port = -1;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip = AddressOf(addr, &port);
}

absl::StatusOr<std::unique_ptr<ConnectionLoop>> ConnectionLoop::Start(RequestServer* server,
                                                                      SSL_CTX* ssl_ctx,
                                                                      ConnectionLimits limits) {
  std::unique_ptr<ConnectionLoop> loop(new ConnectionLoop(server, ssl_ctx, limits));
  loop->listen_fd_ = server->TakeListenSocket();
  if (loop->listen_fd_ < 0) return absl::FailedPreconditionError("web view: no bound socket");
  // A longer backlog than cpp-httplib's 5: connections are accepted (and
  // refused past the cap) at once, not left queued.
  (void)listen(loop->listen_fd_, 128);
  if (pipe2(loop->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("web view: pipe: ", std::strerror(errno)));
  }
  ConnectionLoop* self = loop.get();
  loop->acceptor_ = std::thread([self] { self->AcceptLoop(); });
  return loop;
}

ConnectionLoop::~ConnectionLoop() {
  Stop();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void ConnectionLoop::AcceptLoop() {
  absl::Time last_warning = absl::InfinitePast();
  while (true) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    const int n = poll(p, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      SG_LOG(ERROR) << "web view: poll: " << std::strerror(errno);
      return;
    }
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    const absl::Time accepted = absl::Now();
    bool admitted = false;
    {
      absl::MutexLock lock(&open_->mu);
      if (open_->stopping) {
        close(fd);
        return;
      }
      if (static_cast<int>(open_->fds.size()) < limits_.max_connections) {
        open_->fds.insert(fd);
        admitted = true;
      }
    }
    if (!admitted) {
      ++refused_;
      if (ssl_ctx_ == nullptr) (void)send(fd, kTooMany, sizeof(kTooMany) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
      close(fd);
      if (accepted - last_warning > absl::Seconds(10)) {
        last_warning = accepted;
        SG_LOG(WARNING) << "web view: " << limits_.max_connections
                        << " connections open; a new one was refused (" << refused_.load()
                        << " refused so far)";
      }
      continue;
    }
    std::thread([this, fd, accepted, open = open_] {
      Serve(fd, accepted);
      // `this` may be gone from here on.
      absl::MutexLock lock(&open->mu);
      open->fds.erase(fd);
      shutdown(fd, SHUT_RDWR);
      close(fd);
    }).detach();
  }
}

void ConnectionLoop::Serve(int fd, absl::Time accepted) {
  SSL* ssl = nullptr;
  bool timed_out = false;
  bool ok = true;
  if (ssl_ctx_ != nullptr) {
    ssl = SSL_new(ssl_ctx_);
    ok = ssl != nullptr && SSL_set_fd(ssl, fd) == 1 &&
         SslRetry(ssl, fd, accepted + limits_.request_deadline, &timed_out,
                  [&] { return SSL_accept(ssl); }) > 0;
  }
  if (ok) {
    DeadlineStream stream(fd, ssl, limits_.write_timeout);
    absl::Time deadline = accepted + limits_.request_deadline;
    const int max_requests = std::max(1, limits_.max_requests);
    for (int count = max_requests; count > 0; --count) {
      if (count != max_requests) {
        // Between requests: the next one's first byte within idle_timeout,
        // then the whole of it within request_deadline.
        if (!stream.WaitReadable(absl::Now() + limits_.idle_timeout)) break;
        deadline = absl::Now() + limits_.request_deadline;
      }
      stream.set_read_deadline(deadline);
      bool closed = false;
      const bool served = server_->ServeRequest(stream, count == 1, &closed);
      // A request that did not arrive in time ends the connection even when
      // the parser answered it (400): the rest would be read as new requests.
      if (stream.timed_out()) timed_out = true;
      if (!served || closed || timed_out) break;
    }
  }
  if (timed_out) ++timed_out_;
  if (ssl != nullptr) {
    (void)SSL_shutdown(ssl);
    SSL_free(ssl);
  }
}

int ConnectionLoop::open_connections() {
  absl::MutexLock lock(&open_->mu);
  return static_cast<int>(open_->fds.size());
}

void ConnectionLoop::Stop() {
  {
    absl::MutexLock lock(&open_->mu);
    if (open_->stopping) return;
    open_->stopping = true;
  }
  if (wake_[1] >= 0) {
    const ssize_t woke = write(wake_[1], "x", 1);
    (void)woke;
  }
  if (acceptor_.joinable()) acceptor_.join();
  Open* open = open_.get();
  absl::MutexLock lock(&open->mu);
  // Every connection's thread sees its socket fail and ends.
  for (int fd : open->fds) shutdown(fd, SHUT_RDWR);
  open->mu.Await(absl::Condition(
      +[](Open* o) ABSL_NO_THREAD_SAFETY_ANALYSIS { return o->fds.empty(); }, open));
}

}  // namespace spikeguard::daemon
