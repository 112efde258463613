#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>  // mallinfo2, for /metrics
#endif

#include "mambacpp/error.h"
#include "server/api_error.h"
#include "server/completion_response.h"
#include "server/http_connections.h"
#include "server/request_channel.h"

namespace mambacpp::server {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// A stream with nothing to send (its request waits in the queue) writes an SSE comment this often: a write is how a
// vanished client is noticed, and the comment is ignored by SSE readers.
constexpr auto kStreamHeartbeat = std::chrono::milliseconds(1000);
// How long stop() lets cancelled streams send their last events before closing every connection.
constexpr auto kDrainTimeout = std::chrono::milliseconds(2000);

// The routes and their one method each: any other method gets a 405.
const std::vector<std::pair<std::string, std::string>> kRoutes = {
    {"/health", "GET"},    {"/v1/models", "GET"},   {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
    {"/tokenize", "POST"}, {"/detokenize", "POST"}, {"/metrics", "GET"},
};

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status, e.to_json());
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Comparing every byte, so that the time taken does not tell how much of a guessed key was right.
bool same_key(const std::string& given, const std::string& key) {
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(key[i < key.size() ? i : 0]);
  return diff == 0;
}

// Runs a handler, answering any error it throws in OpenAI's shape; nothing a request does escapes as a crash.
template <class F>
void guarded(httplib::Response& res, F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const Error& e) {  // the library refused the request (its checks go beyond the server's)
    send_error(res, ApiError(400, e.what()));
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, std::string("internal error: ") + e.what(), "", "server_error"));
  }
}

}  // namespace

namespace {
ConnectionOptions connection_options(const ServerOptions& o) {
  ConnectionOptions c;
  c.worker_threads = o.http_threads > 0 ? o.http_threads : o.parallel + o.max_queue + 8;
  c.max_connections = o.max_connections;
  c.keep_alive_timeout = o.keep_alive_timeout;
  c.read_timeout = o.read_timeout;
  c.write_timeout = o.write_timeout;
  return c;
}
}  // namespace

Server::Server(const ServerOptions& options) : options_(options) {
  if (options_.parallel < 1 || options_.parallel > kMaxParallel)
    fail("--parallel must be in [1, ", kMaxParallel, "], found ", options_.parallel);
  if (options_.max_queue < 0 || options_.max_queue > kMaxQueue)
    fail("--max-queue must be in [0, ", kMaxQueue, "], found ", options_.max_queue);
  if (options_.max_body_mb < 1 || options_.max_body_mb > kMaxBodyMb)
    fail("--max-body-mb must be in [1, ", kMaxBodyMb, "], found ", options_.max_body_mb);
  if (options_.max_tokens < 0 || options_.max_tokens > INT32_MAX)
    fail("--max-tokens must be in [0, 2^31), found ", options_.max_tokens);
  if (options_.http_threads < 0 || options_.http_threads > kMaxHttpThreads)
    fail("--http-threads must be in [0, ", kMaxHttpThreads, "], found ", options_.http_threads);
  if (options_.http_threads == 0 && options_.parallel + options_.max_queue + 8 > kMaxHttpThreads)
    fail("--parallel ", options_.parallel, " + --max-queue ", options_.max_queue, " + 8 = ",
         options_.parallel + options_.max_queue + 8, " HTTP worker threads, more than the limit of ", kMaxHttpThreads,
         "; lower --max-queue or give --http-threads (at most ", kMaxHttpThreads, ")");
  if (options_.replica_id.size() > 255)
    fail("--replica-id must be at most 255 characters, found ", options_.replica_id.size());
  for (char c : options_.replica_id)
    if (c < 0x21 || c > 0x7e)  // it goes into a header as is
      fail("--replica-id may hold printable ASCII characters without spaces only, found '", options_.replica_id, "'");
  http_ = make_http_server(connection_options(options_));
  add_routes();
}

Server::~Server() { stop(); }

