#include "server/completion_request.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "mambacpp/error.h"
#include "mambacpp/grammar.h"
#include "server/api_error.h"

namespace mambacpp::server {

namespace {

using nlohmann::json;

constexpr int kMaxLogprobs = 20;
constexpr size_t kMaxStops = 16;
constexpr int kMaxBodyDepth = 64;  // no OpenAI request nests deeper than about 5 levels

template <class Json>
std::string type_name(const Json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// A value for a message, kept short: a huge value is not echoed back whole.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 64 ? s.substr(0, 61) + "..." : s;
}

template <class T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

bool present(const json& body, const char* name) { return body.contains(name) && !body[name].is_null(); }

// obj[name] when it is a string, else "" (nlohmann's value(name, "") throws its own type_error for a number there).
std::string string_field(const json& obj, const char* name) {
  return obj.is_object() && obj.contains(name) && obj[name].is_string() ? obj[name].get<std::string>() : std::string();
}

double read_number(const json& body, const char* name, double fallback, double lo, double hi) {
  if (!present(body, name)) return fallback;
  const json& v = body[name];
  if (!v.is_number())
    throw bad_request(name, "expected a number in [" + str(lo) + ", " + str(hi) + "], found " + type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_request(name, "expected a number in [" + str(lo) + ", " + str(hi) + "], found " + shown(v));
  return x;
}

// A parameter the server does not implement: accepted only with its neutral value.
void require_neutral(const json& body, const char* name, const json& neutral, const std::string& why) {
  if (!present(body, name)) return;
  if (body[name] == neutral) return;
  if (neutral.is_object() && body[name].is_object() && body[name].empty()) return;
  throw bad_request(name, "only " + neutral.dump() + " is supported, found " + shown(body[name]) + " (" + why + ")");
}

std::vector<std::string> read_stop(const json& body) {
  if (!present(body, "stop")) return {};
  const json& v = body["stop"];
  std::vector<std::string> stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > kMaxStops)
      throw bad_request("stop", "at most " + str(kMaxStops) + " stop strings are accepted, found " + str(v.size()));
    for (const json& s : v) {
      if (!s.is_string())
        throw bad_request("stop", "expected a string or an array of strings, found an array holding " + type_name(s));
      stops.push_back(s.get<std::string>());
    }
  } else {
    throw bad_request("stop", "expected a string or an array of strings, found " + type_name(v));
  }
  for (const std::string& s : stops)
    if (s.empty()) throw bad_request("stop", "a stop string is empty; expected at least one character");
  return stops;
}

std::vector<int32_t> encode_text(const std::string& text, const Tokenizer* tokenizer, const RequestLimits& limits,
                                 const std::string& param) {
  if (!tokenizer)
    throw bad_request(param, "this model has no tokenizer.json, so text cannot be encoded; send token ids instead");
  std::vector<int32_t> ids = tokenizer->encode(text);
  if (ids.empty() && limits.bos_token_id >= 0) ids.push_back(static_cast<int32_t>(limits.bos_token_id));
  return ids;
}

// Speculative decoding's extension fields: draft_ngram (prompt lookup), draft_model (the server's draft model),
// draft_mtp (the model's own multi-token-prediction block), draft_max, draft_adaptive; absent fields keep the
// server's defaults. One source per request: a request naming one turns the other defaults off.
void read_speculative(const json& body, const RequestLimits& limits, SpeculativeParams& sp) {
  sp = limits.speculative;
  const bool ngram_given = present(body, "draft_ngram"), model_given = present(body, "draft_model"),
             mtp_given = present(body, "draft_mtp");
  if (ngram_given) sp.draft_ngram = static_cast<int>(read_int(body, "draft_ngram", 0, 0, 16));
  if (model_given) sp.draft_model = read_bool(body, "draft_model", false);
  if (mtp_given) sp.draft_mtp = read_bool(body, "draft_mtp", false);
  const bool ngram_on = ngram_given && sp.draft_ngram > 0, model_on = model_given && sp.draft_model,
             mtp_on = mtp_given && sp.draft_mtp;
  if (ngram_on && model_on)
    throw bad_request("draft_model", "drafts come from the draft model or from prompt lookup (draft_ngram), not both");
  if (mtp_on && (ngram_on || model_on))
    throw bad_request("draft_mtp", "drafts come from one source: draft_mtp, draft_model or draft_ngram");
  if (ngram_on) sp.draft_model = false, sp.draft_mtp = false;
  if (model_on) {
    if (!limits.draft_model_loaded)
      throw bad_request("draft_model", "the server has no draft model (serve --draft-model DIR)");
    sp.draft_ngram = 0, sp.draft_mtp = false;
  }
  if (mtp_on) {
    if (!limits.draft_mtp_loaded)
      throw bad_request("draft_mtp", "the server did not load the model's multi-token-prediction block (serve --draft-mtp)");
    sp.draft_ngram = 0, sp.draft_model = false;
  }
  sp.draft_max = static_cast<int>(read_int(body, "draft_max", sp.draft_max, 0, 32));
  sp.adaptive = read_bool(body, "draft_adaptive", sp.adaptive);
}

// Structured output: OpenAI's response_format ({"type": "text" | "json_object" | "json_schema"}), llama-server's
// "grammar" (GBNF) and top-level "json_schema"; at most one of them. The result is the request's grammar. `ordered`:
// the same body in the client's key order, where the caller has it (an object's properties are generated in the
// schema's order; without it, in sorted order).
void read_constraint(const json& body, const nlohmann::ordered_json* ordered, GenerateRequest& g) {
  const char* given = nullptr;
  auto from_schema = [&](std::initializer_list<const char*> path, const char* param) {
    std::string text;
    if (ordered) {
      const nlohmann::ordered_json* v = ordered;
      for (const char* key : path) v = &(*v)[key];
      text = v->dump();
    } else {
      const json* v = &body;
      for (const char* key : path) v = &(*v)[key];
      text = v->dump();
    }
    try {
      g.grammar = json_schema_to_grammar(text);
    } catch (const Error& e) {
      throw bad_request(param, e.what());
    }
  };
  if (present(body, "response_format")) {
    const json& rf = body["response_format"];
    if (!rf.is_object()) throw bad_request("response_format", "expected an object, found " + type_name(rf));
    const std::string type = string_field(rf, "type");
    if (type == "json_object") {
      // llama-server also takes a schema here.
      if (present(rf, "schema")) from_schema({"response_format", "schema"}, "response_format");
      else g.grammar = json_object_grammar();
      given = "response_format";
    } else if (type == "json_schema") {
      if (present(rf, "json_schema") && rf["json_schema"].is_object() && present(rf["json_schema"], "schema"))
        from_schema({"response_format", "json_schema", "schema"}, "response_format");
      else if (present(rf, "schema"))
        from_schema({"response_format", "schema"}, "response_format");
      else
        throw bad_request("response_format", "{\"type\": \"json_schema\"} needs \"json_schema\": {\"schema\": {...}}");
      given = "response_format";
    } else if (type != "text") {
      throw bad_request("response_format", "\"type\" must be \"text\", \"json_object\" or \"json_schema\", found " +
                                               shown(rf.value("type", json())));
    }
  }
  if (present(body, "json_schema")) {
    if (given) throw bad_request("json_schema", std::string("cannot be combined with ") + given);
    from_schema({"json_schema"}, "json_schema");
    given = "json_schema";
  }
  if (present(body, "grammar")) {
    if (given) throw bad_request("grammar", std::string("cannot be combined with ") + given);
    if (!body["grammar"].is_string())
      throw bad_request("grammar", "expected a GBNF string, found " + type_name(body["grammar"]));
    g.grammar = body["grammar"].get<std::string>();
    try {
      check_grammar(g.grammar);
    } catch (const Error& e) {
      throw bad_request("grammar", e.what());
    }
  }
}

// Everything /v1/completions and /v1/chat/completions share: length, sampling, stop, stream.
void read_generation(const json& body, const RequestLimits& limits, CompletionRequest& out) {
  if (present(body, "model") && !body["model"].is_string())
    throw bad_request("model", "expected a string, found " + type_name(body["model"]));
  require_neutral(body, "n", 1, "one choice per prompt; send several prompts or several requests");
  require_neutral(body, "logit_bias", json::object(), "logit bias is not implemented");

  GenerateRequest& g = out.base;
  // OpenAI's default for completions is 16 tokens; a chat answer runs until its end of turn, bounded here by 1024
  // (a Mamba model has no context length to stop it).
  const char* length_field =
      out.chat && present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t default_length =
      out.chat ? std::min<int64_t>(limits.max_new_tokens, 1024) : std::min<int64_t>(limits.max_new_tokens, 16);
  g.max_new_tokens = static_cast<int>(read_int(body, length_field, default_length, 0, limits.max_new_tokens));

  // OpenAI's defaults (temperature 1, top_p 1, nothing else), not llama.cpp's.
  SamplingParams& s = g.sampling;
  s.temperature = static_cast<float>(read_number(body, "temperature", 1.0, 0.0, 2.0));
  s.top_p = static_cast<float>(read_number(body, "top_p", 1.0, 0.0, 1.0));
  if (present(body, "top_p") && s.top_p <= 0.0f) throw bad_request("top_p", "expected a number in (0, 1], found 0");
  s.top_k = static_cast<int>(read_int(body, "top_k", 0, 0, limits.vocab_size));
  s.min_p = static_cast<float>(read_number(body, "min_p", 0.0, 0.0, 1.0));
  s.repeat_penalty = static_cast<float>(read_number(body, "repeat_penalty", 1.0, 0.0, 100.0));
  if (present(body, "repeat_penalty") && s.repeat_penalty <= 0.0f)
    throw bad_request("repeat_penalty", "expected a number in (0, 100], found 0");
  s.repeat_last_n = static_cast<int>(read_int(body, "repeat_last_n", 64, 0, limits.max_prompt + limits.max_new_tokens));
  s.presence_penalty = static_cast<float>(read_number(body, "presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = static_cast<float>(read_number(body, "frequency_penalty", 0.0, -2.0, 2.0));
  if (present(body, "seed")) {
    const json& v = body["seed"];
    if (!v.is_number_integer())
      throw bad_request("seed", "expected an integer, found " + (v.is_number() ? shown(v) : type_name(v)));
    s.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
    s.seed_given = true;
  }
  g.stop_strings = read_stop(body);
  g.ignore_eos = read_bool(body, "ignore_eos", false);
  read_speculative(body, limits, g.speculative);

  out.stream = read_bool(body, "stream", false);
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) throw bad_request("stream_options", "expected an object, found " + type_name(so));
    if (!out.stream) throw bad_request("stream_options", "is only allowed with \"stream\": true");
    out.include_usage = read_bool(so, "include_usage", false);
  }
}

}  // namespace

