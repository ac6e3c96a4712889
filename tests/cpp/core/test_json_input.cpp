// parse_json_input's limits (depth, duplicate keys, NUL bytes) and one_line's escaping, against
// inputs built here whose verdicts follow from the rules themselves.
#include <gtest/gtest.h>

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
  // nested(n) opens n arrays; the parser reports depth n - 1 for the innermost's events
  // (the outermost is depth 0), so exactly kMaxJsonDepth + 1 levels are allowed.
  EXPECT_FALSE(mx::parse_json_input(nested(mx::kMaxJsonDepth + 1), &why).is_discarded()) << why;
  EXPECT_TRUE(mx::parse_json_input(nested(mx::kMaxJsonDepth + 2), &why).is_discarded());
  EXPECT_NE(why.find("deeper than 64"), std::string::npos) << why;
  why.clear();
  EXPECT_TRUE(mx::parse_json_input(nested(200000), &why).is_discarded());  // no stack overflow
  EXPECT_NE(why.find("deeper"), std::string::npos) << why;
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
