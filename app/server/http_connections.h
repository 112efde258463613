// The server's connections: how long they may stay idle, how long a request may take to arrive, and how many may be
// open at once. cpp-httplib serves each connection on one worker thread for as long as it is open, so a client that
// holds a connection holds a thread: idle connections close after the keep-alive timeout, a request's head and body
// must arrive within the read timeout from its first byte (a client trickling its headers byte by byte — slowloris —
// is cut off there, however often it sends), a send that makes no progress ends after the write timeout, and past
// --max-connections a new connection gets a 503 at once instead of waiting for a worker behind the others.
#pragma once

#include <cstdint>
#include <memory>

namespace httplib {
class Server;
}

namespace mambacpp::server {

constexpr int64_t kMaxTimeoutSeconds = 86400;

struct ConnectionOptions {
  int64_t max_connections = 0;      // open connections served at once; 0: the HTTP worker threads
  int64_t worker_threads = 296;     // each open connection holds one
  int64_t keep_alive_timeout = 10;  // seconds an idle connection stays open for its next request
  int64_t read_timeout = 10;        // seconds a request's head and body may take to arrive, from its first byte
  int64_t write_timeout = 10;       // seconds a send may make no progress before the connection ends
};

// A cpp-httplib server with those limits (throws Error on options out of range).
std::unique_ptr<httplib::Server> make_http_server(const ConnectionOptions& options);

// In cpp-httplib's error handler: whether the request being answered (400, cpp-httplib's answer to a request it could
// not read) ran out of its read timeout, so that it is answered 408 instead.
bool request_read_timed_out();
// Also there: whether the request's body is still unread (an answer before routing, 413, 400): the connection then
// closes after the answer, which must say so (Connection: close) or a client would send its next request on it.
bool request_body_unread();

// Graceful shutdown, in two steps. stop_accepting closes the listening socket (a client's or a load balancer's
// connect fails at once, so it goes to another replica) while the connections open finish the request they are in,
// answered with `Connection: close`, and idle ones close; cpp-httplib's own stop() would also cut the streams in
// flight. close_connections then ends whatever is still open at its next read or write. Both do nothing to a server
// that is not listening; `server` must come from make_http_server.
void stop_accepting(httplib::Server& server);
void close_connections(httplib::Server& server);
// Connections being served (not counting those refused past --max-connections).
int64_t open_connections(const httplib::Server& server);

}  // namespace mambacpp::server