bool read_bool(const json& body, const char* name, bool fallback) {
  if (!present(body, name)) return fallback;
  if (!body[name].is_boolean()) throw bad_request(name, "expected a boolean, found " + type_name(body[name]));
  return body[name].get<bool>();
}

int64_t read_int(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  if (!present(body, name)) return fallback;
  const json& v = body[name];
  const std::string expected = "expected an integer in [" + str(lo) + ", " + str(hi) + "]";
  // 16.0 is accepted as 16: JSON does not tell integers from numbers.
  if (!v.is_number() || (!v.is_number_integer() && std::floor(v.get<double>()) != v.get<double>()))
    throw bad_request(name, expected + ", found " + (v.is_number() ? shown(v) : type_name(v)));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    throw bad_request(name, expected + ", found " + shown(v));
  const double d = v.get<double>();
  if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)))
    throw bad_request(name, expected + ", found " + shown(v));
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d);
}

std::vector<int32_t> read_token_ids(const json& value, const std::string& param, int64_t vocab_size) {
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const json& t = value[i];
    if (!t.is_number_integer())
      throw bad_request(param, "token " + str(i) + ": expected an integer token id, found " +
                                   (t.is_number() ? shown(t) : type_name(t)));
    const bool in_range = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                                                 : t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab_size;
    if (!in_range)
      throw bad_request(
          param, "token " + str(i) + " is " + shown(t) + ", outside the vocabulary [0, " + str(vocab_size) + ")");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

namespace {

template <class Json>
Json parse_bounded(const std::string& body) {
  // Copies, comparisons and dumps of a value recurse once per nesting level: a body nested a million levels deep
  // would overflow the stack later, so the parser refuses it as it reads.
  const typename Json::parser_callback_t bounded = [](int depth, typename Json::parse_event_t, Json&) {
    if (depth > kMaxBodyDepth)
      throw ApiError(400, "the request body nests arrays/objects deeper than " + str(kMaxBodyDepth) +
                              " levels; expected a JSON object of at most that depth");
    return true;
  };
  Json j = Json::parse(body, bounded, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON; expected a JSON object");
  if (!j.is_object()) throw ApiError(400, "the request body is " + type_name(j) + "; expected a JSON object");
  return j;
}

}  // namespace

json parse_json_body(const std::string& body) { return parse_bounded<json>(body); }

nlohmann::ordered_json parse_ordered_json_body(const std::string& body) {
  return parse_bounded<nlohmann::ordered_json>(body);
}

CompletionRequest parse_completion(const json& body, const Tokenizer* tokenizer, const RequestLimits& limits) {
  CompletionRequest out;
  if (!present(body, "prompt"))
    throw bad_request("prompt", "missing; expected a string, an array of strings or an array of token ids");
  const json& p = body["prompt"];
  const std::string expected = "expected a string, an array of strings, an array of token ids or an array of those";
  if (p.is_string()) {
    out.prompts.push_back(encode_text(p.get<std::string>(), tokenizer, limits, "prompt"));
  } else if (p.is_array()) {
    if (p.empty()) throw bad_request("prompt", "is an empty array; " + expected);
    if (p[0].is_number()) {
      out.prompts.push_back(read_token_ids(p, "prompt", limits.vocab_size));
    } else {
      if (static_cast<int64_t>(p.size()) > limits.max_prompts)
        throw bad_request("prompt", "holds " + str(p.size()) + " prompts; at most " + str(limits.max_prompts) +
                                        " are accepted in one request");
      for (size_t i = 0; i < p.size(); ++i) {
        const std::string param = "prompt[" + str(i) + "]";
        if (p[i].is_string()) {
          out.prompts.push_back(encode_text(p[i].get<std::string>(), tokenizer, limits, param));
        } else if (p[i].is_array() && !p[i].empty()) {
          out.prompts.push_back(read_token_ids(p[i], param, limits.vocab_size));
        } else {
          throw bad_request(param, "expected a string or a non-empty array of token ids, found " +
                                       (p[i].is_array() ? std::string("an empty array") : type_name(p[i])));
        }
      }
    }
  } else {
    throw bad_request("prompt", expected + ", found " + type_name(p));
  }
  for (size_t i = 0; i < out.prompts.size(); ++i) {
    const std::string param = out.prompts.size() > 1 ? "prompt[" + str(i) + "]" : "prompt";
    if (out.prompts[i].empty())
      throw bad_request(param,
                        "is empty after tokenization and the model has no BOS token; expected at least one token");
    if (static_cast<int64_t>(out.prompts[i].size()) > limits.max_prompt)
      throw bad_request(param, "has " + str(out.prompts[i].size()) + " tokens, more than the limit of " +
                                   str(limits.max_prompt) + " (the server's --max-prompt)");
  }

  require_neutral(body, "best_of", 1, "one sample per choice");
  require_neutral(body, "echo", false, "the prompt is not repeated in the answer");
  if (present(body, "suffix") && !(body["suffix"].is_string() && body["suffix"].get<std::string>().empty()))
    throw bad_request("suffix",
                      "only null or \"\" is supported, found " + shown(body["suffix"]) + " (no insertion mode)");
  read_generation(body, limits, out);
  read_constraint(body, nullptr, out.base);
  out.base.logprobs = static_cast<int>(read_int(body, "logprobs", -1, 0, kMaxLogprobs));
  return out;
}

CompletionRequest parse_completion(const nlohmann::ordered_json& body, const Tokenizer* tokenizer,
                                   const RequestLimits& limits) {
  CompletionRequest out = parse_completion(json(body), tokenizer, limits);
  read_constraint(json(body), &body, out.base);  // again, with the schema's own key order
  return out;
}

std::string render_chat_prompt(const nlohmann::ordered_json& body, const ChatTemplate* chat_template) {
  if (!chat_template)
    throw ApiError(400,
                   "this model has no chat template, so chat messages cannot be turned into a prompt; use "
                   "/v1/completions, or start the server with --chat-template chatml (or a template file)",
                   "messages");
  const chat::Conversation conversation = conversation_from_request(body);
  try {
    return chat_template->render(conversation);
  } catch (const Error& e) {
    // The template raised (raise_exception: its own message, e.g. roles that do not alternate) or failed.
    throw ApiError(400, std::string("the chat template refused the conversation: ") + e.what(), "messages");
  }
}

CompletionRequest parse_chat_completion(const nlohmann::ordered_json& ordered_body, const Tokenizer* tokenizer,
                                        const ChatTemplate* chat_template, const RequestLimits& limits) {
  const std::string prompt = render_chat_prompt(ordered_body, chat_template);
  const json body = ordered_body;
  CompletionRequest out;
  out.chat = true;

  out.prompts.push_back(encode_text(prompt, tokenizer, limits, "messages"));
  if (static_cast<int64_t>(out.prompts[0].size()) > limits.max_prompt)
    throw bad_request("messages", "make a prompt of " + str(out.prompts[0].size()) +
                                      " tokens, more than the limit of " + str(limits.max_prompt) +
                                      " (the server's --max-prompt)");
  read_generation(body, limits, out);
  read_constraint(body, &ordered_body, out.base);
  for (const std::string& s : chat_template->stop_strings) out.base.stop_strings.push_back(s);
  const bool tools_offered = present(body, "tools") && body["tools"].is_array() && !body["tools"].empty() &&
                             !(present(body, "tool_choice") && body["tool_choice"] == "none");
  out.output = chat_output_format(chat_template->tmpl->source(), prompt, tools_offered);
  // Chat's logprobs: a boolean, and top_logprobs alternatives.
  if (read_bool(body, "logprobs", false)) {
    out.base.logprobs = static_cast<int>(read_int(body, "top_logprobs", 0, 0, kMaxLogprobs));
  } else if (present(body, "top_logprobs")) {
    throw bad_request("top_logprobs", "needs \"logprobs\": true");
  }
  return out;
}

}  // namespace mambacpp::server
