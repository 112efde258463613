// Perplexity of a model on a token sequence: the mean negative log-likelihood (nats per token) of each token given
// the tokens before it, and exp of that.
//
// context == 0: the whole text is one sequence (the recurrent state carries across everything, as Mamba allows);
//   it is fed in pieces of batch_tokens and positions 1..N-1 are predicted.
// context == C > 0: independent windows of C tokens, each from a fresh state, like llama.cpp's perplexity; the
//   first token of each window is not predicted. Unlike llama.cpp, every prediction in the window is scored (an SSM
//   has no context-length edge effects to hide) and a final shorter window of >= 2 tokens is kept (a final window of
//   one token has nothing to predict and is dropped). Windows of length <= batch_tokens run several at a time, one state slot each.
// Log-softmax and the sums are computed in double.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mambacpp/dtype.h"

namespace mambacpp {

class AtomicFile;
class Model;

struct PerplexityOptions {
  int64_t context = 0;         // 0: one sequence; C >= 2: windows of C tokens
  int64_t batch_tokens = 512;  // tokens per forward call (bounds the [tokens, vocab] logits buffer)
  DType state_dtype = DType::F32;
  std::function<void(int64_t done, int64_t total)> on_progress;  // tokens fed so far / tokens in total
  // Called with the logits at each scored position pos (those predicting token pos + 1), in no particular order
  // across windows (the KL divergence from a base model's run: `mambacpp perplexity --kl-base`).
  std::function<void(int64_t pos, std::span<const float> logits)> on_logits;
};

struct PerplexityResult {
  double nll = 0.0;         // mean negative log-likelihood, nats per predicted token
  double ppl = 0.0;         // exp(nll)
  int64_t n_predicted = 0;  // predicted positions
};

// Throws Error when fewer than 2 tokens are given, context is 1 or negative, batch_tokens < 1, or a token is
// outside the vocabulary.
PerplexityResult perplexity(const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& options = {});

// -log softmax(logits)[target], in double.
double token_nll(std::span<const float> logits, int32_t target);

// out[i] = log softmax(logits)[i], computed in double.
void log_softmax(std::span<const float> logits, std::span<double> out);

// The log-probabilities of one perplexity run, the base of a later run's KL divergence (`perplexity --save-logprobs`
// and `--kl-base`, like llama-perplexity's --kl-divergence-base): a header (magic, vocab, tokens, context), then one
// row of `vocab` f32 log-probabilities per text position; the rows of unscored positions are zero.
struct LogprobFileShape {
  int64_t vocab = 0, tokens = 0, context = 0;
};

// Rows in any order (windows finish out of order); the file appears whole at commit() or not at all (a temporary
// file renamed over `path`, as every file mambacpp writes).
class LogprobWriter {
 public:
  LogprobWriter(const std::string& path, const LogprobFileShape& shape);
  ~LogprobWriter();
  LogprobWriter(const LogprobWriter&) = delete;
  LogprobWriter& operator=(const LogprobWriter&) = delete;
  void write_row(int64_t pos, std::span<const double> logprobs);
  void commit();

 private:
  std::unique_ptr<AtomicFile> file_;
  LogprobFileShape shape_;
  std::vector<float> row_;
};

// The rows of a LogprobWriter's file, one at a time (it may be far larger than memory). Throws Error naming the file
// when it is not one, or was written for another text, vocabulary or context.
class LogprobReader {
 public:
  LogprobReader(const std::string& path, const LogprobFileShape& expected);
  std::span<const float> row(int64_t pos);

 private:
  std::string path_;
  LogprobFileShape shape_;
  std::ifstream in_;
  std::vector<float> row_;
};

}  // namespace mambacpp
