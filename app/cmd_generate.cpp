// `mambacpp generate`: text (or token ids) in, streamed text out. With --json one JSON object per prompt instead.
// Runs on the serving engine; --prompts-file submits one request per line (one state slot each, no padding).
// With --chat the prompt is a conversation rendered by the model's chat template, as the server renders it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "mambacpp/model_tokenizer.h"
#include "mambacpp/engine.h"
#include "mambacpp/grammar.h"
#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"
#include "server/api_error.h"
#include "server/chat_template.h"
#include "server/completion_request.h"

namespace mambacpp::cli {

namespace {

struct GenerateCliOptions {
  ModelOptions model;
  SpeculativeCliOptions speculative;
  std::string prompt;
  bool prompt_given = false;
  std::vector<std::string> tokens_files;  // each one a prompt: several run as one batch
  std::string prompts_file;
  int n_predict = 128;
  SamplingParams sampling;
  int64_t seed = -1;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int64_t max_prompt = 65536;
  int64_t max_seqs = 0;  // 0: every prompt at once
  int64_t state_cache_mb = 1024;
  // The prefix cache's disk tier (docs/server.md): states of earlier runs found again by later ones.
  std::string state_cache_dir;
  int64_t state_cache_disk_mb = 4096;
  int64_t checkpoint_interval = EngineOptions{}.state_checkpoint_interval;
  std::string load_state;
  std::string save_state;
  bool json = false;
  // --chat: -p is the user's turn (after --system), or --chat-file holds an OpenAI chat body (messages, tools,
  // chat_template_kwargs, add_generation_prompt); rendered with --chat-template.
  bool chat = false;
  std::string system;
  std::string chat_file;
  std::string chat_kwargs;
  std::string chat_template = "auto";
  // Constrained output (llama-cli's --grammar-file / --json-schema): a GBNF file, or a JSON schema (inline JSON or a
  // file).
  std::string grammar_file;
  std::string json_schema;
};

// The request's grammar from --grammar / --json-schema ("" for none).
std::string cli_grammar(const GenerateCliOptions& o) {
  const auto read_file = [](const std::string& path, const char* flag) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(flag, " '", path, "': cannot open");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  if (!o.grammar_file.empty() && !o.json_schema.empty()) fail("generate: give --grammar or --json-schema, not both");
  if (!o.grammar_file.empty()) {
    std::string g = read_file(o.grammar_file, "--grammar");
    try {
      check_grammar(g);
    } catch (const Error& e) {
      fail("--grammar '", o.grammar_file, "': ", e.what());
    }
    return g;
  }
  if (o.json_schema.empty()) return {};
  const bool inline_json = o.json_schema.find_first_of("{") == 0 || o.json_schema == "true";
  return json_schema_to_grammar(inline_json ? o.json_schema : read_file(o.json_schema, "--json-schema"));
}

// The prompt text of --chat, rendered as /v1/chat/completions renders the same body (server/chat_template.h).
std::string render_cli_chat(const GenerateCliOptions& o, const server::ChatTemplate* tmpl,
                            std::vector<std::string>& stops) {
  if (!tmpl)
    fail("generate --chat: the model has no chat template (tokenizer_config.json's chat_template or "
         "chat_template.jinja); give one with --chat-template chatml or --chat-template FILE");
  nlohmann::ordered_json body;
  if (!o.chat_file.empty()) {
    std::ifstream in(o.chat_file);
    if (!in) fail("--chat-file '", o.chat_file, "': cannot open");
    body = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (body.is_array()) body = {{"messages", body}};
    if (!body.is_object())
      fail("--chat-file '", o.chat_file, "': expected a JSON chat body {\"messages\": [...]} or an array of messages");
  } else {
    body["messages"] = nlohmann::ordered_json::array();
    if (!o.system.empty()) body["messages"].push_back({{"role", "system"}, {"content", o.system}});
    body["messages"].push_back({{"role", "user"}, {"content", o.prompt}});
  }
  if (!o.chat_kwargs.empty()) {
    const auto kwargs = nlohmann::ordered_json::parse(o.chat_kwargs, nullptr, /*allow_exceptions=*/false);
    if (!kwargs.is_object()) fail("--chat-kwargs: expected a JSON object such as '{\"enable_thinking\": false}'");
    body["chat_template_kwargs"] = kwargs;
  }
  try {
    std::string prompt = server::render_chat_prompt(body, tmpl);
    stops.insert(stops.end(), tmpl->stop_strings.begin(), tmpl->stop_strings.end());
    return prompt;
  } catch (const server::ApiError& e) {
    fail("generate --chat: ", e.what());
  }
}

nlohmann::json result_json(const std::vector<int32_t>& prompt, const GenerateResult& r) {
  const double gen_tokens = static_cast<double>(r.tokens.size());
  nlohmann::json j = {{"prompt_tokens", prompt},
          {"tokens", r.tokens},
          {"text", r.text},
          {"stop_reason", finish_reason_name(r.finish_reason)},
          {"cached_prompt_tokens", r.cached_prompt_tokens},
          {"seed", r.seed},
          {"draft_tokens", r.draft_tokens},
          {"accepted_draft_tokens", r.accepted_draft_tokens},
          {"timings",
           {{"queue_ms", r.timings.queue_ms},
            {"prompt_ms", r.timings.prompt_ms},
            {"generate_ms", r.timings.generate_ms},
            {"prompt_tokens_per_s", r.timings.prompt_ms > 0 ? prompt.size() / (r.timings.prompt_ms / 1000.0) : 0.0},
            {"generate_tokens_per_s", r.timings.generate_ms > 0 ? gen_tokens / (r.timings.generate_ms / 1000.0) : 0.0}}}};
  if (!r.error.empty()) j["error"] = r.error;  // absent when the request ran through: older readers unchanged
  return j;
}

void run_generate(const GenerateCliOptions& o) {
  const int inputs = int(o.prompt_given) + int(!o.tokens_files.empty()) + int(!o.prompts_file.empty()) +
                     int(!o.chat_file.empty());
  if (inputs != 1) fail("generate: give exactly one of -p/--prompt, --tokens-file, --prompts-file or --chat-file");
  if (!o.chat && (!o.chat_file.empty() || !o.system.empty() || !o.chat_kwargs.empty()))
    fail("generate: --chat-file, --system and --chat-kwargs need --chat");
  if (o.chat && (!o.tokens_files.empty() || !o.prompts_file.empty()))
    fail("generate --chat: the conversation comes from -p (with --system) or --chat-file");
  if (!o.state_cache_dir.empty() && o.state_cache_mb == 0)
    fail("generate: --state-cache-dir needs the in-memory prefix cache (--state-cache-mb > 0): a state goes to disk "
         "as it enters memory");
  auto model = load_model(o.model);
  const std::unique_ptr<Model> draft_model = load_draft_model(o.speculative, o.model);
  std::unique_ptr<Tokenizer> tokenizer = load_model_tokenizer(model->directory());
  if (!tokenizer && o.tokens_files.empty())
    fail("model '", model->directory(), "' has no tokenizer (tokenizer.json, or a GGUF vocabulary), so text prompts ",
         "cannot be encoded; give token ids with --tokens-file");

  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> stops = o.stop;
  if (o.chat) {
    const auto tmpl = server::select_chat_template(o.chat_template, model->directory());
    // The template writes the special tokens itself (bos_token...): encoded as transformers' apply_chat_template
    // encodes, without adding them again.
    prompts.push_back(tokenizer->encode(render_cli_chat(o, tmpl.get(), stops), /*add_special_tokens=*/false));
  } else if (!o.tokens_files.empty()) {
    for (const std::string& path : o.tokens_files) prompts.push_back(read_token_file(path));
  } else if (o.prompt_given) {
    prompts.push_back(tokenizer->encode(o.prompt, /*add_special_tokens=*/true));  // as tokenizer(text): BOS etc.
  } else {
    for (const std::string& line : read_prompt_lines(o.prompts_file)) prompts.push_back(tokenizer->encode(line, true));
    if (prompts.empty()) fail("--prompts-file '", o.prompts_file, "' holds no prompts (one per line expected)");
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) fail("prompt ", i, " is empty after tokenization: expected at least one token");
    if (static_cast<int64_t>(prompts[i].size()) > o.max_prompt)
      fail("prompt ", i, " has ", prompts[i].size(), " tokens, more than --max-prompt ", o.max_prompt,
           " (raise --max-prompt to run it)");
  }

