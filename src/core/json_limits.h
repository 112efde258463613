// Limits every JSON reader of the project applies (config.json, the safetensors header, tokenizer.json, the index
// file, server request bodies). nlohmann's parser and destructor are iterative, but copies, dumps, comparisons and
// our own walks recurse once per nesting level: a document nested a million levels deep would overflow the stack.
// No real file nests deeper than about ten levels, so the depth is bounded before nlohmann sees the text, and every
// nlohmann exception (number overflow such as 1e705 included) becomes a mambacpp::Error naming the source.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "mambacpp/error.h"

namespace mambacpp {

constexpr int kMaxJsonDepth = 256;

// Fails when arrays/objects nest deeper than kMaxJsonDepth. Brackets inside string literals do not count; for valid
// JSON the scan is exact, for invalid JSON it only over-counts past the point where nlohmann stops anyway.
inline void check_json_depth(std::string_view text, const std::string& source) {
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        fail(source, ": JSON nested deeper than ", kMaxJsonDepth, " levels at byte ", i,
             ": expected at most ", kMaxJsonDepth, " nested arrays/objects");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// Strict JSON with the depth bound; any nlohmann exception becomes an Error "<source>: invalid JSON ...".
inline nlohmann::json parse_json_bounded(std::string_view text, const std::string& source) {
  check_json_depth(text, source);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(source, ": invalid JSON at byte ", e.byte, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {  // out_of_range: a number that overflows a double (1e705)
    fail(source, ": invalid JSON: ", e.what());
  }
}

// A value for an error message: its JSON text, cut to `max_chars` so that a huge value cannot make a huge message.
inline std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 200) {
  if (v.is_number_float() && !std::isfinite(v.get<double>()))  // dump() writes null for these
    return std::isnan(v.get<double>()) ? "NaN" : (v.get<double>() > 0 ? "Infinity" : "-Infinity");
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "... (" + std::to_string(s.size()) + " bytes)";
  return s;
}

}  // namespace mambacpp
