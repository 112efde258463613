// `mambacpp logits`: one sequence's logits at every position, as a float32 .npy [L, vocab_rows] — the stable
// interface outside checks rely on. With --chunks the sequence runs as consecutive calls carrying the state.
#include <algorithm>
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
  cmd->add_option("--max-out-mb", opts->max_out_mb, "refuse inputs whose logits file would exceed this many MiB")
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
      // The file's size, bounded before running (L <= 2^31, V <= 2^30): a typo in a length should not fill a disk.
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
      const int64_t V = model->config().vocab_size;
      // Rows go to the file as each piece finishes: memory holds one piece's logits whatever L is. Pieces are the
      // model's own (max_batch_tokens, counted from each chunk's start), so the numbers are those of one call per
      // chunk. The file appears whole at commit(); an error before leaves any previous file as it was.
      const int64_t piece = std::max<int64_t>(1, model->load_options().max_batch_tokens);
      NpyF32Writer out(o.out, {L, V});
      int64_t at = 0;
      for (int64_t c : chunks) {
        for (int64_t done = 0; done < c;) {
          const int64_t n = std::min(piece, c - done);
          Sequence s = ids.empty()
                           ? Sequence::embeds(TensorView(emb.data() + at * D, DType::F32, {n, D}))
                           : Sequence::tokens(std::span<const int32_t>(ids.data() + at, static_cast<size_t>(n)));
          ForwardResult r = model->forward(*state, {&s, 1}, Output::AllLogits);
          out.append(r.values.data(), static_cast<int64_t>(r.values.size()));
          at += n;
          done += n;
        }
      }
      out.commit();
    };
  });
  return cmd;
}

}  // namespace mambacpp::cli
