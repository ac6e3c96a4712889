// JSON that comes from outside the process (file headers, manifests, configs, HTTP answers):
// parsed with the limits every reader of it needs.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mx {

// Objects and arrays may nest this deep, no deeper (real inputs nest 4 levels at most).
constexpr int kMaxJsonDepth = 64;

// Parses `text` as one JSON value. On failure returns a discarded value and sets *why to a
// phrase that follows the input's name: "is not valid JSON", "nests objects or arrays deeper
// than 64 levels" (a copy, comparison or dump() of a value recurses once a level: a 100000-deep
// array in a safetensors header overflowed the stack), "has the key \"k\" twice in one object"
// (the parser keeps the last one: a header naming a tensor twice lost the first silently, where
// the safetensors library refuses it), or "contains a NUL byte" (the parser stops reading there,
// so what followed was never checked). A NUL written as \u0000 inside a string is JSON (a
// safetensors header's metadata may hold one); readers that turn strings into paths or config
// values refuse it themselves (SageMaker's hyperparameters, the config's --set and TOML).
nlohmann::json parse_json_input(std::string_view text, std::string* why);

// A value as an error message shows it: numbers, booleans and null as JSON, strings quoted and
// cut at 64 bytes, arrays and objects by their kind ("an array of 3", "an object"), so a
// message stays one short line whatever the input held.
std::string json_excerpt(const nlohmann::json& value);

}  // namespace mx