void Server::add_routes() {
  httplib::Server& h = *http_;
  h.set_payload_max_length(static_cast<size_t>(options_.max_body_mb) << 20);

  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    for (const auto& [path, method] : kRoutes) {
      if (req.path != path || req.method == method) continue;
      res.set_header("Allow", method);
      send_error(res, ApiError(405, "method " + req.method + " is not allowed on " + path + "; use " + method));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!options_.api_key.empty() && req.path != "/health") {
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const bool ok = auth.rfind(prefix, 0) == 0 && same_key(auth.substr(prefix.size()), options_.api_key);
      if (!ok) {
        send_error(res, ApiError(401,
                                 auth.empty() ? "missing API key: send the header 'Authorization: Bearer KEY'"
                                              : "invalid API key",
                                 "", "authentication_error", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // cpp-httplib's own refusals (no route: 404, body over the limit: 413, unparsable request: 400) get a body too.
  h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (request_body_unread()) res.set_header("Connection", "close");
    if (!res.body.empty() || res.is_chunked_content_provider_) return;
    if (res.status == 400 && request_read_timed_out()) res.status = 408;
    std::string message = "HTTP " + std::to_string(res.status);
    if (res.status == 408) message = "the request did not arrive within the server's --read-timeout";
    if (res.status == 404) message = "no route " + req.method + " " + req.path;
    if (res.status == 413) message = "the request body is too large (the server's --max-body-mb)";
    send_json(res, res.status, ApiError(res.status, message).to_json());
  });

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready_ && !stopping_) return send_json(res, 200, {{"status", "ok"}});
    res.set_header("Retry-After", "1");
    send_json(res, 503, {{"status", stopping_ ? "shutting down" : "loading model"}});
  });
  h.Get("/v1/models",
        [this](const httplib::Request&, httplib::Response& res) { guarded(res, [&] { handle_models(res); }); });
  h.Get("/metrics",
        [this](const httplib::Request&, httplib::Response& res) { guarded(res, [&] { handle_metrics(res); }); });
  h.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_completion(req, res, false); });
  });
  h.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_completion(req, res, true); });
  });
  // llama-server's shape: an OpenAI chat body in, {"prompt": the rendered template} out.
  h.Post("/apply-template", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      require_ready();
      send_json(res, 200, {{"prompt", render_chat_prompt(parse_ordered_json_body(req.body), chat_template_.get())}});
    });
  });
  h.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_tokenize(req, res); });
  });
  h.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_detokenize(req, res); });
  });
}

void Server::start() {
  port_ = options_.port == 0 ? http_->bind_to_any_port(options_.host) : options_.port;
  if (port_ < 0 || (options_.port != 0 && !http_->bind_to_port(options_.host, options_.port)))
    fail("serve: cannot listen on ", options_.host, ":", options_.port,
         " (the port is taken or the address is not "
         "this machine's)");
  if (options_.replica_id.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || host[0] == 0) std::snprintf(host, sizeof host, "localhost");
    replica_id_ = std::string(host) + ":" + std::to_string(port_);
  } else {
    replica_id_ = options_.replica_id;
  }
  http_->set_default_headers({{"X-Mambacpp-Replica", replica_id_}});
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  // httplib's stop() does nothing until the listening loop runs: a stop() before it (a model that fails to load right
  // after start()) left the loop blocked in accept() and the process hung in ~Server, 7 times in 20 on this machine.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!http_->is_running() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void Server::attach(std::unique_ptr<Model> model, std::unique_ptr<Tokenizer> tokenizer,
                    std::unique_ptr<ChatTemplate> chat_template, const EngineOptions& engine_options,
                    std::string name) {
  model_ = std::move(model);
  tokenizer_ = std::move(tokenizer);
  chat_template_ = std::move(chat_template);
  model_name_ = std::move(name);
  engine_ = std::make_unique<Engine>(*model_, tokenizer_.get(), engine_options);
  limits_.vocab_size = model_->config().vocab_size;
  // A bos past the embedding rows (a config may name one) cannot be a prompt: an empty prompt is then refused.
  limits_.bos_token_id = model_->config().bos_token_id < limits_.vocab_size ? model_->config().bos_token_id : -1;
  limits_.max_prompt = engine_options.max_prompt;
  limits_.max_new_tokens = engine_options.max_new_tokens;
  limits_.max_prompts = std::max<int64_t>(1, std::min<int64_t>(64, options_.parallel + options_.max_queue));
  limits_.speculative = options_.speculative;
  limits_.draft_model_loaded = engine_options.draft_model != nullptr;
  limits_.draft_mtp_loaded = engine_options.draft_mtp;
  created_ = unix_now();
  step_thread_ = std::thread([this] { step_loop(); });
  ready_ = true;
}

