// The HTTP server of `mambacpp serve`: OpenAI-compatible routes over one Engine. The engine steps on a thread of
// its own; each HTTP request runs on a worker of cpp-httplib's pool, submits its prompts and waits for their events
// (request_channel.h). Until attach() the routes answer 503 (the model is loading).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "mambacpp/engine.h"
#include "mambacpp/model.h"
#include "mambacpp/tokenizer.h"
#include "server/chat_template.h"
#include "server/completion_request.h"

namespace httplib {
class DataSink;
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace mambacpp::server {

class CompletionResponse;
class RequestChannel;

// Bounds of the options that size what the server creates up front (docs/reliability.md): state slots (the memory
// they take is checked too, by `serve`) and HTTP worker threads (threads past what the process may create end it).
constexpr int64_t kMaxParallel = 65536;
constexpr int64_t kMaxQueue = 65536;
constexpr int64_t kMaxHttpThreads = 4096;
constexpr int64_t kMaxBodyMb = 4096;  // --max-body-mb: a body is held whole, with a JSON document of up to 8 times it

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (bound_port() tells which)
  int64_t parallel = 32;         // requests generating at once (engine state slots)
  int64_t max_queue = 256;       // requests waiting for a slot; beyond: 503
  std::string api_key;           // empty: no authentication
  int64_t max_prompt = 65536;    // tokens per prompt
  int64_t max_tokens = 1 << 20;  // largest max_tokens a request may ask for
  int64_t max_body_mb = 16;      // request bodies over this: 413
  int64_t http_threads = 0;      // 0: parallel + max_queue + 8 (each waiting or streaming request holds one);
                                 // either way at most kMaxHttpThreads
  // Connections (server/http_connections.h): open at once (0: the HTTP worker threads; past it 503), seconds idle
  // before the next request, for a request to arrive, for a stalled send.
  int64_t max_connections = 0;
  int64_t keep_alive_timeout = 10;
  int64_t read_timeout = 10;
  int64_t write_timeout = 10;
  // This replica's name, sent on every answer as X-Mambacpp-Replica (a load balancer's affinity shows in it); empty:
  // the host name and the port.
  std::string replica_id;
  SpeculativeParams speculative;  // requests' defaults (serve --draft-*); draft_model needs EngineOptions::draft_model
};

class Server {
 public:
  explicit Server(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket (throws Error when it cannot) and serves on a background thread.
  void start();
  int bound_port() const { return port_; }

  // The model is loaded: creates the engine, starts stepping it and opens the routes. `name` is /v1/models' id.
  void attach(std::unique_ptr<Model> model, std::unique_ptr<Tokenizer> tokenizer,
              std::unique_ptr<ChatTemplate> chat_template, const EngineOptions& engine_options, std::string name);

  // Stops accepting requests, cancels those in flight (their streams end), and stops serving and stepping.
  void stop() { shutdown(std::chrono::milliseconds(0)); }

  // A graceful stop (serve's SIGTERM): /health and new requests answer 503 and the listening socket closes, so that a
  // load balancer sends the next requests elsewhere; the requests in flight run to their end for up to `grace`, after
  // which (or once `*hurry` is set: a second SIGTERM) those left are cancelled as stop() does. When it returns the
  // engine has stopped, so every snapshot it cached is in the prefix cache's disk tier (written through on the
  // stepping thread). Returns the requests cancelled.
  int64_t shutdown(std::chrono::milliseconds grace, const std::atomic<bool>* hurry = nullptr);
  // Requests (HTTP requests, not prompts) being answered.
  int64_t active_requests() const;
  const std::string& replica_id() const { return replica_id_; }

 private:
  void add_routes();
  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void handle_models(httplib::Response& res) const;
  void handle_metrics(httplib::Response& res) const;
  void step_loop();
  void require_ready() const;
  // Submits one engine request per prompt, all delivering to `channel`; on any failure cancels those submitted.
  void submit_all(const CompletionRequest& request, const std::shared_ptr<RequestChannel>& channel);
  void finish(const std::shared_ptr<RequestChannel>& channel);
  void cancel_if_stopping(RequestChannel& channel);
  // Waits until no request is being answered and no connection is open, or `deadline` (or hurry()); whether idle.
  bool wait_until_idle(std::chrono::steady_clock::time_point deadline, const std::atomic<bool>* hurry);
  bool stream_some(RequestChannel& channel, CompletionResponse& response, bool& finished,
                   httplib::DataSink& sink);  // counts its results and forgets it

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int port_ = 0;

  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<Engine> engine_;
  std::string model_name_;
  RequestLimits limits_;
  int64_t created_ = 0;  // unix time the model was attached (/v1/models)
  // stopping_: refuse new requests; cancelling_: cancel those in flight (stop(), or a shutdown's grace is over).
  std::atomic<bool> ready_{false}, stopping_{false}, cancelling_{false}, stopped_{false}, quit_{false};
  std::string replica_id_;
  std::thread step_thread_;

  mutable std::mutex active_mutex_;
  std::unordered_map<RequestChannel*, std::shared_ptr<RequestChannel>> active_;  // requests in flight
  std::atomic<uint64_t> next_response_id_{1};
  std::atomic<int64_t> in_flight_{0};  // prompts submitted and not finished: at most parallel + max_queue

  // /metrics counters.
  std::atomic<int64_t> requests_total_{0}, requests_cancelled_{0}, requests_rejected_{0};
  std::atomic<int64_t> prompt_tokens_total_{0}, generated_tokens_total_{0};
  std::atomic<int64_t> steps_total_{0}, step_ns_total_{0};
};

}  // namespace mambacpp::server
