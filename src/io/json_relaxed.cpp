// Relaxed JSON parsing: a small scanner rewrites bare Infinity/-Infinity/NaN tokens (never inside string literals)
// into marker strings that nlohmann accepts, then a walk over the parsed tree turns the markers and transformers 5's
// {"__float__": "..."} objects into doubles. Error positions are mapped back to the caller's text.
#include "io/json_relaxed.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "mambacpp/error.h"
#include "core/file_bytes.h"
#include "core/json_limits.h"

namespace mambacpp {
namespace {

// One replaced token: `in_len` bytes at `in_begin` of the original became `out_len` bytes at `out_begin`.
struct Edit {
  size_t in_begin, in_len, out_begin, out_len;
};

struct Rewritten {
  std::string text;
  std::vector<Edit> edits;
  std::string marker;  // the decoded prefix of every marker string
};

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

double nonfinite_value(const std::string& word) {
  if (word == "Infinity") return std::numeric_limits<double>::infinity();
  if (word == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::numeric_limits<double>::quiet_NaN();  // "NaN"
}

Rewritten rewrite_nonfinite_tokens(const std::string& in) {
  // The marker starts with U+0001, which JSON can only spell as the escape \u0001 inside a string; a salt makes
  // it distinct from anything the input spells that way.
  std::string escaped;
  for (int salt = 0;; ++salt) {
    escaped = "\\u0001mambacpp" + std::to_string(salt) + ":";
    if (in.find(escaped) == std::string::npos) break;
  }
  Rewritten out;
  out.marker = "\x01mambacpp" + escaped.substr(14);
  out.text.reserve(in.size() + 64);
  size_t i = 0;
  const size_t n = in.size();
  while (i < n) {
    const char c = in[i];
    if (c == '"') {  // copy a string literal verbatim, honouring escapes
      size_t j = i + 1;
      while (j < n && in[j] != '"') j += (in[j] == '\\') ? 2 : 1;
      j = std::min(j + 1, n);
      out.text.append(in, i, j - i);
      i = j;
      continue;
    }
    const bool word_start = std::isalpha(static_cast<unsigned char>(c)) ||
                            (c == '-' && i + 1 < n && std::isalpha(static_cast<unsigned char>(in[i + 1])));
    if (!word_start) {
      out.text.push_back(c);
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < n && is_word_char(in[j])) ++j;
    const std::string word = in.substr(i, j - i);
    if (word == "Infinity" || word == "-Infinity" || word == "NaN") {
      const std::string replacement = "\"" + escaped + word + "\"";
      out.edits.push_back({i, word.size(), out.text.size(), replacement.size()});
      out.text += replacement;
    } else {
      out.text += word;  // true/false/null, or garbage that nlohmann will report
    }
    i = j;
  }
  return out;
}

// Maps a byte position in the rewritten text back to the original text.
size_t original_position(const std::vector<Edit>& edits, size_t pos) {
  long long shift = 0;
  for (const Edit& e : edits) {
    if (pos < e.out_begin) break;
    if (pos < e.out_begin + e.out_len) return e.in_begin;
    shift += static_cast<long long>(e.out_len) - static_cast<long long>(e.in_len);
  }
  return static_cast<size_t>(static_cast<long long>(pos) - shift);
}

void fold_nonfinite(nlohmann::json& j, const std::string& marker, const std::string& source) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    if (s.compare(0, marker.size(), marker) == 0) j = nonfinite_value(s.substr(marker.size()));
  } else if (j.is_object()) {
    if (j.size() == 1 && j.contains("__float__")) {
      const nlohmann::json& v = j["__float__"];
      const std::string word = v.is_string() ? v.get<std::string>() : std::string();
      if (word != "Infinity" && word != "-Infinity" && word != "NaN")
        fail(source, ": {\"__float__\": ", json_excerpt(v), "}: expected \"Infinity\", \"-Infinity\" or \"NaN\"");
      j = nonfinite_value(word);
      return;
    }
    for (auto& [key, value] : j.items()) fold_nonfinite(value, marker, source);
  } else if (j.is_array()) {
    for (auto& value : j) fold_nonfinite(value, marker, source);
  }
}

}  // namespace

nlohmann::json parse_json_relaxed(const std::string& text, const std::string& source) {
  check_json_depth(text, source);  // the rewrite keeps every bracket, and fold_nonfinite recurses per level
  Rewritten rw = rewrite_nonfinite_tokens(text);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(rw.text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts the bytes read, so the offending byte sits at index byte - 1.
    const size_t at = e.byte > 0 ? original_position(rw.edits, e.byte - 1) : 0;
    // Keep nlohmann's description but drop its "parse error at line L, column C: " prefix: those count positions
    // in the rewritten text.
    const std::string what = e.what();
    const size_t column = what.find("column ");
    const size_t colon = column == std::string::npos ? std::string::npos : what.find(": ", column);
    fail(source, ": invalid JSON at byte ", at, ": ", colon == std::string::npos ? what : what.substr(colon + 2));
  } catch (const nlohmann::json::exception& e) {  // out_of_range: a number that overflows a double (1e705)
    fail(source, ": invalid JSON: ", e.what());
  }
  fold_nonfinite(j, rw.marker, source);
  return j;
}

nlohmann::json read_json_file_relaxed(const std::string& path) {
  return parse_json_relaxed(read_file_bytes(path, "JSON file"), path);
}

}  // namespace mambacpp
