// `mambacpp logits`: one sequence's logits at every position, as a float32 .npy [L, vocab_rows] — the stable
// interface outside checks rely on. With --chunks the sequence runs as consecutive calls carrying the state.
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "mambacpp/error.h"
#include "mambacpp/npy.h"

namespace mambacpp::cli {

namespace {
struct LogitsOptions {
  ModelOptions model;
  std::string tokens_file;
  std::string embeddings_file;
  std::string chunks;
  std::string out;
  int64_t max_out_mb = 8192;
};
}  // namespace

CLI::App* add_logits_command(CLI::App& app, std::function<void()>& run) {
  auto opts = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand("logits", "write the logits of every position of one sequence to a .npy file");
  add_model_options(*cmd, opts->model);
  cmd->add_option("--tokens-file", opts->tokens_file, "token ids, separated by spaces or commas");
  cmd->add_option("--embeddings-file", opts->embeddings_file, "input embeddings instead of ids: .npy [L, d_model]");
  cmd->add_option("--chunks", opts->chunks, "run as consecutive chunks of these lengths (N,N,...; must sum to L)");
  cmd->add_option("-o,--out", opts->out, "output .npy file (float32 [L, vocab_rows])")->required();
  cmd->add_option("--max-out-mb", opts->max_out_mb, "refuse inputs whose logits would exceed this many MiB (held in memory)")
      ->check(IntRange(1, kMaxStateCacheMb))
      ->capture_default_str();
  cmd->callback([opts, &run] {
    run = [opts] {
      const LogitsOptions& o = *opts;
      if (o.tokens_file.empty() == o.embeddings_file.empty())
        fail("logits: give exactly one of --tokens-file or --embeddings-file");
      auto model = load_model(o.model);
      std::vector<int32_t> ids;
      std::vector<float> emb;
      int64_t L = 0;
      const int64_t D = model->config().d_model;
      if (!o.tokens_file.empty()) {
        ids = read_token_file(o.tokens_file);
        L = static_cast<int64_t>(ids.size());
      } else {
        NpyArray a = read_npy(o.embeddings_file);
        if (a.shape.size() != 2 || a.shape[1] != D)
          fail("--embeddings-file '", o.embeddings_file, "': expected shape [L, ", D, "] (d_model = ", D,
               "), found ", a.shape.size(), " dimensions", a.shape.size() == 2 ? " [" + std::to_string(a.shape[0]) + ", " + std::to_string(a.shape[1]) + "]" : "");
        emb.assign(a.values.begin(), a.values.end());
        L = a.shape[0];
      }
      if (L == 0) fail("logits: the input holds no tokens (L == 0); expected at least one");
      // The logits are held in memory before they are written: bound them before running (L <= 2^31, V <= 2^30).
      const double out_mb = static_cast<double>(L) * static_cast<double>(model->config().vocab_size) * 4.0 / (1 << 20);
      if (out_mb > static_cast<double>(o.max_out_mb))
        fail("logits: ", L, " tokens x vocab ", model->config().vocab_size, " logits would take ", out_mb,
             " MiB, more than --max-out-mb ", o.max_out_mb, " (raise --max-out-mb to run it)");
      std::vector<int64_t> chunks = o.chunks.empty() ? std::vector<int64_t>{L} : parse_chunks(o.chunks, "--chunks");
      int64_t sum = 0;
      for (int64_t c : chunks) {
        if (c > L - sum) {  // checked before adding: no overflow, and no chunk past the end
          sum = L + 1;
          break;
        }
        sum += c;
      }
      if (sum != L) fail("--chunks: the lengths ", sum > L ? "sum to more than " : "sum to ", sum > L ? L : sum, ", expected L = ", L,
             " (the number of input tokens)");
      auto state = model->create_state(1, o.model.state());
      std::vector<float> logits;
      logits.reserve(static_cast<size_t>(L * model->config().vocab_size));
      int64_t at = 0;
      for (int64_t c : chunks) {
        Sequence s = ids.empty()
                         ? Sequence::embeds(TensorView(emb.data() + at * D, DType::F32, {c, D}))
                         : Sequence::tokens(std::span<const int32_t>(ids.data() + at, static_cast<size_t>(c)));
        ForwardResult r = model->forward(*state, {&s, 1}, Output::AllLogits);
        logits.insert(logits.end(), r.values.begin(), r.values.end());
        at += c;
      }
      write_npy_f32(o.out, logits.data(), {L, model->config().vocab_size});
    };
  });
  return cmd;
}

}  // namespace mambacpp::cli
