// `mambacpp bench`: prefill and decode speed on a model directory or on random weights of a real shape, against
// the memory-bandwidth floor of a decode step (every weight read once — the embedding gather excluded, the LM head
// included — plus the state read and written once, in its dtype) divided by the measured device copy bandwidth.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "mambacpp/engine.h"
#include "mambacpp/error.h"
#include "mambacpp/shapes.h"
#include "mambacpp/state.h"

namespace mambacpp::cli {

namespace {

struct BenchOptions {
  ModelOptions model;
  std::string shape;
  std::string weights = "bf16";  // --shape: the stored dtype of the random weights
  bool weights_given = false;
  int64_t batch = 1, prompt = 100, gen = 1000;
  int repeat = 3;
  bool json = false;
  bool host_argmax = false;  // copy whole logit rows and take the argmax on the host (before device selection)
  // --serve: the serving workload on the engine (serve_bench)
  bool serve = false;
  bool chat_turn = false;  // --chat-turn: time to first token of a chat's next turn, cached vs recomputed
  int64_t requests = 64, min_prompt = 16, max_prompt = 512, max_seqs = 32, state_cache_mb = 1024;
  int64_t checkpoint_interval = EngineOptions{}.state_checkpoint_interval;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// A ggml block format or fp8 `--weights` names (random weights quantized to it: Model::random_quantized).
bool is_block_format(const std::string& w) {
  for (const char* f : {"q8_0", "q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "fp8"})
    if (w == f) return true;
  return false;
}

std::vector<int32_t> random_prompt(const ModelConfig& c, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = tok(rng);
  return p;
}

struct ClosedBatch {
  std::vector<double> prefill_ms, decode_ms;  // per timed run
};

// Prefill of `batch` random prompts of `prompt` tokens, then `gen` greedy decode steps, as `generate --temp 0` runs
// them; the first round warms up and is not counted.
ClosedBatch closed_batch(const Model& model, DType state_dtype, int64_t batch, int64_t prompt, int64_t gen, int repeat,
                         bool host_argmax) {
  const ModelConfig& c = model.config();
  auto state = model.create_state(batch, state_dtype);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(prompt));
    for (auto& t : p) t = tok(rng);
  }
  const std::vector<TopKRequest> greedy(static_cast<size_t>(batch));  // k = 1 over the whole row
  ClosedBatch out;
  for (int rep = 0; rep < repeat + 1; ++rep) {
    state->reset_all();
    std::vector<Sequence> seqs;
    for (int64_t b = 0; b < batch; ++b) seqs.push_back(Sequence::tokens(prompts[static_cast<size_t>(b)], b));
    // Greedy: the argmax is selected on the device (k = 1) and only ids come back; --host-argmax copies the whole
    // rows instead.
    std::vector<int32_t> next(static_cast<size_t>(batch));
    auto step = [&] {
      if (host_argmax) {
        ForwardResult r = model.forward(*state, seqs, Output::LastLogits);
        for (int64_t b = 0; b < batch; ++b) next[static_cast<size_t>(b)] = argmax(r.row(b));
      } else {
        ForwardResult r = model.forward_top_k(*state, seqs, greedy);
        for (int64_t b = 0; b < batch; ++b) {
          const TopKCandidates& k = r.candidates[static_cast<size_t>(b)];
          if (k.ids.empty()) fail("bench: sequence ", b, " has no finite logit to pick (logit of token ", k.bad_id, " is ", k.bad_value, ")");
          next[static_cast<size_t>(b)] = k.ids[0];
        }
      }
    };
    auto t0 = Clock::now();
    step();
    const double p_ms = ms_since(t0);
    auto t1 = Clock::now();
    for (int64_t s = 0; s < gen; ++s) {
      for (int64_t b = 0; b < batch; ++b)
        seqs[static_cast<size_t>(b)] = Sequence::tokens(std::span<const int32_t>(&next[static_cast<size_t>(b)], 1), b);
      step();
    }
    const double d_ms = ms_since(t1);
    if (rep > 0) out.prefill_ms.push_back(p_ms), out.decode_ms.push_back(d_ms);
  }
  return out;
}

// The engine reports a request that failed while running (e.g. past the context limit) in its result, not by
// throwing: a benchmark of failed requests would time nothing, so it stops, naming the request.
void require_ran(const GenerateResult& r, const std::string& what) {
  if (!r.error.empty()) fail("bench: ", what, " failed: ", r.error);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// The serving workload: `requests` random prompts of uniform length in [min_prompt, max_prompt], `gen` greedy
// tokens each, all submitted at once to an engine of `max_seqs` slots; against the closed batch of max_seqs
// prompts of the mean length in the same run.
void serve_bench(const Model& model, const BenchOptions& o, double load_ms) {
  const ModelConfig& c = model.config();
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  std::uniform_int_distribution<int64_t> len(o.min_prompt, o.max_prompt);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(o.requests));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(len(rng)));
    for (auto& t : p) t = tok(rng);
  }
  EngineOptions eo;
  eo.max_seqs = o.max_seqs;
  eo.max_queue = o.requests;
  eo.state_dtype = o.model.state();
  eo.state_cache_mb = o.state_cache_mb;
  eo.state_checkpoint_interval = o.checkpoint_interval;
  std::vector<double> wall_ms, ttft, itl;
  int64_t generated = 0;
  // One engine for every round (its graphs captured once, as a server's are), its cache emptied between rounds:
  // the rounds repeat the same prompts.
  Engine engine(model, nullptr, eo);
  for (int rep = 0; rep < o.repeat + 1; ++rep) {
    engine.clear_cache();
    std::vector<Clock::time_point> last(prompts.size());
    std::vector<double> run_ttft, run_itl;
    int64_t run_generated = 0;
    std::vector<GenerateRequest> reqs(prompts.size());
    const Clock::time_point t0 = Clock::now();
    for (size_t i = 0; i < prompts.size(); ++i) {
      reqs[i].prompt = prompts[i];
      reqs[i].max_new_tokens = static_cast<int>(o.gen);
      reqs[i].sampling.temperature = 0.0f;
      reqs[i].ignore_eos = true;
      reqs[i].on_event = [&, i](const RequestEvent& e) {
        if (!e.token) return;
        const Clock::time_point now = Clock::now();
        (last[i] == Clock::time_point{} ? run_ttft : run_itl)
            .push_back(std::chrono::duration<double, std::milli>(now - (last[i] == Clock::time_point{} ? t0 : last[i])).count());
        last[i] = now;
        ++run_generated;
      };
    }
    const std::vector<GenerateResult> results = engine.run(std::move(reqs));
    for (size_t i = 0; i < results.size(); ++i) require_ran(results[i], "--serve request " + std::to_string(i));
    if (rep == 0) continue;  // warm-up
    wall_ms.push_back(ms_since(t0));
    ttft.insert(ttft.end(), run_ttft.begin(), run_ttft.end());
    itl.insert(itl.end(), run_itl.begin(), run_itl.end());
    generated = run_generated;
  }
  const int64_t mean_prompt = (o.min_prompt + o.max_prompt) / 2;
  const ClosedBatch closed = closed_batch(model, o.model.state(), o.max_seqs, mean_prompt, o.gen, o.repeat, false);
  std::vector<double> closed_total;
  for (size_t i = 0; i < closed.prefill_ms.size(); ++i) closed_total.push_back(closed.prefill_ms[i] + closed.decode_ms[i]);
  const double wall = median(wall_ms), closed_ms = median(closed_total);
  const double rate = generated / (wall / 1000.0);
  const double closed_rate = static_cast<double>(o.max_seqs * o.gen) / (closed_ms / 1000.0);
  nlohmann::json j = {
      {"mode", "serve"},
      {"model", o.shape.empty() ? model.directory() : o.shape},
      {"device", model.device_description()},
      {"weight_dtype", dtype_name(model.weight_dtype())},
      {"state_dtype", dtype_name(o.model.state())},
      {"requests", o.requests}, {"min_prompt", o.min_prompt}, {"max_prompt", o.max_prompt}, {"gen", o.gen},
      {"max_seqs", o.max_seqs}, {"batch_tokens", model.load_options().max_batch_tokens},
      {"state_cache_mb", o.state_cache_mb}, {"state_checkpoint_interval", o.checkpoint_interval}, {"repeat", o.repeat}, {"load_ms", load_ms},
      {"wall_ms", wall}, {"wall_ms_runs", wall_ms},
      {"generated_tokens", generated}, {"generated_tokens_per_s", rate},
      {"ttft_ms_p50", percentile(ttft, 0.5)}, {"ttft_ms_p99", percentile(ttft, 0.99)},
      {"itl_ms_p50", percentile(itl, 0.5)}, {"itl_ms_p99", percentile(itl, 0.99)},
      {"closed_batch", {{"batch", o.max_seqs}, {"prompt", mean_prompt}, {"gen", o.gen}, {"total_ms", closed_ms},
                        {"generated_tokens_per_s", closed_rate}}},
      {"serve_vs_closed", closed_rate > 0 ? rate / closed_rate : 0.0}};
  if (o.json) {
    std::cout << j.dump() << "\n";
    return;
  }
  std::printf("model        %s on %s (weights %s, state %s)\n", j["model"].get<std::string>().c_str(),
              model.device_description().c_str(), j["weight_dtype"].get<std::string>().c_str(),
              o.model.state_dtype.c_str());
  std::printf("workload     %lld requests, prompts uniform in [%lld, %lld], %lld generated each, max-seqs %lld; "
              "median of %d runs\n", (long long)o.requests, (long long)o.min_prompt, (long long)o.max_prompt,
              (long long)o.gen, (long long)o.max_seqs, o.repeat);
  std::printf("serving      %.1f ms wall, %.1f generated tokens/s\n", wall, rate);
  std::printf("latency      time to first token p50 %.1f ms, p99 %.1f ms; inter-token p50 %.2f ms, p99 %.2f ms\n",
              j["ttft_ms_p50"].get<double>(), j["ttft_ms_p99"].get<double>(), j["itl_ms_p50"].get<double>(),
              j["itl_ms_p99"].get<double>());
  std::printf("closed batch %lld x (%lld prompt + %lld generated): %.1f ms, %.1f generated tokens/s\n",
              (long long)o.max_seqs, (long long)mean_prompt, (long long)o.gen, closed_ms, closed_rate);
  std::printf("ratio        serving / closed batch = %.3f\n", j["serve_vs_closed"].get<double>());
}

// A chat's next turn: turn 1 is a -p token prompt answered with -g tokens; turn 2 sends the history plus a
// 32-token message. Time to first token of turn 2 on an engine that served turn 1 (its end state cached) against a
// fresh engine without a cache; and the cost of one state snapshot, the price of each cached position.
void chat_turn_bench(const Model& model, const BenchOptions& o, double load_ms) {
  const ModelConfig& c = model.config();
  EngineOptions eo;
  eo.max_seqs = 1;
  eo.state_dtype = o.model.state();
  eo.state_cache_mb = o.state_cache_mb;
  eo.state_checkpoint_interval = o.checkpoint_interval;
  const std::vector<int32_t> prompt = random_prompt(c, o.prompt, 21), message = random_prompt(c, 32, 22);
  auto turn = [&](std::vector<int32_t> p, int gen) {
    GenerateRequest r;
    r.prompt = std::move(p);
    r.max_new_tokens = gen;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    return r;
  };
  std::vector<double> cached_ms, fresh_ms;
  int64_t cached_tokens = 0, history_tokens = 0;
  for (int rep = 0; rep < o.repeat + 1; ++rep) {
    Engine engine(model, nullptr, eo);
    const GenerateResult r1 = engine.run({turn(prompt, static_cast<int>(std::max<int64_t>(o.gen, 1)))}).front();
    require_ran(r1, "--chat-turn: the first turn");
    std::vector<int32_t> history = prompt;
    history.insert(history.end(), r1.tokens.begin(), r1.tokens.end());
    history.insert(history.end(), message.begin(), message.end());
    history_tokens = static_cast<int64_t>(history.size());
    const GenerateResult hit = engine.run({turn(history, 1)}).front();
    EngineOptions none = eo;
    none.state_cache_mb = 0;
    Engine fresh(model, nullptr, none);
    const GenerateResult miss = fresh.run({turn(history, 1)}).front();
    require_ran(hit, "--chat-turn: the second turn");
    require_ran(miss, "--chat-turn: the second turn, recomputed");
    if (rep == 0) continue;  // warm-up
    cached_ms.push_back(hit.timings.prompt_ms);
    fresh_ms.push_back(miss.timings.prompt_ms);
    cached_tokens = hit.cached_prompt_tokens;
  }
  auto state = model.create_state(1, o.model.state());
  std::vector<double> snap_ms;
  for (int i = 0; i < 11; ++i) {
    const auto t = Clock::now();
    SlotSnapshot s = state->snapshot(0);
    state->restore(0, s);  // waits for the copies
    snap_ms.push_back(ms_since(t) / 2);
  }
  nlohmann::json j = {{"mode", "chat_turn"}, {"model", o.shape.empty() ? model.directory() : o.shape},
                      {"device", model.device_description()}, {"state_dtype", dtype_name(o.model.state())},
                      {"load_ms", load_ms}, {"history_tokens", history_tokens}, {"cached_prompt_tokens", cached_tokens},
                      {"ttft_cached_ms", median(cached_ms)}, {"ttft_uncached_ms", median(fresh_ms)},
                      {"state_bytes", state->slot_bytes()}, {"snapshot_ms", median(snap_ms)}};
  if (o.json) {
    std::cout << j.dump() << "\n";
    return;
  }
  std::printf("model        %s on %s (state %s, %.1f MB per sequence)\n", j["model"].get<std::string>().c_str(),
              model.device_description().c_str(), o.model.state_dtype.c_str(), state->slot_bytes() / 1e6);
  std::printf("next turn    %lld history tokens, %lld from the cache: time to first token %.2f ms cached, %.2f ms "
              "recomputed (median of %d)\n", (long long)history_tokens, (long long)cached_tokens, median(cached_ms),
              median(fresh_ms), o.repeat);
  std::printf("snapshot     %.3f ms per state copy (taking or restoring one)\n", median(snap_ms));
}

void run_bench(const BenchOptions& o) {
  if (o.shape.empty() == o.model.model_dir.empty()) fail("bench: give exactly one of --shape or --model");
  if (o.shape.empty() && o.weights_given)
    fail("bench: --weights ", o.weights, " applies to --shape only (a model directory's weights are stored as they are; "
         "--dtype sets the GPU's)");
  // Every prompt is drawn up front: bound the tokens (int32 each) before allocating them.
  const int64_t tokens = o.serve ? o.requests * o.max_prompt : o.chat_turn ? o.prompt : o.batch * o.prompt;
  if (tokens > kMaxBenchTokens)
    fail("bench: ", o.serve ? "--requests x --max-prompt = " : "--batch x --prompt = ", tokens,
         " prompt tokens, more than ", kMaxBenchTokens, " (they are drawn up front)");
  const LoadOptions lo = load_options(o.model);
  auto t_load = Clock::now();
  std::unique_ptr<Model> model = o.shape.empty()         ? load_model(o.model)
                                 : is_block_format(o.weights) ? Model::random_quantized(named_shape(o.shape),
                                                                                       load_options(o.model), 1, o.weights)
                                                            : random_model(o.shape, o.model, parse_dtype(o.weights));
  const double load_ms = ms_since(t_load);
  if (o.serve) return serve_bench(*model, o, load_ms);
  if (o.chat_turn) return chat_turn_bench(*model, o, load_ms);
  const ModelConfig& c = model->config();
  const DType state_dtype = o.model.state();
  const double bandwidth = model->measure_copy_bandwidth();

  // A step reads every weight (of a mixture of experts, the experts its tokens chose: Model::decode_weight_bytes),
  // reads and writes each sequence's recurrent state, and reads the KV rows its attention layers hold: on average
  // over the run, prompt + gen / 2 of them (their one new row written is negligible).
  const auto probe = model->create_state(1, state_dtype);
  const int64_t state_bytes = o.batch * static_cast<int64_t>(probe->slot_bytes());
  const int64_t kv_bytes = o.batch * static_cast<int64_t>(probe->kv_bytes_per_token()) * (o.prompt + o.gen / 2);
  const int64_t step_bytes = model->decode_weight_bytes(o.batch) + 2 * state_bytes + kv_bytes;
  const double floor_ms = step_bytes / bandwidth * 1000.0;
  const ClosedBatch runs = closed_batch(*model, state_dtype, o.batch, o.prompt, o.gen, o.repeat, o.host_argmax);
  const std::vector<double>& prefill_ms = runs.prefill_ms;
  const std::vector<double>& decode_ms = runs.decode_ms;
  const double pre = median(prefill_ms), dec = median(decode_ms);
  const double step_ms = o.gen ? dec / o.gen : 0.0;
  nlohmann::json j = {
      {"model", o.shape.empty() ? model->directory() : o.shape},
      {"device", model->device_description()},
      {"weight_dtype", dtype_name(model->weight_dtype())},
      {"weights", o.shape.empty() ? std::string(dtype_name(model->weight_dtype())) : o.weights},
      {"state_dtype", dtype_name(state_dtype)},
      {"batch", o.batch}, {"prompt", o.prompt}, {"gen", o.gen}, {"repeat", o.repeat},
      {"cuda_graphs", model->decode_graphs()},  // what ran: false on the CPU or with --no-cuda-graph
      {"fused_decode", lo.fused_decode},
      {"precision", precision_name(lo.precision)},
      {"batch_invariant", lo.batch_invariant},
      {"host_argmax", o.host_argmax},
      {"load_ms", load_ms},
      {"prefill_ms", pre}, {"prefill_tokens_per_s", pre > 0 ? o.batch * o.prompt / (pre / 1000.0) : 0.0},
      {"decode_ms_per_step", step_ms}, {"decode_tokens_per_s", step_ms > 0 ? o.batch / (step_ms / 1000.0) : 0.0},
      {"total_ms", pre + dec},
      {"prefill_ms_runs", prefill_ms}, {"decode_ms_runs", decode_ms},
      {"copy_bandwidth_gb_s", bandwidth / 1e9},
      {"decode_step_bytes", step_bytes},
      {"decode_kv_bytes", kv_bytes},
      {"decode_floor_ms_per_step", floor_ms},
      {"decode_floor_percent", step_ms > 0 ? 100.0 * floor_ms / step_ms : 0.0}};
  if (o.json) {
    std::cout << j.dump() << "\n";
    return;
  }
  std::printf("model        %s on %s (weights %s, state %s)\n", j["model"].get<std::string>().c_str(),
              model->device_description().c_str(), j["weights"].get<std::string>().c_str(), o.model.state_dtype.c_str());
  std::printf("workload     batch %lld, prompt %lld, generate %lld; median of %d runs\n", (long long)o.batch,
              (long long)o.prompt, (long long)o.gen, o.repeat);
  std::printf("prefill      %.2f ms  (%.0f tokens/s)\n", pre, j["prefill_tokens_per_s"].get<double>());
  std::printf("decode       %.4f ms/step  (%.1f tokens/s)\n", step_ms, j["decode_tokens_per_s"].get<double>());
  std::printf("total        %.1f ms\n", pre + dec);
  std::printf("floor        %.4f ms/step = %.1f MB per step / %.0f GB/s copy bandwidth; achieved %.1f%% of floor\n",
              floor_ms, step_bytes / 1e6, bandwidth / 1e9, j["decode_floor_percent"].get<double>());
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, std::function<void()>& run) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "prefill/decode speed against the memory-bandwidth floor");
  add_model_options(*cmd, o->model);
  std::string shapes;
  for (const std::string& s : named_shapes()) shapes += (shapes.empty() ? "" : "|") + s;
  cmd->add_option("--shape", o->shape, "random weights of a real shape: " + shapes);
  cmd->add_option_function<std::string>("--weights", [o](const std::string& w) { o->weights = w, o->weights_given = true; },
                  "--shape: stored format of the random weights: f32|bf16|f16 (the GPU converts them to --dtype), or "
                  "a ggml block format q8_0|q4_k|q6_k|q4_0|q5_0|q5_1|q5_k for the matrices (CPU; q8_0 on CUDA too; q4_k as Q4_K_M's "
                  "embedding and output in q6_k), or fp8 (e4m3 with per-channel scales, CUDA; embedding and output bf16); "
                  "default bf16")
      ->check(CLI::IsMember({"f32", "fp32", "bf16", "f16", "fp16", "q8_0", "q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "fp8"}));
  cmd->add_option("-b,--batch", o->batch, "sequences decoded together")->check(IntRange(1, kMaxBenchBatch))->capture_default_str();
  cmd->add_option("-p,--prompt", o->prompt, "prompt tokens per sequence")->check(IntRange(1, kMaxCliCount))->capture_default_str();
  cmd->add_option("-g,--gen", o->gen, "generated tokens per sequence")->check(IntRange(0, kMaxCliCount))->capture_default_str();
  cmd->add_option("-r,--repeat", o->repeat, "timed runs (median reported)")->check(IntRange(1, 1000000))->capture_default_str();
  cmd->add_flag("--json", o->json, "print a JSON object");
  cmd->add_flag("--host-argmax", o->host_argmax,
                "greedy from whole logit rows copied to the host (default: the argmax selected on the device)");
  cmd->add_flag("--serve", o->serve,
                "serving workload: --requests prompts of uniform length in [--min-prompt, --max-prompt], -g tokens each, "
                "all submitted at once to the engine, beside the closed batch of --max-seqs prompts of the mean length");
  cmd->add_flag("--chat-turn", o->chat_turn,
                "time to first token of a chat's next turn (-p prompt, -g answer, 32 new tokens), cached vs recomputed");
  cmd->add_option("--requests", o->requests, "--serve: requests")->check(IntRange(1, kMaxBenchRequests))->capture_default_str();
  cmd->add_option("--min-prompt", o->min_prompt, "--serve: shortest prompt")->check(IntRange(1, kMaxCliCount))->capture_default_str();
  cmd->add_option("--max-prompt", o->max_prompt, "--serve: longest prompt")->check(IntRange(1, kMaxCliCount))->capture_default_str();
  cmd->add_option("--max-seqs", o->max_seqs, "--serve: requests running at once")->check(IntRange(1, kMaxCliCount))->capture_default_str();
  cmd->add_option("--state-cache-mb", o->state_cache_mb, "--serve: prefix cache budget, MiB")->check(IntRange(0, kMaxStateCacheMb))->capture_default_str();
  cmd->add_option("--state-checkpoint-interval", o->checkpoint_interval,
                  "--serve/--chat-turn: prompt positions (multiples of this) whose state is cached; 0: none")
      ->check(IntRange(0, kMaxCliCount))->capture_default_str();
  cmd->callback([o, &run] {
    if (o->serve && o->min_prompt > o->max_prompt) throw CLI::ValidationError("--min-prompt", "exceeds --max-prompt");
    if (o->serve && o->chat_turn) throw CLI::ValidationError("--chat-turn", "excludes --serve");
    run = [o] { run_bench(*o); };
  });
  return cmd;
}

}  // namespace mambacpp::cli
