// Internal to //runtime: the small JSON reader and writer helpers of the
// safetensors header (runtime/safetensors.h). Not a general JSON library:
// numbers keep their literal text (checked against the grammar, not
// converted), objects keep their members in order, duplicate keys included,
// so that the caller decides what a duplicate means.
//
//   ASSIGN_OR_RETURN(json::Value root, json::Parse(header, /*max_depth=*/64));
//   // root.kind == json::Value::Kind::kObject: member i is
//   // root.keys[i] -> root.items[i].
//
//   std::string out;
//   json::AppendQuoted("tab\there", &out);  // "tab\there", with the quotes
#ifndef LOSSRT_RUNTIME_JSON_PARSER_H_
#define LOSSRT_RUNTIME_JSON_PARSER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lossrt {
namespace json {

// One JSON value.
struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;               // a string's value or a number's literal
  std::vector<Value> items;       // array elements, or object values
  std::vector<std::string> keys;  // object keys, parallel to items
};

// "null", "a boolean", "a number", "a string", "an array", "an object".
const char* KindName(Value::Kind kind);

// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing past U+10FFFF), as JSON requires.
bool IsValidUtf8(absl::string_view text);

// Appends `text` (valid UTF-8) as a JSON string literal, quotes included:
// '"', '\\' and the control characters escaped, everything else as is.
void AppendQuoted(absl::string_view text, std::string* out);

// Parses `text` as one RFC 8259 JSON value (no extensions), with only
// whitespace around it. InvalidArgument "<what> at byte <offset>" for any
// defect: text that is not UTF-8, a grammar error, a lone surrogate in a \u
// escape, or arrays and objects nested more than `max_depth` deep. Recursion
// is bounded by `max_depth`, so any input is safe to parse.
absl::StatusOr<Value> Parse(absl::string_view text, int max_depth);

}  // namespace json
}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_JSON_PARSER_H_