  if (!o.save_state.empty() && prompts.size() != 1) fail("--save-state needs exactly one prompt");
  const std::string grammar = cli_grammar(o);
  std::vector<GenerateRequest> requests(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests[i].prompt = prompts[i];
    requests[i].max_new_tokens = o.n_predict;
    requests[i].sampling = o.sampling;
    requests[i].stop_strings = stops;
    requests[i].ignore_eos = o.ignore_eos;
    requests[i].save_state = o.save_state;
    requests[i].speculative = o.speculative.params();
    requests[i].grammar = grammar;
  }
  if (o.seed >= 0) assign_batch_seeds(requests, static_cast<uint64_t>(o.seed));

  const bool stream = !o.json && prompts.size() == 1 && tokenizer;
  // Progress of long prompts on a terminal (one line, overwritten), for the first request.
  const bool progress = stderr_is_terminal() &&
                        static_cast<int64_t>(prompts[0].size()) > 4 * model->load_options().max_batch_tokens;
  const int64_t first_len = static_cast<int64_t>(prompts[0].size());
  auto shown = std::make_shared<bool>(false);
  requests[0].on_event = [stream, progress, first_len, shown](const RequestEvent& e) {
    if (progress && !e.token && !e.finished && e.prompt_done > 0) {
      std::fprintf(stderr, "\rprompt: %lld / %lld tokens", static_cast<long long>(e.prompt_done),
                   static_cast<long long>(first_len));
      *shown = true;
    }
    if (*shown && (e.token || e.finished)) std::fprintf(stderr, "\r\033[K"), *shown = false;
    if (stream) {
      if (!e.text.empty()) std::fwrite(e.text.data(), 1, e.text.size(), stdout);  // an empty view may be null
      std::fflush(stdout);
    }
  };
  EngineOptions eo;
  // Every running prompt holds a state slot, allocated up front: bounded by running_slots, then by the memory.
  eo.max_seqs = running_slots(static_cast<int64_t>(prompts.size()), o.max_seqs);
  check_state_slots(*model, eo.max_seqs, o.model.state(), "--max-seqs");
  eo.max_queue = static_cast<int64_t>(prompts.size());
  eo.max_prompt = o.max_prompt;
  eo.state_dtype = o.model.state();
  eo.state_cache_mb = o.state_cache_mb;
  eo.state_cache_dir = o.state_cache_dir;
  eo.state_cache_disk_mb = o.state_cache_dir.empty() ? 0 : o.state_cache_disk_mb;
  eo.state_checkpoint_interval = o.checkpoint_interval;
  eo.draft_model = draft_model.get();
  eo.draft_mtp = o.speculative.draft_mtp;
  Engine engine(*model, tokenizer.get(), eo);
  if (!o.load_state.empty()) {
    const std::vector<int32_t> restored = engine.load_state(o.load_state);
    if (!o.json)
      std::fprintf(stderr, "state: %zu tokens restored from '%s'\n", restored.size(), o.load_state.c_str());
  }
  std::vector<GenerateResult> results = engine.run(std::move(requests));

