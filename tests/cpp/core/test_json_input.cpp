// parse_json_input's limits (depth, duplicate keys, NUL bytes) and one_line's escaping, against
// inputs built here whose verdicts follow from the rules themselves.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "core/error.h"
#include "core/json_input.h"

namespace {

std::string nested(int depth) {
  return std::string(size_t(depth), '[') + std::string(size_t(depth), ']');
}

TEST(JsonInput, ParsesOrdinaryJson) {
  std::string why;
  const auto j = mx::parse_json_input(R"({"a": [1, {"b": "x"}], "c": {"a": 2}})", &why);
  ASSERT_FALSE(j.is_discarded()) << why;
  EXPECT_EQ(j["a"][1]["b"], "x");
  EXPECT_EQ(j["c"]["a"], 2);  // the same key in two different objects is fine
}

TEST(JsonInput, DepthLimitIsExact) {
  std::string why;
  // nested(n) opens n arrays, n levels: kMaxJsonDepth of them are allowed, one more is not
  EXPECT_FALSE(mx::parse_json_input(nested(mx::kMaxJsonDepth), &why).is_discarded()) << why;
  EXPECT_TRUE(mx::parse_json_input(nested(mx::kMaxJsonDepth + 1), &why).is_discarded());
  EXPECT_NE(why.find("deeper than 64"), std::string::npos) << why;
  why.clear();
  EXPECT_TRUE(mx::parse_json_input("{\"a\": " + nested(mx::kMaxJsonDepth) + "}", &why)
                  .is_discarded());
  EXPECT_NE(why.find("deeper than 64"), std::string::npos) << why;
  why.clear();
  EXPECT_TRUE(mx::parse_json_input(nested(200000), &why).is_discarded());  // no stack overflow
  EXPECT_NE(why.find("deeper"), std::string::npos) << why;
}

// A 1.4 MB safetensors-like header of 40000 empty entries, and an array of 200000 empty
// objects: the checks ran in a parse callback, which nlohmann's callback parser answers with a
// walk of the enclosing container at every object's end (quadratic: 80000 entries took 254 s).
// Linear, each parses in well under a second; the bound here is loose (a loaded CI machine).
TEST(JsonInput, ManyEntriesParseInLinearTime) {
  std::string header = "{";
  for (int i = 0; i < 40000; ++i)
    header += (i ? "," : "") + std::string("\"t") + std::to_string(i) +
              "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  header += "}";
  std::string objects = "[";
  for (int i = 0; i < 200000; ++i) objects += i ? ",{}" : "{}";
  objects += "]";
  for (const std::string* text : {&header, &objects}) {
    std::string why;
    const auto t0 = std::chrono::steady_clock::now();
    const auto j = mx::parse_json_input(*text, &why);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(j.is_discarded()) << why;
    EXPECT_EQ(j.size(), text == &header ? 40000u : 200000u);
    EXPECT_LT(s, 5.0) << text->size() << " bytes";
  }
}

TEST(JsonInput, DuplicateKeyInOneObjectIsRefused) {
  std::string why;
  EXPECT_TRUE(mx::parse_json_input(R"({"w": 1, "v": {"w": 3}, "w": 2})", &why).is_discarded());
  EXPECT_EQ(why, R"(has the key "w" twice in one object)");
  EXPECT_TRUE(mx::parse_json_input(R"({"o": {"k": 1, "k": 1}})", &why).is_discarded());
  EXPECT_EQ(why, R"(has the key "k" twice in one object)");
}

TEST(JsonInput, NulByteAndSyntaxErrors) {
  std::string why;
  const std::string with_nul("{\"a\": 1}\0garbage", 16);
  EXPECT_TRUE(mx::parse_json_input(with_nul, &why).is_discarded());
  EXPECT_EQ(why, "contains a NUL byte");
  EXPECT_TRUE(mx::parse_json_input("{\"a\": ", &why).is_discarded());
  EXPECT_EQ(why, "is not valid JSON");
  EXPECT_TRUE(mx::parse_json_input("{} {}", &why).is_discarded());
}

TEST(OneLine, EscapesControlBytesOnly) {
  EXPECT_EQ(mx::one_line("a\nb\r\tc"), "a\\nb\\r\\tc");
  EXPECT_EQ(mx::one_line(std::string("x\0y\x7f", 4)), "x\\x00y\\x7f");
  EXPECT_EQ(mx::one_line("caf\xc3\xa9 \\n"), "caf\xc3\xa9 \\n");  // UTF-8 and backslashes kept
}

}  // namespace
