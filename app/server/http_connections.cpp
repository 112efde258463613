#include "server/http_connections.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "mambacpp/error.h"
#include "server/api_error.h"

namespace mambacpp::server {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// What the worker that runs a connection does with it: serve it, answer 503, or (refusals piling up) just close it.
enum class Admission { Serve, Refuse, Drop };
thread_local Admission t_admission = Admission::Serve;
// Set by a read that ran out of the request's time, for the error handler of that request (408).
thread_local bool t_read_timed_out = false;

class ConnectionStream;
// The request this worker is serving: where its body starts on the connection and how long it is (-1: unknown, a
// chunked body or a head that did not parse), so that an answer given before the body was read can say it closes.
struct CurrentRequest {
  const ConnectionStream* stream = nullptr;
  uint64_t body_start = 0;
  int64_t body_length = -1;
};
thread_local CurrentRequest t_request;

// Refusals waiting for their thread beyond this are closed without an answer: a flood must not grow a queue.
constexpr int64_t kMaxPendingRefusals = 1024;
constexpr size_t kRefusalThreads = 2;
// A refusal reads the request head (closing a socket with unread data resets it, and the client may then lose the
// answer) for at most this long, and as long again for the client to close after the answer.
constexpr auto kRefusalLinger = milliseconds(250);
// An idle connection checks this often whether the server is stopping.
constexpr auto kStopCheck = milliseconds(50);

int poll_one(int fd, short events, milliseconds timeout) {
  struct pollfd p {fd, events, 0};
  const int ms = static_cast<int>(std::max<int64_t>(0, timeout.count()));
  int r;
  do r = ::poll(&p, 1, ms);
  while (r < 0 && errno == EINTR);
  return r;
}

milliseconds until(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(t - Clock::now());
}

std::string address_of(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  return buf;
}

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return 0;
}

// One connection's socket, read through a buffer (cpp-httplib reads a request's lines one byte at a time) that
// outlives each request, so that pipelined requests are not lost; every read of a request waits no later than the
// request's deadline.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int sock, milliseconds write_timeout, std::function<bool()> stopping,
                   std::function<bool()> draining)
      : sock_(sock), write_timeout_(write_timeout), stopping_(std::move(stopping)), draining_(std::move(draining)) {}

  uint64_t consumed() const { return consumed_; }

  void set_read_deadline(Clock::time_point t) {
    read_deadline_ = t;
    t_read_timed_out = false;
  }

  // Waits for the first byte of the next request; false after `idle` without one or once the server stops.
  // A draining server waits for no next request; one that has arrived already is answered (503: a load balancer
  // resends it elsewhere) rather than dropped with the connection.
  bool wait_for_request(milliseconds idle) const {
    if (pos_ < len_) return true;
    if (!draining_() && wait_until(Clock::now() + idle, draining_)) return true;
    return draining_() && !stopping_() && poll_one(sock_, POLLIN, milliseconds(0)) > 0 && peer_open_with_data();
  }

  bool is_readable() const override { return pos_ < len_ || wait_readable(); }

  bool is_writable() const override { return wait_writable() && peer_open(); }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == len_) {
      if (!wait_readable()) return -1;
      ssize_t n;
      do n = ::recv(sock_, buf_, sizeof buf_, 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, len_ - pos_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    consumed_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!wait_writable()) return -1;
    // Never blocking: a client that stops reading is given write_timeout per attempt, not forever.
    ssize_t n;
    do n = ::send(sock_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    ip = address_of(a);
    port = port_of(a);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    ip = address_of(a);
    port = port_of(a);
  }
  socket_t socket() const override { return sock_; }

 private:
  // Readable before `deadline`, checking in slices whether the server is stopping (which must not wait for a slow
  // client's read timeout).
  bool wait_until(Clock::time_point deadline, const std::function<bool()>& also_stop = nullptr) const {
    while (!stopping_() && !(also_stop && also_stop())) {
      const milliseconds left = until(deadline);
      if (left.count() <= 0) return false;
      if (poll_one(sock_, POLLIN, std::min(left, kStopCheck)) > 0) return true;
    }
    return false;
  }
  // Writable within the write timeout, checking in slices whether the server is closing its connections (a
  // shutdown's end must not wait for a client that stopped reading).
  bool wait_writable() const {
    const auto deadline = Clock::now() + write_timeout_;
    while (!stopping_()) {
      const milliseconds left = until(deadline);
      if (left.count() <= 0) return false;
      if (poll_one(sock_, POLLOUT, std::min(left, kStopCheck)) > 0) return true;
    }
    return false;
  }
  bool wait_readable() const {
    if (wait_until(read_deadline_)) return true;
    if (Clock::now() >= read_deadline_) t_read_timed_out = true;
    return false;
  }

  // Readable with bytes to read, not just the peer's close.
  bool peer_open_with_data() const {
    char c;
    return ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }

  // A streamed response notices a client that went away here (cpp-httplib's DataSink::is_writable).
  bool peer_open() const {
    if (poll_one(sock_, POLLIN, milliseconds(0)) <= 0) return true;
    char c;
    const ssize_t n = ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
  }

  int sock_;
  milliseconds write_timeout_;
  std::function<bool()> stopping_, draining_;
  Clock::time_point read_deadline_ = Clock::now();
  char buf_[4096];
  size_t pos_ = 0, len_ = 0;
  uint64_t consumed_ = 0;  // bytes handed to cpp-httplib
};

