// Constrained generation: a request's text follows a GBNF grammar (GenerateRequest::grammar, llama.cpp's format:
// src/engine/grammar.h), which a JSON schema compiles to. Tokens the grammar rejects are masked out before sampling,
// and the end-of-sequence token is allowed only where the grammar's text is complete.
#pragma once

#include <string>
#include <string_view>

namespace mambacpp {

// Throws Error "grammar line L, column C: ..." (or naming the rule) when `gbnf` is not a usable grammar.
void check_grammar(std::string_view gbnf);

// A grammar of any JSON object (OpenAI's response_format {"type": "json_object"}).
std::string json_object_grammar();

// A grammar whose sentences are JSON texts that validate against `schema_json` (a JSON schema). The supported
// subset: type (one or a list) object/array/string/number/integer/boolean/null, properties, required,
// additionalProperties (false, true or a schema; with properties no extra keys are generated), items, minItems,
// maxItems, minLength, maxLength, enum, const, anyOf, oneOf (as anyOf: alternatives that overlap both match),
// allOf with one member, $ref to #/$defs/... or #/definitions/..., and the annotations title, description,
// examples, default, $schema, $id, $comment. Objects list their properties in the schema's order, without extra
// keys unless the schema has no properties. Throws Error naming the keyword (and where it is) for anything else.
std::string json_schema_to_grammar(std::string_view schema_json);

}  // namespace mambacpp
