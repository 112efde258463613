// `mambacpp perplexity`: the model's loss over a text file, the state carried across the whole text (or reset every
// --context tokens, like llama.cpp's windows).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "mambacpp/model_tokenizer.h"
#include "mambacpp/perplexity.h"
#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"

namespace mambacpp::cli {

namespace {
struct PerplexityCliOptions {
  ModelOptions model;
  std::string file;
  int64_t context = 0;
  bool json = false;
  std::string save_logprobs, kl_base;
};

// KL(base || model) per scored position, summed in double, and how often both put the same token first.
struct KlStats {
  double sum = 0, max = 0;
  int64_t n = 0, same_top = 0;
};

void run_perplexity(const PerplexityCliOptions& o) {
  auto model = load_model(o.model);
  auto tokenizer = load_model_tokenizer(model->directory());
  if (!tokenizer)
    fail("model '", model->directory(), "' has no tokenizer (tokenizer.json, or a GGUF vocabulary): perplexity needs ",
         "one to tokenize --file");
  std::vector<int32_t> ids = tokenizer->encode(read_input_file(o.file, "--file"));
  PerplexityOptions po;
  po.context = o.context;
  // Forward calls of --batch-tokens tokens; by default 2048 on every device (the [tokens, vocab] logits buffer).
  po.batch_tokens = o.model.max_batch_tokens > 0 ? o.model.max_batch_tokens : kCpuPieceTokens;
  po.state_dtype = o.model.state();
  if (stderr_is_terminal())
    po.on_progress = [](int64_t done, int64_t total) {
      std::fprintf(stderr, "\r%lld / %lld tokens", static_cast<long long>(done), static_cast<long long>(total));
      if (done == total) std::fprintf(stderr, "\n");
    };
  const int64_t vocab = model->config().vocab_size;
  const LogprobFileShape shape{vocab, static_cast<int64_t>(ids.size()), o.context};
  std::unique_ptr<LogprobWriter> save;
  std::unique_ptr<LogprobReader> base;
  if (!o.save_logprobs.empty()) save = std::make_unique<LogprobWriter>(o.save_logprobs, shape);
  if (!o.kl_base.empty()) base = std::make_unique<LogprobReader>(o.kl_base, shape);
  KlStats kl;
  std::vector<double> lp(static_cast<size_t>(vocab));
  if (save || base)
    po.on_logits = [&](int64_t pos, std::span<const float> logits) {
      log_softmax(logits, lp);
      if (save) save->write_row(pos, lp);
      if (!base) return;
      const std::span<const float> lb = base->row(pos);
      double d = 0;
      size_t top_b = 0, top_m = 0;
      for (size_t i = 0; i < lp.size(); ++i) {
        d += std::exp(static_cast<double>(lb[i])) * (static_cast<double>(lb[i]) - lp[i]);
        if (lb[i] > lb[top_b]) top_b = i;
        if (lp[i] > lp[top_m]) top_m = i;
      }
      kl.sum += d;
      kl.max = std::max(kl.max, d);
      kl.same_top += top_b == top_m;
      ++kl.n;
    };
  PerplexityResult r = perplexity(*model, ids, po);
  if (save) save->commit();
  const double kl_mean = kl.n ? kl.sum / static_cast<double>(kl.n) : 0.0;
  const double same_top = kl.n ? static_cast<double>(kl.same_top) / static_cast<double>(kl.n) : 0.0;
  if (o.json) {
    nlohmann::json j{{"tokens", ids.size()}, {"predicted", r.n_predicted}, {"nll", r.nll}, {"ppl", r.ppl},
                     {"context", o.context}};
    if (base) j["kl"] = {{"mean", kl_mean}, {"max", kl.max}, {"same_top", same_top}, {"base", o.kl_base}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("perplexity: %.4f (mean loss %.4f nats/token over %lld predicted tokens of %zu; context %s)\n", r.ppl,
                r.nll, static_cast<long long>(r.n_predicted), ids.size(),
                o.context ? std::to_string(o.context).c_str() : "whole text");
    if (base)
      std::printf("KL divergence from %s: mean %.6f nats/token, max %.6f; same top token %.2f%%\n", o.kl_base.c_str(),
                  kl_mean, kl.max, 100.0 * same_top);
  }
}
}  // namespace

CLI::App* add_perplexity_command(CLI::App& app, std::function<void()>& run) {
  auto o = std::make_shared<PerplexityCliOptions>();
  CLI::App* cmd = app.add_subcommand("perplexity", "loss and perplexity of the model over a text file");
  add_model_options(*cmd, o->model);
  cmd->add_option("-f,--file", o->file, "text file")->required();
  cmd->add_option("-c,--context", o->context, "reset the state every N tokens (0 = carry it through the whole text)")
      ->check(IntRange(0, kMaxCliCount))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "print a JSON object");
  cmd->add_option("--save-logprobs", o->save_logprobs,
                  "write every scored position's log-probabilities to FILE (the base of a later --kl-base)");
  cmd->add_option("--kl-base", o->kl_base,
                  "KL divergence from the run that wrote FILE with --save-logprobs (same text and --context): its "
                  "mean and max per token, and how often both put the same token first");
  cmd->callback([o, &run] { run = [o] { run_perplexity(*o); }; });
  return cmd;
}

}  // namespace mambacpp::cli
