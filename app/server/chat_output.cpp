#include "server/chat_output.h"

#include <algorithm>

namespace mambacpp::server {

namespace {

constexpr const char* kThinkOpen = "<think>";
constexpr const char* kThinkClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag` (text that may become the tag).
size_t partial_tag(const std::string& text, const std::string& tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, tag, 0, n) == 0) return n;
  return 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string trim_newlines(const std::string& s) {
  size_t b = 0, e = s.size();
  if (b < e && s[b] == '\n') ++b;
  if (e > b && s[e - 1] == '\n') --e;
  return s.substr(b, e - b);
}

// Nemotron 3's (and Qwen3-Coder's) call: <function=NAME><parameter=KEY>VALUE</parameter>...</function>. A value
// that is JSON (a number, an object...) is taken as such, else as a string. Null when the block is not one.
nlohmann::ordered_json xml_function_call(const std::string& block) {
  const size_t f = block.find("<function=");
  if (f == std::string::npos) return nullptr;
  const size_t name_end = block.find('>', f);
  if (name_end == std::string::npos || block.find("</function>", name_end) == std::string::npos) return nullptr;
  nlohmann::ordered_json call = {{"name", block.substr(f + 10, name_end - f - 10)},
                                 {"arguments", nlohmann::ordered_json::object()}};
  size_t at = name_end;
  while (true) {
    const size_t p = block.find("<parameter=", at);
    if (p == std::string::npos) break;
    const size_t key_end = block.find('>', p);
    const size_t close = key_end == std::string::npos ? key_end : block.find("</parameter>", key_end);
    if (close == std::string::npos) return nullptr;
    const std::string value = trim_newlines(block.substr(key_end + 1, close - key_end - 1));
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
    call["arguments"][block.substr(p + 11, key_end - p - 11)] = v.is_discarded() ? nlohmann::ordered_json(value) : v;
    at = close + 12;
  }
  return call;
}

}  // namespace

ChatOutputFormat chat_output_format(const std::string& source, const std::string& prompt, bool tools_offered) {
  ChatOutputFormat f;
  f.reasoning = source.find(kThinkOpen) != std::string::npos;
  if (f.reasoning) {
    std::string tail = prompt;
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    f.starts_in_reasoning = ends_with(tail, kThinkOpen);
  }
  if (tools_offered) {
    if (source.find("<TOOLCALL>") != std::string::npos) {
      f.call_open = "<TOOLCALL>";
      f.call_close = "</TOOLCALL>";
      f.call_list = true;
    } else if (source.find("<tool_calls>") != std::string::npos) {  // Jamba: <tool_calls>[{name, arguments}, ...]
      f.call_open = "<tool_calls>";
      f.call_close = "</tool_calls>";
      f.call_list = true;
    } else if (source.find("<tool_call>") != std::string::npos) {
      f.call_open = "<tool_call>";
      f.call_close = "</tool_call>";
    }
  }
  return f;
}

ChatOutputParser::ChatOutputParser(ChatOutputFormat format, std::string id_prefix)
    : format_(std::move(format)), id_prefix_(std::move(id_prefix)) {
  if (format_.starts_in_reasoning) mode_ = Mode::Reasoning;
}

void ChatOutputParser::emit(ChatDelta& d, const std::string& text) const {
  (mode_ == Mode::Reasoning ? d.reasoning : d.content) += text;
}

void ChatOutputParser::parse_calls(ChatDelta& d, const std::string& block) {
  // Ordered: the arguments go back to the client in the order the model wrote them.
  nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(block, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) parsed = xml_function_call(block);
  std::vector<nlohmann::ordered_json> calls;
  if (parsed.is_array())
    calls.assign(parsed.begin(), parsed.end());
  else if (parsed.is_object())
    calls.push_back(parsed);
  bool ok = !calls.empty();
  for (const auto& c : calls) ok = ok && c.is_object() && c.contains("name") && c["name"].is_string();
  if (!ok) {  // not a call the API can express: the model's text stays content
    d.content += format_.call_open + block + format_.call_close;
    return;
  }
  for (const auto& c : calls) {
    const nlohmann::ordered_json args = c.contains("arguments")    ? c["arguments"]
                                        : c.contains("parameters") ? c["parameters"]
                                                                   : nlohmann::ordered_json::object();
    const std::string arguments = args.is_string() ? args.get<std::string>() : args.dump();
    d.tool_calls.push_back({{"index", calls_},
                            {"id", id_prefix_ + std::to_string(calls_)},
                            {"type", "function"},
                            {"function", {{"name", c["name"].get<std::string>()}, {"arguments", arguments}}}});
    ++calls_;
  }
}

ChatDelta ChatOutputParser::feed(const std::string& text) {
  ChatDelta d;
  held_ += text;
  while (!held_.empty()) {
    if (mode_ == Mode::ToolCall) {
      const size_t close = held_.find(format_.call_close);
      if (close == std::string::npos) break;  // wait for the rest of the block
      parse_calls(d, held_.substr(0, close));
      held_.erase(0, close + format_.call_close.size());
      mode_ = Mode::Content;
      continue;
    }
    // The tags that end this mode's text.
    std::vector<std::string> tags;
    if (mode_ == Mode::Reasoning) {
      tags.push_back(kThinkClose);
    } else {
      if (format_.reasoning) tags.push_back(kThinkOpen);
      if (!format_.call_open.empty()) tags.push_back(format_.call_open);
    }
    size_t first = std::string::npos;
    std::string tag;
    for (const std::string& t : tags) {
      const size_t at = held_.find(t);
      if (at < first) first = at, tag = t;
    }
    if (first == std::string::npos) {
      size_t keep = 0;
      for (const std::string& t : tags) keep = std::max(keep, partial_tag(held_, t));
      emit(d, held_.substr(0, held_.size() - keep));
      held_.erase(0, held_.size() - keep);
      break;
    }
    emit(d, held_.substr(0, first));
    held_.erase(0, first + tag.size());
    if (tag == kThinkOpen) mode_ = Mode::Reasoning;
    else if (tag == kThinkClose) mode_ = Mode::Content;
    else mode_ = Mode::ToolCall;
  }
  return d;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta d;
  if (mode_ == Mode::ToolCall) {
    // An unclosed block (the answer hit max_tokens): the text as the model wrote it.
    d.content += format_.call_open + held_;
  } else {
    emit(d, held_);
  }
  held_.clear();
  return d;
}

nlohmann::json chat_message(const ChatOutputFormat& format, const std::string& text, const std::string& id_prefix) {
  ChatOutputParser parser(format, id_prefix);
  ChatDelta all = parser.feed(text);
  ChatDelta rest = parser.finish();
  all.content += rest.content;
  all.reasoning += rest.reasoning;
  for (auto& c : rest.tool_calls) all.tool_calls.push_back(c);
  // Whitespace around tags is the template's layout, not the answer.
  const auto trim = [](std::string s) {
    const size_t b = s.find_first_not_of(" \n\t\r");
    if (b == std::string::npos) return std::string();
    return s.substr(b, s.find_last_not_of(" \n\t\r") - b + 1);
  };
  nlohmann::json m = {{"role", "assistant"}};
  const std::string content = all.tool_calls.empty() ? all.content : trim(all.content);
  m["content"] = content.empty() && !all.tool_calls.empty() ? nlohmann::json(nullptr) : nlohmann::json(content);
  if (format.reasoning) {
    const std::string reasoning = trim(all.reasoning);
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    if (!all.tool_calls.empty() || !reasoning.empty()) m["content"] = content.empty() && !all.tool_calls.empty() ? nlohmann::json(nullptr) : nlohmann::json(trim(content));
  }
  if (!all.tool_calls.empty()) {
    for (auto& c : all.tool_calls) c.erase("index");
    m["tool_calls"] = all.tool_calls;
  }
  return m;
}

}  // namespace mambacpp::server
