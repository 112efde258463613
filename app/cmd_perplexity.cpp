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
#include "mambacpp/npy.h"
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

// A run's log-probabilities for --kl-base (like llama-perplexity's --kl-divergence-base): a float32 .npy of shape
// [tokens, vocab], one row per text position (the rows of unscored positions are zero). Written in order as the
// positions are scored, whole or not at all (NpyF32Writer: a temporary file renamed over the target).
class LogprobWriter {
 public:
  LogprobWriter(const std::string& path, int64_t tokens, int64_t vocab)
      : out_(path, {tokens, vocab}), tokens_(tokens), row_(static_cast<size_t>(vocab)) {}
  void write_row(int64_t pos, std::span<const double> lp) {
    if (pos < next_ || pos >= tokens_)
      fail("perplexity --save-logprobs: position ", pos, " arrived out of order (next expected: ", next_, ")");
    pad_to(pos);
    for (size_t i = 0; i < lp.size(); ++i) row_[i] = static_cast<float>(lp[i]);
    out_.append(row_.data(), static_cast<int64_t>(row_.size()));
    next_ = pos + 1;
  }
  void commit() {
    pad_to(tokens_);
    out_.commit();
  }

 private:
  void pad_to(int64_t pos) {
    if (next_ >= pos) return;
    std::fill(row_.begin(), row_.end(), 0.0f);
    for (; next_ < pos; ++next_) out_.append(row_.data(), static_cast<int64_t>(row_.size()));
  }
  NpyF32Writer out_;
  int64_t tokens_, next_ = 0;
  std::vector<float> row_;
};

// The rows of a --save-logprobs file, read one at a time (the file may be far larger than memory).
class LogprobReader {
 public:
  LogprobReader(const std::string& path, int64_t tokens, int64_t vocab) : path_(path), vocab_(vocab) {
    f_.open(path, std::ios::binary);
    if (!f_) fail("perplexity: cannot open --kl-base '", path, "'");
    char head[12] = {};
    f_.read(head, 10);
    if (!f_ || std::memcmp(head, "\x93NUMPY", 6) != 0 || (head[6] != 1 && head[6] != 2))
      fail("perplexity: --kl-base '", path, "' is not a .npy file written by --save-logprobs");
    uint32_t hlen = static_cast<uint8_t>(head[8]) | static_cast<uint32_t>(static_cast<uint8_t>(head[9])) << 8;
    offset_ = 10;
    if (head[6] == 2) {
      f_.read(head + 10, 2);
      hlen |= static_cast<uint32_t>(static_cast<uint8_t>(head[10])) << 16 |
              static_cast<uint32_t>(static_cast<uint8_t>(head[11])) << 24;
      offset_ = 12;
    }
    if (hlen > 4096) fail("perplexity: --kl-base '", path, "': a .npy header of ", hlen, " bytes is not ours");
    std::string dict(hlen, '\0');
    f_.read(dict.data(), hlen);
    offset_ += hlen;
    const std::string want = "(" + std::to_string(tokens) + ", " + std::to_string(vocab) + ")";
    if (!f_ || dict.find("'descr': '<f4'") == std::string::npos || dict.find("'fortran_order': False") == std::string::npos)
      fail("perplexity: --kl-base '", path, "' is not a float32 C-order .npy written by --save-logprobs");
    if (dict.find("'shape': " + want) == std::string::npos)
      fail("perplexity: --kl-base '", path, "' does not hold shape ", want, " (tokens, vocab) of this run; found the "
           "header ", dict.substr(0, dict.find('}') + 1), " (the same text and model vocabulary are needed)");
    row_.resize(static_cast<size_t>(vocab));
  }
  std::span<const float> read_row(int64_t pos) {
    f_.seekg(static_cast<std::streamoff>(offset_ + pos * vocab_ * static_cast<int64_t>(sizeof(float))));
    f_.read(reinterpret_cast<char*>(row_.data()), static_cast<std::streamsize>(row_.size() * sizeof(float)));
    if (!f_) fail("perplexity: --kl-base '", path_, "' ends before position ", pos);
    return row_;
  }

 private:
  std::string path_;
  int64_t vocab_;
  int64_t offset_ = 0;
  std::ifstream f_;
  std::vector<float> row_;
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
  const auto tokens = static_cast<int64_t>(ids.size());
  std::unique_ptr<LogprobWriter> save;
  std::unique_ptr<LogprobReader> base;
  if (!o.save_logprobs.empty()) save = std::make_unique<LogprobWriter>(o.save_logprobs, tokens, vocab);
  if (!o.kl_base.empty()) base = std::make_unique<LogprobReader>(o.kl_base, tokens, vocab);
  KlStats kl;
  std::vector<double> lp(static_cast<size_t>(vocab));
  if (save || base)
    po.on_logits = [&](int64_t pos, std::span<const float> logits) {
      log_softmax(logits, lp);
      if (save) save->write_row(pos, lp);
      if (!base) return;
      const std::span<const float> lb = base->read_row(pos);
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
                  "write every scored position's log-probabilities to FILE, a float32 .npy [tokens, vocab] (the base of a later --kl-base)");
  cmd->add_option("--kl-base", o->kl_base,
                  "KL divergence from the run that wrote FILE with --save-logprobs (same text and --context): its "
                  "mean and max per token, and how often both put the same token first");
  cmd->callback([o, &run] { run = [o] { run_perplexity(*o); }; });
  return cmd;
}

}  // namespace mambacpp::cli
