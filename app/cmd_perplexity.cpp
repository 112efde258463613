// `mambacpp perplexity`: the model's loss over a text file, the state carried across the whole text (or reset every
// --context tokens, like llama.cpp's windows).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

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
  PerplexityResult r = perplexity(*model, ids, po);
  if (o.json) {
    std::cout << nlohmann::json{{"tokens", ids.size()}, {"predicted", r.n_predicted}, {"nll", r.nll}, {"ppl", r.ppl},
                                {"context", o.context}}
                     .dump()
              << "\n";
  } else {
    std::printf("perplexity: %.4f (mean loss %.4f nats/token over %lld predicted tokens of %zu; context %s)\n", r.ppl,
                r.nll, static_cast<long long>(r.n_predicted), ids.size(),
                o.context ? std::to_string(o.context).c_str() : "whole text");
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
  cmd->callback([o, &run] { run = [o] { run_perplexity(*o); }; });
  return cmd;
}

}  // namespace mambacpp::cli
