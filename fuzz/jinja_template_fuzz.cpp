// The chat template interpreter (src/chat): any text is parsed as a template and, when it parses, rendered over a
// conversation that exercises every variable the real templates read (system, user, assistant with tool calls,
// tool results, content parts, tools, enable_thinking). Any input gives output within the limits or a
// mambacpp::Error; a crash, a sanitizer report, a hang or another exception is a bug.
#include <string>

#include "fuzz_target.h"
#include "mambacpp/chat.h"

namespace {

const nlohmann::ordered_json& variables() {
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true, "enable_thinking": false,
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, {"type": "image"}]},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21.5}"},
      {"role": "assistant", "content": "<think>ok</think>It is 21.5 °C."}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "documents": null
  })");
  return vars;
}

}  // namespace

MAMBACPP_FUZZ_TARGET(jinja_template) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  const mambacpp::chat::Template tmpl(source);
  mambacpp::chat::RenderLimits limits;
  limits.max_work = 100000;  // small budgets: a hostile loop ends quickly, and hangs stay findings
  limits.max_output_bytes = 1 << 20;
  limits.max_call_depth = 32;
  const std::string out = tmpl.render(variables(), limits);
  MAMBACPP_FUZZ_CHECK(out.size() <= limits.max_output_bytes);
}
