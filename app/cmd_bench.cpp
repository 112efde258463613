// `mambacpp bench`: prefill and decode speed on a model directory or on random weights of a real shape, against
// the memory-bandwidth floor of a decode step (every weight read once — the embedding gather excluded, the LM head
// included — plus the state read and written once, in its dtype) divided by the measured device copy bandwidth.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli_common.h"
#include "commands.h"
#include "mambacpp/error.h"
#include "model/shapes.h"
#include "model/weights.h"

namespace mambacpp::cli {

namespace {

struct BenchOptions {
  ModelOptions model;
  std::string shape;
  int64_t batch = 1, prompt = 100, gen = 1000;
  int repeat = 3;
  bool json = false;
  bool host_argmax = false;  // copy whole logit rows and take the argmax on the host (before device selection)
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Device copy bandwidth, counting bytes read plus bytes written (median of 10 copies of a 256 MiB buffer).
double copy_bandwidth(Backend& be) {
  const size_t bytes = size_t(256) << 20;
  DeviceBuffer a(be, bytes), b(be, bytes);
  be.fill_zero(a.data(), bytes);
  be.copy(b.data(), a.data(), bytes);
  be.synchronize();
  std::vector<double> times;
  for (int i = 0; i < 10; ++i) {
    auto t = Clock::now();
    be.copy(b.data(), a.data(), bytes);
    be.synchronize();
    times.push_back(ms_since(t));
  }
  return 2.0 * bytes / (median(times) / 1000.0);
}

int64_t weight_bytes(const Model& model) {
  const ModelWeights& w = model.weights();
  int64_t sum = static_cast<int64_t>(w.norm_f.nbytes() + w.lm_head.nbytes());
  for (const LayerWeights& l : w.layers)
    for (const TensorView* t : {&l.norm, &l.in_proj, &l.in_proj_bias, &l.conv, &l.conv_bias, &l.A_log, &l.D, &l.dt_bias,
                                &l.out_proj, &l.out_proj_bias, &l.x_proj, &l.dt_proj, &l.gated_norm})
      if (!t->empty()) sum += static_cast<int64_t>(t->nbytes());
  return sum;
}

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

void run_bench(const BenchOptions& o) {
  if (o.shape.empty() == o.model.model_dir.empty()) fail("bench: give exactly one of --shape or --model");
  const LoadOptions lo = load_options(o.model);
  auto t_load = Clock::now();
  std::unique_ptr<Model> model = o.shape.empty() ? load_model(o.model) : Model::random(named_shape(o.shape), lo, 1);
  const double load_ms = ms_since(t_load);
  const ModelConfig& c = model->config();
  const DType state_dtype = o.model.state();
  Backend& be = model->backend();
  const double bandwidth = copy_bandwidth(be);

  auto state = model->create_state(o.batch, state_dtype);
  const int64_t state_bytes = o.batch * c.n_layer * (c.conv_state_size() + c.ssm_state_size()) *
                              static_cast<int64_t>(dtype_size(state_dtype));
  const int64_t step_bytes = weight_bytes(*model) + 2 * state_bytes;
  const double floor_ms = step_bytes / bandwidth * 1000.0;

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(o.batch));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(o.prompt));
    for (auto& t : p) t = tok(rng);
  }
  const std::vector<TopKRequest> greedy(static_cast<size_t>(o.batch));  // k = 1 over the whole row
  std::vector<double> prefill_ms, decode_ms;
  for (int rep = 0; rep < o.repeat + 1; ++rep) {  // the first round warms up and is not counted
    state->reset_all();
    std::vector<Sequence> seqs;
    for (int64_t b = 0; b < o.batch; ++b) seqs.push_back(Sequence::tokens(prompts[static_cast<size_t>(b)], b));
    // Greedy, as `generate --temp 0` runs it: the argmax is selected on the device (k = 1) and only ids come back;
    // --host-argmax copies the whole rows instead.
    std::vector<int32_t> next(static_cast<size_t>(o.batch));
    auto step = [&] {
      if (o.host_argmax) {
        ForwardResult r = model->forward(*state, seqs, Output::LastLogits);
        for (int64_t b = 0; b < o.batch; ++b) next[static_cast<size_t>(b)] = argmax(r.row(b));
      } else {
        ForwardResult r = model->forward_top_k(*state, seqs, greedy);
        for (int64_t b = 0; b < o.batch; ++b) {
          const TopKCandidates& c = r.candidates[static_cast<size_t>(b)];
          if (c.ids.empty()) fail("bench: sequence ", b, " has no finite logit to pick (logit of token ", c.bad_id, " is ", c.bad_value, ")");
          next[static_cast<size_t>(b)] = c.ids[0];
        }
      }
    };
    auto t0 = Clock::now();
    step();
    const double p_ms = ms_since(t0);
    auto t1 = Clock::now();
    for (int64_t s = 0; s < o.gen; ++s) {
      for (int64_t b = 0; b < o.batch; ++b)
        seqs[static_cast<size_t>(b)] = Sequence::tokens(std::span<const int32_t>(&next[static_cast<size_t>(b)], 1), b);
      step();
    }
    const double d_ms = ms_since(t1);
    if (rep > 0) prefill_ms.push_back(p_ms), decode_ms.push_back(d_ms);
  }
  const double pre = median(prefill_ms), dec = median(decode_ms);
  const double step_ms = o.gen ? dec / o.gen : 0.0;
  nlohmann::json j = {
      {"model", o.shape.empty() ? model->directory() : o.shape},
      {"device", model->device_description()},
      {"weight_dtype", dtype_name(model->weights().layers.at(0).in_proj.dtype)},
      {"state_dtype", dtype_name(state_dtype)},
      {"batch", o.batch}, {"prompt", o.prompt}, {"gen", o.gen}, {"repeat", o.repeat},
      {"cuda_graphs", lo.cuda_graphs},
      {"fused_decode", lo.fused_decode},
      {"host_argmax", o.host_argmax},
      {"load_ms", load_ms},
      {"prefill_ms", pre}, {"prefill_tokens_per_s", pre > 0 ? o.batch * o.prompt / (pre / 1000.0) : 0.0},
      {"decode_ms_per_step", step_ms}, {"decode_tokens_per_s", step_ms > 0 ? o.batch / (step_ms / 1000.0) : 0.0},
      {"total_ms", pre + dec},
      {"prefill_ms_runs", prefill_ms}, {"decode_ms_runs", decode_ms},
      {"copy_bandwidth_gb_s", bandwidth / 1e9},
      {"decode_step_bytes", step_bytes},
      {"decode_floor_ms_per_step", floor_ms},
      {"decode_floor_percent", step_ms > 0 ? 100.0 * floor_ms / step_ms : 0.0}};
  if (o.json) {
    std::cout << j.dump() << "\n";
    return;
  }
  std::printf("model        %s on %s (weights %s, state %s)\n", j["model"].get<std::string>().c_str(),
              model->device_description().c_str(), j["weight_dtype"].get<std::string>().c_str(), o.model.state_dtype.c_str());
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
  cmd->add_option("-b,--batch", o->batch, "sequences decoded together")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("-p,--prompt", o->prompt, "prompt tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("-g,--gen", o->gen, "generated tokens per sequence")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("-r,--repeat", o->repeat, "timed runs (median reported)")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--json", o->json, "print a JSON object");
  cmd->add_flag("--host-argmax", o->host_argmax,
                "greedy from whole logit rows copied to the host (default: the argmax selected on the device)");
  cmd->callback([o, &run] { run = [o] { run_bench(*o); }; });
  return cmd;
}

}  // namespace mambacpp::cli
