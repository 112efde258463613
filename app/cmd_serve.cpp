// `mambacpp serve`: an OpenAI-compatible HTTP server on the serving engine (app/server/, docs/server.md).
// It listens first (/health answers 503 while the model loads), prints its URL once the model is ready, and on
// SIGINT/SIGTERM stops accepting, lets the requests in flight finish (--shutdown-timeout) and exits 0.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cli_common.h"
#include "commands.h"
#include "mambacpp/model_tokenizer.h"
#include "mambacpp/engine.h"
#include "mambacpp/error.h"
#include "mambacpp/shapes.h"
#include "mambacpp/tokenizer.h"
#include "server/chat_template.h"
#include "server/http_connections.h"
#include "server/server.h"

namespace mambacpp::cli {

namespace {

struct ServeCliOptions {
  ModelOptions model;
  server::ServerOptions server;
  SpeculativeCliOptions speculative;  // requests' defaults; a request's draft_* fields override them
  int64_t state_cache_mb = 1024;
  std::string state_cache_dir;
  int64_t state_cache_disk_mb = 4096;
  std::string chat_template = "auto";
  int64_t shutdown_timeout = 25;  // seconds; below Kubernetes' default grace of 30 s before its SIGKILL
  std::string shape;  // random weights of a released model's shape (load tests); no tokenizer: token-id prompts only
};

constexpr int kServeMmapThreshold = 1 << 20;

std::string model_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.filename().empty()) p = p.parent_path();  // "models/default/"
  return p.filename().string();
}

// glibc's malloc raises its mmap threshold to the size of each mmapped block freed (up to 32 MiB) and its trim
// threshold to twice that, after which blocks of those sizes (state snapshots, activations, logits) come from its
// arenas, one per thread group, where the freed ones stay as holes. Under the soak's load (64 slots, 300 HTTP worker
// threads) the arenas held 400 MB of free memory after two minutes beside 220 MB live, and the resident memory
// climbed for five minutes to 0.75-1 GB. With the threshold fixed, blocks past it are mmapped and returned to the
// system when freed: the same load stays flat at 195 MB with 1 MB free in the arenas, for about 7% more CPU per token
// (those blocks get fresh, zeroed pages each time; docs/reliability.md). An explicit MALLOC_MMAP_THRESHOLD_ in the
// environment is left to rule.
void fix_malloc_mmap_threshold() {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, kServeMmapThreshold);
#endif
}

void run_serve(const ServeCliOptions& o) {
  fix_malloc_mmap_threshold();
  // SIGINT/SIGTERM are taken by one thread with sigwait; every other thread (created after this) has them blocked.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not the end of the process

  std::unique_ptr<Model> draft_model;  // declared before the server: its engine's draft slots outlive it
  server::ServerOptions so = o.server;
  so.speculative = o.speculative.params();
  server::Server server(so);

  // The first signal starts a graceful shutdown; a second one ends its grace (the requests left are cancelled).
  // The thread outlives this function (it ends with the process): what it touches is shared.
  struct Signals {
    std::mutex mutex;
    std::condition_variable stop_requested;
    bool stop = false;
    std::atomic<bool> hurry{false};
  };
  auto sig_state = std::make_shared<Signals>();
  std::thread signal_thread([sig_state, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    {
      std::lock_guard<std::mutex> lock(sig_state->mutex);
      sig_state->stop = true;
      sig_state->stop_requested.notify_all();
    }
    sigwait(&signals, &sig);
    std::fprintf(stderr, "serve: second %s: cancelling the requests in flight\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    sig_state->hurry = true;
  });
  signal_thread.detach();
  server.start();
  std::fprintf(stderr, "serve: loading the model (GET /health answers 503 until it is ready)\n");

  if (!o.shape.empty() && !o.model.model_dir.empty()) fail("serve: give at most one of --model or --shape");
  auto model = o.shape.empty() ? load_model(o.model) : random_model(o.shape, o.model, DType::BF16);
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<server::ChatTemplate> chat_template;
  if (o.shape.empty()) {
    tokenizer = load_model_tokenizer(model->directory());
    chat_template = server::select_chat_template(o.chat_template, model->directory());
  }
  const std::string name = o.shape.empty() ? model_name(model->directory()) : o.shape + "-random";
  const std::string device = model->device_description();
  const std::string chat_template_name = chat_template ? chat_template->name : "none";

  check_state_slots(*model, o.server.parallel, o.model.state(), "--parallel");
  EngineOptions eo;
  eo.max_seqs = o.server.parallel;
  eo.max_queue = o.server.parallel + o.server.max_queue;  // the server enforces --max-queue itself (server.cpp)
  eo.max_prompt = o.server.max_prompt;
  eo.max_new_tokens = o.server.max_tokens;
  eo.state_cache_mb = o.state_cache_mb;
  eo.state_cache_dir = o.state_cache_dir;
  eo.state_cache_disk_mb = o.state_cache_dir.empty() ? 0 : o.state_cache_disk_mb;
  eo.state_dtype = o.model.state();
  draft_model = load_draft_model(o.speculative, o.model);
  eo.draft_model = draft_model.get();
  eo.draft_mtp = o.speculative.draft_mtp;
  server.attach(std::move(model), std::move(tokenizer), std::move(chat_template), eo, name);

  std::printf("mambacpp serve: http://%s:%d/v1 ready (model %s on %s, %lld parallel, chat template %s, replica %s)\n",
              o.server.host.c_str(), server.bound_port(), name.c_str(), device.c_str(),
              static_cast<long long>(o.server.parallel), chat_template_name.c_str(), server.replica_id().c_str());
  std::fflush(stdout);

  {
    std::unique_lock<std::mutex> lock(sig_state->mutex);
    sig_state->stop_requested.wait(lock, [&] { return sig_state->stop; });
  }
  std::fprintf(stderr,
               "serve: shutting down: no new connections; %lld requests in flight may finish within %lld s "
               "(--shutdown-timeout; a second signal cancels them)\n",
               static_cast<long long>(server.active_requests()), static_cast<long long>(o.shutdown_timeout));
  const int64_t cancelled = server.shutdown(std::chrono::seconds(o.shutdown_timeout), &sig_state->hurry);
  std::fprintf(stderr, "serve: stopped (%lld requests cancelled)\n", static_cast<long long>(cancelled));
}

}  // namespace

