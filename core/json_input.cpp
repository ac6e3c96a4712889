#include "core/json_input.h"

#include <set>
#include <vector>

#include "core/error.h"

namespace mx {

namespace {
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

namespace {
// The limits, checked in a SAX pass before the document is built. (A parse callback did this
// before, but nlohmann's callback parser walks the enclosing container at every object's end:
// quadratic, so a 4.6 MB safetensors header of empty entries took 254 s.)
class LimitsChecker : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::string why;  // set when the input is refused, "" when only its syntax is bad

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return deeper();
  }
  bool key(string_t& key) override {
    if (keys_.back().insert(key).second) return true;
    why = str("has the key ", quoted_excerpt(key), " twice in one object");
    return false;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return deeper(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  bool deeper() {
    if (++depth_ <= kMaxJsonDepth) return true;
    why = str("nests objects or arrays deeper than ", kMaxJsonDepth, " levels");
    return false;
  }
  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // one set per object open around the parser
};
}  // namespace

nlohmann::json parse_json_input(std::string_view text, std::string* why) {
  using Json = nlohmann::json;
  const Json discarded(Json::value_t::discarded);
  if (text.find('\0') != std::string_view::npos) {
    *why = "contains a NUL byte";
    return discarded;
  }
  LimitsChecker limits;
  if (!Json::sax_parse(text.begin(), text.end(), &limits, Json::input_format_t::json,
                       /*strict=*/true)) {
    *why = limits.why.empty() ? "is not valid JSON" : limits.why;
    return discarded;
  }
  return Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace mx
