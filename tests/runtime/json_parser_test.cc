// Tests of the safetensors header's JSON unit (runtime/json_parser.h): every
// kind of value, escapes and surrogate pairs, the number grammar, the depth
// limit at its boundary, the UTF-8 check, error offsets, and round trips of
// random strings through AppendQuoted and Parse.
#include "runtime/json_parser.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace json {
namespace {

constexpr int kDepth = 64;

TEST(JsonParserTest, ParsesEveryKindInOrderWithDuplicates) {
  auto value = Parse(
      " {\"n\": null, \"t\": true, \"f\": false, \"x\": -1.5e+3,"
      " \"s\": \"a\\\"b\\\\c\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\","
      " \"a\": [1, [], {}], \"n\": 0}\n",
      kDepth);
  ASSERT_TRUE(value.ok()) << value.status();
  ASSERT_EQ(value->kind, Value::Kind::kObject);
  const std::vector<std::string> keys = {"n", "t", "f", "x", "s", "a", "n"};
  ASSERT_EQ(value->keys, keys);
  ASSERT_EQ(value->items.size(), keys.size());
  EXPECT_EQ(value->items[0].kind, Value::Kind::kNull);
  EXPECT_EQ(value->items[1].kind, Value::Kind::kBool);
  EXPECT_TRUE(value->items[1].boolean);
  EXPECT_EQ(value->items[2].kind, Value::Kind::kBool);
  EXPECT_FALSE(value->items[2].boolean);
  EXPECT_EQ(value->items[3].kind, Value::Kind::kNumber);
  EXPECT_EQ(value->items[3].text, "-1.5e+3");
  EXPECT_EQ(value->items[4].kind, Value::Kind::kString);
  EXPECT_EQ(value->items[4].text, "a\"b\\c/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  const Value& array = value->items[5];
  ASSERT_EQ(array.kind, Value::Kind::kArray);
  ASSERT_EQ(array.items.size(), 3u);
  EXPECT_EQ(array.items[0].text, "1");
  EXPECT_EQ(array.items[1].kind, Value::Kind::kArray);
  EXPECT_TRUE(array.items[1].items.empty());
  EXPECT_EQ(array.items[2].kind, Value::Kind::kObject);
  EXPECT_TRUE(array.items[2].keys.empty());
  EXPECT_EQ(value->items[6].text, "0");
}

TEST(JsonParserTest, NumbersFollowTheGrammar) {
  for (const char* good : {"0", "-0", "7", "123", "-4.25", "1e9", "1E-2",
                           "0.5e+10", "99999999999999999999999"}) {
    auto value = Parse(good, kDepth);
    ASSERT_TRUE(value.ok()) << good << ": " << value.status();
    EXPECT_EQ(value->kind, Value::Kind::kNumber) << good;
    EXPECT_EQ(value->text, good);
  }
  for (const char* bad : {"-", "01", "+1", ".5", "1.", "1e", "1e+", "0x10",
                          "1.e3", "--1", "- 1", "Infinity", "NaN"}) {
    const absl::Status status = Parse(bad, kDepth).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << bad << ": " << status;
  }
}

TEST(JsonParserTest, DepthLimitIsExact) {
  for (int depth : {0, 1, 5, kDepth}) {
    // `depth` arrays around a number: the number is `depth` deep.
    const std::string ok =
        std::string(depth, '[') + "1" + std::string(depth, ']');
    EXPECT_TRUE(Parse(ok, depth).ok()) << depth;
    const std::string deeper = "[" + ok + "]";
    const absl::Status status = Parse(deeper, depth).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << depth;
    EXPECT_NE(status.message().find("nested too deeply"), std::string::npos)
        << status;
  }
  // Far past the limit: refused without running out of stack.
  const std::string deep =
      std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_FALSE(Parse(deep, kDepth).ok());
}

TEST(JsonParserTest, RejectsMalformedTextNamingTheOffset) {
  struct Case {
    std::string text;
    const char* message;  // a piece the error must contain
  };
  const std::vector<Case> cases = {
      {"", "unexpected end at byte 0"},
      {"   ", "unexpected end at byte 3"},
      {"{\"a\":1} x", "unexpected data after the value at byte 8"},
      {"{\"a\" 1}", "expected ':' at byte 5"},
      {"{1:2}", "expected a string key at byte 1"},
      {"{\"a\":1,}", "expected a string key at byte 7"},
      {"[1 2]", "expected ',' or ']' at byte 3"},
      {"{\"a\":1 \"b\":2}", "expected ',' or '}' at byte 7"},
      {"\"abc", "unterminated string"},
      {"\"a\\", "unterminated escape"},
      {"\"\\x\"", "unknown escape"},
      {"\"\\u12zz\"", "bad hex digit in \\u escape"},
      {"\"\\u12", "truncated \\u escape"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"\\ud800\"", "lone high surrogate"},
      {"\"\\ud800\\u0041\"", "high surrogate without a low one"},
      {"\"a\nb\"", "raw control character"},
      {"tru", "unexpected character 't' at byte 0"},
      {"nul", "unexpected character"},
      {"'a'", "unexpected character"},
      {"\"\xff\"", "invalid UTF-8 at byte 1"},
      {"[\"\xc0\x80\"]", "invalid UTF-8 at byte 2"},          // overlong
      {"\"\xed\xa0\x80\"", "invalid UTF-8 at byte 1"},        // surrogate
      {"\"\xf4\x90\x80\x80\"", "invalid UTF-8 at byte 1"},    // > U+10FFFF
      {"\"ok \xe2\x9c\"", "invalid UTF-8 at byte 4"},         // truncated
      {std::string("[\"\0\"]", 5), "raw control character"},  // NUL
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const absl::Status status = Parse(c.text, kDepth).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status;
  }
}

TEST(JsonParserTest, Utf8CheckMatchesTheStandard) {
  for (const char* good :
       {"", "ascii", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf",
        "\xee\x80\x80", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_TRUE(IsValidUtf8(good)) << good;
  }
  for (const char* bad :
       {"\x80", "\xc1\xbf", "\xc2", "\xe0\x9f\xbf", "\xed\xa0\x80",
        "\xf0\x8f\xbf\xbf", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff",
        "\xe2\x28\xa1", "a\xc2"}) {
    EXPECT_FALSE(IsValidUtf8(bad)) << bad;
  }
}

TEST(JsonParserTest, QuotedRandomStringsParseBack) {
  std::mt19937_64 engine(test::TestSeed());
  // Pieces that cover every escape and every UTF-8 length.
  const std::vector<std::string> pieces = {
      "a",  "Z",  " ",  "\"", "\\",   "/",           "\b",
      "\f", "\n", "\r", "\t", "\x01", "\x1f",        "\x7f",
      "\0", "é",  "✓",  "😀",  "\\u",  "\xef\xbf\xbf"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int count = static_cast<int>(engine() % 20);
    for (int k = 0; k < count; ++k) {
      const std::string& piece = pieces[engine() % pieces.size()];
      text += piece.empty() ? std::string(1, '\0') : piece;
    }
    ASSERT_TRUE(IsValidUtf8(text));
    std::string quoted;
    AppendQuoted(text, &quoted);
    for (const char c : quoted) {
      EXPECT_GE(static_cast<uint8_t>(c), 0x20) << "raw control in " << quoted;
    }
    auto value = Parse("[" + quoted + "]", kDepth);
    ASSERT_TRUE(value.ok()) << quoted << ": " << value.status();
    ASSERT_EQ(value->items.size(), 1u);
    EXPECT_EQ(value->items[0].text, text) << quoted;
  }
}

TEST(JsonParserTest, KindNames) {
  EXPECT_STREQ(KindName(Value::Kind::kNull), "null");
  EXPECT_STREQ(KindName(Value::Kind::kBool), "a boolean");
  EXPECT_STREQ(KindName(Value::Kind::kNumber), "a number");
  EXPECT_STREQ(KindName(Value::Kind::kString), "a string");
  EXPECT_STREQ(KindName(Value::Kind::kArray), "an array");
  EXPECT_STREQ(KindName(Value::Kind::kObject), "an object");
}

}  // namespace
}  // namespace json
}  // namespace lossrt
