#include "core/json_input.h"

#include <set>
#include <vector>

#include "core/error.h"

namespace mx {

namespace {
struct Refused {
  std::string why;
};

std::string quoted_excerpt(const std::string& key) {
  constexpr size_t kMax = 64;
  const std::string shown = key.size() > kMax ? key.substr(0, kMax) + "..." : key;
  // A string's dump() escapes quotes and control bytes; invalid UTF-8 is replaced.
  return nlohmann::json(shown).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
}  // namespace

std::string json_excerpt(const nlohmann::json& value) {
  if (value.is_string()) return quoted_excerpt(value.get_ref<const std::string&>());
  if (value.is_array()) return str("an array of ", value.size());
  if (value.is_object()) return str("an object of ", value.size(), " keys");
  return value.dump();
}

nlohmann::json parse_json_input(std::string_view text, std::string* why) {
  using Json = nlohmann::json;
  using Event = Json::parse_event_t;
  const Json discarded(Json::value_t::discarded);
  if (text.find('\0') != std::string_view::npos) {
    *why = "contains a NUL byte";
    return discarded;
  }
  std::vector<std::set<std::string>> keys;  // one set per object open around the parser
  auto check = [&keys](int depth, Event event, Json& parsed) -> bool {
    if (depth > kMaxJsonDepth)
      throw Refused{str("nests objects or arrays deeper than ", kMaxJsonDepth, " levels")};
    switch (event) {
      case Event::object_start: keys.emplace_back(); break;
      case Event::object_end: if (!keys.empty()) keys.pop_back(); break;
      case Event::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys.empty() && !keys.back().insert(key).second)
          throw Refused{str("has the key ", quoted_excerpt(key), " twice in one object")};
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    Json j = Json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/false);
    if (j.is_discarded()) *why = "is not valid JSON";
    return j;
  } catch (const Refused& r) {
    *why = r.why;
    return discarded;
  }
}

}  // namespace mx