// Worker threads for the admitted connections, and two for refusals.
class ConnectionQueue final : public httplib::TaskQueue {
 public:
  ConnectionQueue(size_t threads, int64_t max_open, std::atomic<int64_t>& open)
      : served_(threads), refusals_(kRefusalThreads), max_open_(max_open), open_(open) {}

  // Runs on the accepting thread, once per accepted connection: `fn` serves the socket (process_and_close_socket).
  void enqueue(std::function<void()> fn) override {
    if (open_.load() < max_open_) {
      open_ += 1;  // released by the worker when the connection closes
      served_.enqueue([fn = std::move(fn)] {
        t_admission = Admission::Serve;
        fn();
      });
    } else if (pending_refusals_.load() < kMaxPendingRefusals) {
      pending_refusals_ += 1;
      refusals_.enqueue([this, fn = std::move(fn)] {
        t_admission = Admission::Refuse;
        fn();
        pending_refusals_ -= 1;
      });
    } else {
      t_admission = Admission::Drop;
      fn();
      t_admission = Admission::Serve;
    }
  }

  void shutdown() override {
    served_.shutdown();
    refusals_.shutdown();
  }

 private:
  httplib::ThreadPool served_, refusals_;
  int64_t max_open_;
  std::atomic<int64_t>& open_;
  std::atomic<int64_t> pending_refusals_{0};
};

}  // namespace

bool request_body_unread();