  for (size_t i = 0; i < results.size(); ++i) {
    const GenerateResult& r = results[i];
    if (o.json) {
      // A generation cut inside a multi-byte character ends in invalid UTF-8: it becomes U+FFFD, as HF's decode does.
      std::cout << result_json(prompts[i], r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else if (!stream) {
      if (results.size() > 1) std::cout << "--- prompt " << i << " ---\n";
      if (tokenizer) {
        std::cout << r.text;
      } else {
        for (int32_t t : r.tokens) std::cout << t << ' ';
      }
      std::cout << "\n";
    } else {
      std::cout << "\n";
    }
  }
  std::cout.flush();
  // A request that failed while running (a prompt or generation past --ctx-size, a --save-state that could not be
  // written, a model producing NaN) ends as "cancelled" with its error: the command fails, naming the prompt, after
  // printing what the others produced.
  std::string errors;
  size_t n_failed = 0;
  for (size_t i = 0; i < results.size(); ++i)
    if (!results[i].error.empty() && n_failed++ == 0)
      errors = (results.size() > 1 ? "prompt " + std::to_string(i) + ": " : std::string()) + results[i].error;
  if (n_failed > 1) errors += " (and " + std::to_string(n_failed - 1) + " more prompts failed)";
  if (!o.json) {
    size_t prompt_tokens = 0, gen_tokens = 0;
    double gen_ms = 0;
    for (size_t i = 0; i < results.size(); ++i) {
      prompt_tokens += prompts[i].size();
      gen_tokens += results[i].tokens.size();
      gen_ms = std::max(gen_ms, results[i].timings.generate_ms);
    }
    const double prompt_ms = results[0].timings.prompt_ms;
    std::fprintf(stderr, "\nprompt: %zu tokens in %.1f ms (%.1f tokens/s); generation: %zu tokens in %.1f ms (%.1f tokens/s) on %s\n",
                 prompt_tokens, prompt_ms, prompt_ms > 0 ? prompt_tokens / (prompt_ms / 1000) : 0.0, gen_tokens, gen_ms,
                 gen_ms > 0 ? gen_tokens / (gen_ms / 1000) : 0.0, model->device_description().c_str());
    int64_t drafted = 0, accepted = 0;
    for (const GenerateResult& r : results) drafted += r.draft_tokens, accepted += r.accepted_draft_tokens;
    if (o.speculative.params().enabled())
      std::fprintf(stderr, "speculative: %lld drafted tokens, %lld accepted (%.1f%%)\n", static_cast<long long>(drafted),
                   static_cast<long long>(accepted), drafted > 0 ? 100.0 * accepted / drafted : 0.0);
  }
  if (n_failed > 0) fail(errors);
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, std::function<void()>& run) {
  auto o = std::make_shared<GenerateCliOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt (streamed to stdout)");
  add_model_options(*cmd, o->model);
  add_speculative_options(*cmd, o->speculative);
  cmd->add_option_function<std::string>("-p,--prompt", [o](const std::string& p) { o->prompt = p, o->prompt_given = true; },
                                        "prompt text");
  cmd->add_option("--tokens-file", o->tokens_files, "prompt as token ids (spaces or commas); repeated: one prompt per file, run as one batch");
  cmd->add_option("--prompts-file", o->prompts_file, "one prompt per line, run as one batch");
  cmd->add_option("-n,--n-predict", o->n_predict, "new tokens to generate at most")->check(IntRange(0, kMaxCliCount))->capture_default_str();
  cmd->add_option("--temp", o->sampling.temperature, "temperature; 0 = greedy")->check(FiniteRange(0, 1e6))->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "top-k (0 = off)")->check(IntRange(0, kMaxCliCount))->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "top-p (1 = off)")->check(FiniteRange(0, 1))->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "min-p (0 = off)")->check(FiniteRange(0, 1))->capture_default_str();
  cmd->add_option("--repeat-penalty", o->sampling.repeat_penalty, "repetition penalty (1 = off)")
      ->check(FiniteRange(1e-6, 1e6))->capture_default_str();
  cmd->add_option("--repeat-last-n", o->sampling.repeat_last_n, "tokens the penalty looks back over")
      ->check(IntRange(0, kMaxCliCount))->capture_default_str();
  cmd->add_option("-s,--seed", o->seed, "random seed (default: random; batch member i uses seed + i)")
      ->check(IntRange(0, INT64_MAX));
  cmd->add_option("--stop", o->stop, "stop string (repeatable)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "do not stop at the end-of-sequence token");
  cmd->add_option("--max-prompt", o->max_prompt, "refuse prompts longer than this many tokens")
      ->check(IntRange(1, kMaxCliCount))->capture_default_str();
  cmd->add_option("--max-seqs", o->max_seqs, "prompts running at once (0: all of them, at most 64; the rest wait)")
      ->check(IntRange(0, INT64_MAX));  // bounded by the prompts, then by the memory
  cmd->add_option("--state-cache-mb", o->state_cache_mb, "prefix cache of sequence states, MiB (0: off)")
      ->check(IntRange(0, kMaxStateCacheMb))->capture_default_str();
  CLI::Option* cache_dir = cmd->add_option(
      "--state-cache-dir", o->state_cache_dir,
      "keep the prefix cache's states in this directory too: a later run with the same directory prefills only what "
      "they do not cover");
  cmd->add_option("--state-cache-disk-mb", o->state_cache_disk_mb,
                  "the disk tier's budget, MiB (with --state-cache-dir)")
      ->check(IntRange(1, kMaxStateCacheMb))->capture_default_str()->needs(cache_dir);
  cmd->add_option("--state-checkpoint-interval", o->checkpoint_interval,
                  "prompt positions (multiples of this) whose state is cached; 0: none")
      ->check(IntRange(0, kMaxCliCount))->capture_default_str();
  cmd->add_option("--load-state", o->load_state, "state file to continue from (a prompt that begins with its tokens prefills only the rest)");
  cmd->add_option("--save-state", o->save_state, "write the state at the end of the generation to this file");
  cmd->add_flag("--json", o->json, "print one JSON object per prompt instead of streaming text");
  cmd->add_option("--grammar", o->grammar_file, "a GBNF grammar file the output follows (llama.cpp's format)");
  cmd->add_option("--json-schema", o->json_schema,
                  "a JSON schema (inline, or a file) the output validates against (docs/server.md lists the subset)");
  cmd->add_flag("--chat", o->chat, "the prompt is a chat turn, rendered with the model's chat template");
  cmd->add_option("--system", o->system, "with --chat: a system message before the prompt");
  cmd->add_option("--chat-file", o->chat_file,
                  "with --chat: a JSON chat body (messages, tools, chat_template_kwargs) or an array of messages");
  cmd->add_option("--chat-kwargs", o->chat_kwargs,
                  "with --chat: template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
  cmd->add_option("--chat-template", o->chat_template, "with --chat: auto (the model's), chatml, or a Jinja file")
      ->check(CLI::IsMember({"auto", "chatml"}) | CLI::ExistingFile)
      ->capture_default_str();
  cmd->callback([o, &run] { run = [o] { run_generate(*o); }; });
  return cmd;
}

}  // namespace mambacpp::cli
