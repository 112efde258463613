// JSON as Python writes it: json.dump emits bare Infinity, -Infinity and NaN for non-finite floats, and
// transformers 5 writes them as {"__float__": "Infinity"}. nlohmann::json accepts neither, so this parser rewrites
// the bare tokens (outside string literals only) before parsing and folds the __float__ objects afterwards.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace mambacpp {

// Parses `text`; bare Infinity/-Infinity/NaN and {"__float__": "..."} objects become float values.
// Strings that merely contain those words are left as they are. Throws mambacpp::Error naming `source` and the
// byte position (in `text`) on malformed input.
nlohmann::json parse_json_relaxed(const std::string& text, const std::string& source);

// Reads a whole file and parses it with parse_json_relaxed; a missing or unreadable file is an Error naming it.
nlohmann::json read_json_file_relaxed(const std::string& path);

}  // namespace mambacpp