void Server::step_loop() {
  while (!quit_) {
    try {
      const auto t0 = Clock::now();
      if (engine_->step()) {
        steps_total_ += 1;
        step_ns_total_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      } else {
        engine_->wait_for_work(50);
      }
    } catch (const std::exception& e) {  // an engine failure must not take the server down; it is logged
      std::fprintf(stderr, "serve: engine step failed: %s\n", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

int64_t Server::active_requests() const {
  std::lock_guard<std::mutex> lock(active_mutex_);
  return static_cast<int64_t>(active_.size());
}

bool Server::wait_until_idle(Clock::time_point deadline, const std::atomic<bool>* hurry) {
  const bool listening = http_thread_.joinable();
  while (true) {
    // A non-streamed answer is written after its handler returns: the open connections tell when it is out.
    if (active_requests() == 0 && (!listening || open_connections(*http_) == 0)) return true;
    if (Clock::now() >= deadline || (hurry && *hurry)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int64_t Server::shutdown(std::chrono::milliseconds grace, const std::atomic<bool>* hurry) {
  if (stopped_.exchange(true)) return 0;
  {
    std::lock_guard<std::mutex> lock(active_mutex_);  // handle_completion checks it under the lock
    stopping_ = true;
  }
  const bool listening = http_thread_.joinable();
  if (listening) stop_accepting(*http_);
  int64_t cancelled = 0;
  if (!wait_until_idle(Clock::now() + grace, hurry)) {
    cancelling_ = true;
    std::vector<std::shared_ptr<RequestChannel>> channels;
    {
      std::lock_guard<std::mutex> lock(active_mutex_);
      for (auto& [_, c] : active_) channels.push_back(c);
    }
    cancelled = static_cast<int64_t>(channels.size());
    if (engine_)
      for (auto& c : channels)
        for (RequestId id : c->ids()) engine_->cancel(id);
    // The cancelled streams send their last events; then whatever is still open is closed.
    wait_until_idle(Clock::now() + kDrainTimeout, nullptr);
  }
  if (listening) {
    close_connections(*http_);
    http_thread_.join();
  }
  quit_ = true;
  if (step_thread_.joinable()) step_thread_.join();
  return cancelled;
}

void Server::require_ready() const {
  if (stopping_) throw ApiError(503, "the server is shutting down", "", "server_error");
  if (!ready_) throw ApiError(503, "the model is still loading; try again shortly", "", "server_error");
}

void Server::submit_all(const CompletionRequest& request, const std::shared_ptr<RequestChannel>& channel) {
  // The server keeps the count: the engine's queue also holds requests that a free slot takes at the next step, so
  // its limit alone would refuse a burst of --parallel requests on an idle server.
  const int64_t n = static_cast<int64_t>(request.prompts.size());
  const int64_t limit = options_.parallel + options_.max_queue;
  for (int64_t cur = in_flight_.load();;) {
    if (cur + n > limit) {
      requests_rejected_ += n;
      throw ApiError(503,
                     "the server is busy: " + std::to_string(options_.parallel) + " requests are generating and " +
                         std::to_string(options_.max_queue) + " waiting (--parallel, --max-queue); retry later",
                     "", "server_error");
    }
    if (in_flight_.compare_exchange_weak(cur, cur + n)) break;
  }
  std::vector<GenerateRequest> requests(request.prompts.size(), request.base);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].prompt = request.prompts[i];
    requests[i].on_event = [this, channel, i](const RequestEvent& e) {
      if (e.finished) in_flight_ -= 1;
      channel->push(i, e);
    };
  }
  // One seed for the request: choice i samples with seed + i, as it would alone with that seed.
  if (request.base.sampling.seed_given) assign_batch_seeds(requests, request.base.sampling.seed);
  for (size_t i = 0; i < requests.size(); ++i) {
    try {
      channel->add_id(engine_->submit(std::move(requests[i])));
    } catch (const Error& e) {  // the engine's own checks; those submitted are cancelled and end as usual
      for (RequestId id : channel->ids()) engine_->cancel(id);
      channel->drop_unsubmitted(requests.size() - i);
      in_flight_ -= static_cast<int64_t>(requests.size() - i);
      requests_rejected_ += 1;
      throw ApiError(400, e.what(), request.prompts.size() > 1 ? "prompt[" + std::to_string(i) + "]" : "prompt");
    }
  }
}

void Server::cancel_if_stopping(RequestChannel& channel) {
  // shutdown() cancels what is in flight when the grace ends; this catches a request submitted while it did.
  if (cancelling_ && !channel.finished())
    for (RequestId id : channel.ids()) engine_->cancel(id);
}

void Server::finish(const std::shared_ptr<RequestChannel>& channel) {
  std::lock_guard<std::mutex> lock(active_mutex_);
  active_.erase(channel.get());
}

void Server::handle_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  require_ready();
  auto request = std::make_shared<CompletionRequest>(
      chat ? parse_chat_completion(parse_ordered_json_body(req.body), tokenizer_.get(), chat_template_.get(), limits_)
           : parse_completion(parse_ordered_json_body(req.body), tokenizer_.get(), limits_));
  auto channel = std::make_shared<RequestChannel>(request->prompts.size());
  {
    std::lock_guard<std::mutex> lock(active_mutex_);
    if (stopping_) throw ApiError(503, "the server is shutting down", "", "server_error");
    active_[channel.get()] = channel;
  }
  try {
    submit_all(*request, channel);
  } catch (...) {
    finish(channel);
    throw;
  }
  requests_total_ += static_cast<int64_t>(request->prompts.size());
  for (const auto& p : request->prompts) prompt_tokens_total_ += static_cast<int64_t>(p.size());

  const std::string id =
      std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(created_) + "-" + std::to_string(next_response_id_++);
  auto response = std::make_shared<CompletionResponse>(request, tokenizer_.get(), id, model_name_, unix_now());
  auto count = [this](const CompletionResponse& r) {
    for (const GenerateResult& g : r.results()) {
      generated_tokens_total_ += static_cast<int64_t>(g.tokens.size());
    }
  };

  if (!request->stream) {
    while (true) {
      cancel_if_stopping(*channel);
      for (const ChoiceEvent& e : channel->take(std::chrono::milliseconds(1000))) response->add(e);
      if (channel->finished()) {
        for (const ChoiceEvent& e : channel->take(std::chrono::milliseconds(0))) response->add(e);
        break;
      }
    }
    finish(channel);
    count(*response);
    if (response->cancelled()) {
      requests_cancelled_ += 1;
      const std::string failure = response->failure();
      throw ApiError(stopping_ ? 503 : 500, failure, "", "server_error");
    }
    return send_json(res, 200, response->full());
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The provider runs on this worker after the handler returns; it ends when every choice has finished (true) or
  // when a write fails because the client went away (false). Either way the releaser runs, and a request still
  // generating is cancelled: its slot is free at the next step.
  auto finished = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, channel, response, finished](size_t, httplib::DataSink& sink) {
        try {
          return stream_some(*channel, *response, *finished, sink);
        } catch (const std::exception& e) {  // it runs outside the handler's guard: end the stream, not the process
          std::fprintf(stderr, "serve: stream failed: %s\n", e.what());
          return false;
        }
      },
      [this, channel, response, finished, count](bool) {
        if (!*finished && engine_) {
          requests_cancelled_ += 1;
          for (RequestId id : channel->ids()) engine_->cancel(id);
        }
        if (*finished) count(*response);
        finish(channel);
      });
}

// One turn of a stream's content provider: writes what the engine sent (or a heartbeat); false when the write failed.
bool Server::stream_some(RequestChannel& channel, CompletionResponse& response, bool& finished,
                         httplib::DataSink& sink) {
  cancel_if_stopping(channel);
  std::deque<ChoiceEvent> events = channel.take(kStreamHeartbeat);
  if (events.empty() && !channel.finished()) {
    const std::string ping = ": waiting\n\n";
    return sink.write(ping.data(), ping.size());
  }
  std::string out;
  for (const ChoiceEvent& e : events) out += response.stream_event(e);
  const bool done = channel.finished();
  if (done) {  // events pushed after the take above
    for (const ChoiceEvent& e : channel.take(std::chrono::milliseconds(0))) out += response.stream_event(e);
    out += response.stream_end();
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) return false;
  if (done) {
    finished = true;
    sink.done();
  }
  return true;
}

void Server::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  require_ready();
  const json body = parse_json_body(req.body);
  if (!tokenizer_) throw ApiError(400, "this model has no tokenizer.json, so text cannot be tokenized");
  if (!body.contains("content") || !body["content"].is_string())
    throw bad_request("content", "expected the text to tokenize as a string");
  const bool with_pieces = read_bool(body, "with_pieces", false);
  read_bool(body, "add_special", false);  // accepted; this tokenizer adds no special tokens
  const std::vector<int32_t> ids = tokenizer_->encode(body["content"].get<std::string>());
  // The answer's JSON takes hundreds of bytes per token (a 14 MB text of 12.5 M tokens took 8.5 GB with pieces):
  // bounded by the longest prompt the server takes.
  if (static_cast<int64_t>(ids.size()) > limits_.max_prompt)
    throw bad_request("content", "encodes to " + std::to_string(ids.size()) + " tokens, more than the limit of " +
                                     std::to_string(limits_.max_prompt) + " (the server's --max-prompt)");
  json tokens = json::array();
  for (int32_t id : ids) {
    if (with_pieces) {
      tokens.push_back({{"id", id}, {"piece", tokenizer_->token_bytes(id)}});
    } else {
      tokens.push_back(id);
    }
  }
  send_json(res, 200, {{"tokens", tokens}});
}

void Server::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  require_ready();
  const json body = parse_json_body(req.body);
  if (!tokenizer_) throw ApiError(400, "this model has no tokenizer.json, so tokens cannot be turned into text");
  if (!body.contains("tokens") || !body["tokens"].is_array())
    throw bad_request("tokens", "expected an array of token ids");
  const std::vector<int32_t> ids = read_token_ids(body["tokens"], "tokens", tokenizer_->vocab_size());
  send_json(res, 200, {{"content", tokenizer_->decode(ids)}});
}

void Server::handle_models(httplib::Response& res) const {
  require_ready();
  send_json(
      res, 200,
      {{"object", "list"},
       {"data",
        json::array({{{"id", model_name_}, {"object", "model"}, {"created", created_}, {"owned_by", "mambacpp"}}})}});
}

void Server::handle_metrics(httplib::Response& res) const {
  std::ostringstream m;
  auto metric = [&](const char* name, const char* type, const char* help, int64_t value) {
    m << "# HELP mambacpp_" << name << " " << help << "\n# TYPE mambacpp_" << name << " " << type << "\nmambacpp_"
      << name << " " << value << "\n";
  };
  const EngineStats s = ready_ ? engine_->stats() : EngineStats{};
  metric("requests_running", "gauge", "Requests generating (holding a state slot).", s.running);
  metric("requests_running_peak", "gauge", "The most requests generating at once since the server started.",
         s.running_peak);
  metric("requests_queued", "gauge", "Requests waiting for a state slot.", s.queued);
  metric("requests_total", "counter", "Prompts submitted to the engine (one per choice).", requests_total_);
  metric("requests_cancelled_total", "counter", "Requests cancelled (client gone or shutdown).", requests_cancelled_);
  metric("requests_rejected_total", "counter", "Prompts the engine refused (full queue or bad request).",
         requests_rejected_);
  metric("prompt_tokens_total", "counter", "Prompt tokens submitted.", prompt_tokens_total_);
  metric("generated_tokens_total", "counter", "Tokens generated by finished requests.", generated_tokens_total_);
  metric("cached_tokens_total", "counter", "Prompt tokens served from the state cache.", s.cached_tokens);
  metric("cache_hits_total", "counter", "Requests that started from a cached state.", s.cache_hits);
  metric("cache_entries", "gauge", "States in the prefix cache.", s.cache_entries);
  metric("cache_bytes", "gauge", "Bytes held by the prefix cache.", s.cache_bytes);
  metric("cache_budget_bytes", "gauge", "The prefix cache budget (--state-cache-mb).", s.cache_budget_bytes);
  metric("draft_tokens_total", "counter", "Tokens drafted for speculative decoding.", s.draft_tokens);
  metric("accepted_draft_tokens_total", "counter", "Drafted tokens the model agreed with.", s.accepted_draft_tokens);
  metric("verify_steps_total", "counter", "Engine steps that ran a speculative verify forward.", s.verify_steps);
  m << "# HELP mambacpp_draft_acceptance_rate Accepted drafted tokens / drafted tokens (0 before any draft).\n"
    << "# TYPE mambacpp_draft_acceptance_rate gauge\nmambacpp_draft_acceptance_rate "
    << (s.draft_tokens > 0 ? double(s.accepted_draft_tokens) / double(s.draft_tokens) : 0.0) << "\n";
  m << "# HELP mambacpp_step_seconds Engine step latency (one forward over every active row).\n"
    << "# TYPE mambacpp_step_seconds summary\n"
    << "mambacpp_step_seconds_sum " << double(step_ns_total_) * 1e-9 << "\n"
    << "mambacpp_step_seconds_count " << steps_total_ << "\n";
#if defined(__GLIBC__)
  // What the allocator holds, to tell live memory from memory it keeps after freeing (docs/reliability.md, soak).
  const struct mallinfo2 heap = mallinfo2();
  metric("heap_in_use_bytes", "gauge", "Bytes of heap allocations live (malloc's arenas and its own mmaps).",
         static_cast<int64_t>(heap.uordblks + heap.hblkhd));
  metric("heap_free_bytes", "gauge", "Bytes freed but kept by malloc in its arenas (not returned to the system).",
         static_cast<int64_t>(heap.fordblks));
#endif
  res.status = 200;
  res.set_content(m.str(), "text/plain; version=0.0.4");
}

}  // namespace mambacpp::server