namespace {

class LimitedServer final : public httplib::Server {
 public:
  explicit LimitedServer(const ConnectionOptions& o) : o_(o) {
    const auto threads = static_cast<size_t>(o.worker_threads);
    new_task_queue = [this, threads] {
      // Called once the socket listens, before the first accept: cpp-httplib listens with a backlog of 5, which
      // resets connections of a burst (48 at once: 4 reset) before the accepting thread reaches them.
      ::listen(svr_sock_, SOMAXCONN);
      return new ConnectionQueue(threads, o_.max_connections, open_);
    };
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    bool ok = true;
    if (t_admission == Admission::Refuse) refuse(sock);
    if (t_admission == Admission::Serve) {
      struct Release {  // the connection's place, given back however the loop ends
        std::atomic<int64_t>& open;
        ~Release() { open -= 1; }
      } release{open_};
      const auto stopping = [this] { return svr_sock_ == INVALID_SOCKET || closing_; };
      const auto draining = [this] { return draining_.load(); };
      ConnectionStream strm(sock, std::chrono::seconds(o_.write_timeout), stopping, draining);
      while (strm.wait_for_request(std::chrono::seconds(o_.keep_alive_timeout))) {
        strm.set_read_deadline(Clock::now() + std::chrono::seconds(o_.read_timeout));
        bool connection_closed = false;
        const bool close_connection = stopping() || draining();
        // A request answered without reading its body (401, 405 before routing; 413) leaves it on the connection,
        // where it must not be parsed as the next request: the connection closes (and the answer says so).
        t_request = CurrentRequest{&strm, 0, -1};
        const auto note_body = [&](httplib::Request& req) {
          t_request.body_start = strm.consumed();
          t_request.body_length =
              req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos
                  ? -1
                  : std::strtoll(req.get_header_value("Content-Length").c_str(), nullptr, 10);
        };
        ok = process_request(strm, close_connection, connection_closed, note_body);
        const bool body_left = request_body_unread();
        t_request = CurrentRequest{};
        // A request that did not arrive in time was answered 408; the rest of it must not be read as the next one.
        if (!ok || connection_closed || close_connection || t_read_timed_out || body_left) break;
      }
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  // 503 to a connection past --max-connections, after reading its request head so that the answer is not lost to
  // a reset; whatever the client still sends is read and dropped until it closes or the linger ends.
  void refuse(int sock) const {
    const auto deadline = Clock::now() + kRefusalLinger;
    std::string head;
    char buf[4096];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < (64u << 10) &&
           poll_one(sock, POLLIN, until(deadline)) > 0) {
      const ssize_t n = ::recv(sock, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      head.append(buf, static_cast<size_t>(n));
    }
    const std::string body =
        ApiError(503,
                 "the server has " + std::to_string(o_.max_connections) +
                     " connections open, its limit (--max-connections); retry shortly",
                 "", "server_error")
            .to_json()
            .dump();
    const std::string response = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                 "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n" + body;
    size_t sent = 0;
    while (sent < response.size() && poll_one(sock, POLLOUT, until(deadline + kRefusalLinger)) > 0) {
      const ssize_t n = ::send(sock, response.data() + sent, response.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::shutdown(sock, SHUT_WR);
    const auto linger = Clock::now() + kRefusalLinger;
    while (poll_one(sock, POLLIN, until(linger)) > 0 && ::recv(sock, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    }
  }

  ConnectionOptions o_;
  std::atomic<int64_t> open_{0};
  std::atomic<bool> draining_{false}, closing_{false};

 public:
  void stop_accepting() {
    if (draining_.exchange(true)) return;  // the socket's number may be another file's once the loop closed it
    // Not cpp-httplib's stop(): that marks the server socket invalid, which its chunked writer takes for "stop
    // streaming". A shut-down listening socket fails the blocked accept(), and the accepting loop closes it and waits
    // for its workers.
    const socket_t s = svr_sock_.load();
    if (s != INVALID_SOCKET) ::shutdown(s, SHUT_RDWR);
  }
  void close_connections() { closing_ = true; }
  int64_t open_connections() const { return open_.load(); }
};

LimitedServer& limited(httplib::Server& server) {
  auto* s = dynamic_cast<LimitedServer*>(&server);
  if (!s) fail("internal: the HTTP server was not made by make_http_server");
  return *s;
}

}  // namespace

void stop_accepting(httplib::Server& server) { limited(server).stop_accepting(); }
void close_connections(httplib::Server& server) { limited(server).close_connections(); }
int64_t open_connections(const httplib::Server& server) {
  return limited(const_cast<httplib::Server&>(server)).open_connections();
}

bool request_read_timed_out() { return t_read_timed_out; }

bool request_body_unread() {
  if (!t_request.stream) return false;
  const uint64_t read = t_request.stream->consumed() - t_request.body_start;
  return t_request.body_length < 0 || read < static_cast<uint64_t>(t_request.body_length);
}

std::unique_ptr<httplib::Server> make_http_server(const ConnectionOptions& options) {
  ConnectionOptions o = options;
  if (o.worker_threads < 1) fail("the HTTP worker threads must be at least 1, found ", o.worker_threads);
  if (o.max_connections == 0) o.max_connections = o.worker_threads;
  if (o.max_connections < 1 || o.max_connections > o.worker_threads)
    fail("--max-connections must be in [1, ", o.worker_threads, "] (the HTTP worker threads: each open connection ",
         "holds one; raise --http-threads for more), found ", o.max_connections);
  const auto check = [](const char* flag, int64_t v) {
    if (v < 1 || v > kMaxTimeoutSeconds) fail(flag, " must be in [1, ", kMaxTimeoutSeconds, "] seconds, found ", v);
  };
  check("--keep-alive-timeout", o.keep_alive_timeout);
  check("--read-timeout", o.read_timeout);
  check("--write-timeout", o.write_timeout);
  auto server = std::make_unique<LimitedServer>(o);
  server->set_tcp_nodelay(true);  // SSE events are small: send each at once
  // What the Keep-Alive header of each answer tells clients (the loop above enforces it).
  server->set_keep_alive_timeout(o.keep_alive_timeout);
  server->set_keep_alive_max_count(1000000);
  return server;
}

}  // namespace mambacpp::server