CLI::App* add_serve_command(CLI::App& app, std::function<void()>& run) {
  auto o = std::make_shared<ServeCliOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "serve the model over HTTP with an OpenAI-compatible API");
  add_model_options(*cmd, o->model);
  add_speculative_options(*cmd, o->speculative);
  server::ServerOptions& s = o->server;
  cmd->add_option("--host", s.host, "address to listen on (loopback by default; 0.0.0.0 for every interface)")
      ->capture_default_str();
  cmd->add_option("--port", s.port, "TCP port (0: any free one, printed when ready)")
      ->check(IntRange(0, 65535))
      ->capture_default_str();
  cmd->add_option("--parallel", s.parallel, "requests generating at once (state slots, allocated up front)")
      ->check(IntRange(1, server::kMaxParallel))
      ->capture_default_str();
  cmd->add_option("--max-queue", s.max_queue, "requests waiting for a slot; more get 503")
      ->check(IntRange(0, server::kMaxQueue))
      ->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--state-cache-mb", o->state_cache_mb, "prefix cache of sequence states, MiB (0: off)")
      ->check(IntRange(0, kMaxStateCacheMb))
      ->capture_default_str();
  cmd->add_option("--state-cache-dir", o->state_cache_dir,
                  "keep the prefix cache's states in this directory too: they outlive the process (a restart serves "
                  "them)");
  cmd->add_option("--state-cache-disk-mb", o->state_cache_disk_mb, "the disk tier's budget, MiB (with --state-cache-dir)")
      ->check(IntRange(1, kMaxStateCacheMb))
      ->capture_default_str();
  cmd->add_option("--max-prompt", s.max_prompt, "refuse prompts longer than this many tokens")
      ->check(IntRange(1, kMaxCliCount))
      ->capture_default_str();
  cmd->add_option("--max-tokens", s.max_tokens, "largest max_tokens a request may ask for")
      ->check(IntRange(0, INT32_MAX))  // a request's max_new_tokens is an int
      ->capture_default_str();
  cmd->add_option("--max-body-mb", s.max_body_mb, "refuse request bodies larger than this (413)")
      ->check(IntRange(1, server::kMaxBodyMb))
      ->capture_default_str();
  cmd->add_option("--http-threads", s.http_threads, "HTTP worker threads (0: parallel + max-queue + 8)")
      ->check(IntRange(0, server::kMaxHttpThreads))
      ->capture_default_str();
  cmd->add_option("--max-connections", s.max_connections,
                  "connections open at once; more get 503 (0: the HTTP worker threads, each open connection holds one)")
      ->check(IntRange(0, server::kMaxHttpThreads))
      ->capture_default_str();
  cmd->add_option("--keep-alive-timeout", s.keep_alive_timeout, "seconds an idle connection stays open")
      ->check(IntRange(1, server::kMaxTimeoutSeconds))
      ->capture_default_str();
  cmd->add_option("--read-timeout", s.read_timeout,
                  "seconds a request's head and body may take to arrive, from its first byte (slow clients are cut off)")
      ->check(IntRange(1, server::kMaxTimeoutSeconds))
      ->capture_default_str();
  cmd->add_option("--write-timeout", s.write_timeout, "seconds a send to a client that does not read may stall")
      ->check(IntRange(1, server::kMaxTimeoutSeconds))
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "on SIGTERM/SIGINT, seconds the requests in flight may take to finish before they are cancelled "
                  "(new connections are refused at once)")
      ->check(IntRange(0, server::kMaxTimeoutSeconds))
      ->capture_default_str();
  cmd->add_option("--replica-id", s.replica_id,
                  "this replica's name, sent on every answer as the header X-Mambacpp-Replica (default: "
                  "hostname:port)");
  cmd->add_option("--chat-template", o->chat_template,
                  "auto (the model's own Jinja template, from tokenizer_config.json or chat_template.jinja), "
                  "chatml, none, or the path of a Jinja template file")
      ->check(CLI::IsMember({"auto", "chatml", "none"}) | CLI::ExistingFile)
      ->capture_default_str();
  cmd->add_option("--shape", o->shape,
                  "serve random weights of a released model's shape instead of --model "
                  "(load tests; token-id prompts only)");
  cmd->callback([o, &run] { run = [o] { run_serve(*o); }; });
  return cmd;
}

}  // namespace mambacpp::cli
