// The safetensors header's JSON: the UTF-8 check, string literals for the
// writer, and a recursive-descent parser whose depth is bounded.
#include "runtime/json_parser.h"

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace lossrt {
namespace json {
namespace {

void AppendUtf8(uint32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

// The offset of the first byte that is not part of well-formed UTF-8, or
// npos.
size_t InvalidUtf8At(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    const uint8_t lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    int extra;
    uint8_t low = 0x80, high = 0xBF;  // bounds of the second byte
    if (lead >= 0xC2 && lead <= 0xDF) {
      extra = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      extra = 2;
      if (lead == 0xE0) low = 0xA0;   // overlong
      if (lead == 0xED) high = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      extra = 3;
      if (lead == 0xF0) low = 0x90;   // overlong
      if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
    } else {
      return i;
    }
    if (size - i <= static_cast<size_t>(extra)) return i;
    if (bytes[i + 1] < low || bytes[i + 1] > high) return i;
    for (int k = 2; k <= extra; ++k) {
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
    }
    i += extra + 1;
  }
  return absl::string_view::npos;
}

// RFC 8259 JSON over a UTF-8 text.
class Parser {
 public:
  Parser(absl::string_view text, int max_depth)
      : text_(text), max_depth_(max_depth) {}

  // One value and nothing after it but whitespace.
  absl::StatusOr<Value> ParseDocument() {
    Value value;
    RETURN_IF_ERROR(ParseValue(&value, 0));
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("unexpected data after the value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at byte ", pos_));
  }

  void SkipWhitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool Consume(absl::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  // `depth`: the containers around this value (0 for the document's value).
  absl::Status ParseValue(Value* out, int depth) {
    if (depth > max_depth_) return Error("nested too deeply");
    SkipWhitespace();
    if (pos_ >= text_.size()) return Error("unexpected end");
    const char c = text_[pos_];
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      out->kind = Value::Kind::kString;
      return ParseString(&out->text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      out->kind = Value::Kind::kNumber;
      return ParseNumber(&out->text);
    }
    if (Consume("true") || Consume("false")) {
      out->kind = Value::Kind::kBool;
      out->boolean = c == 't';
      return absl::OkStatus();
    }
    if (Consume("null")) {
      out->kind = Value::Kind::kNull;
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected character '",
                              absl::CHexEscape(text_.substr(pos_, 1)), "'"));
  }

  absl::Status ParseObject(Value* out, int depth) {
    out->kind = Value::Kind::kObject;
    ++pos_;  // '{'
    SkipWhitespace();
    if (Consume("}")) return absl::OkStatus();
    while (true) {
      SkipWhitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Error("expected a string key");
      }
      std::string key;
      RETURN_IF_ERROR(ParseString(&key));
      SkipWhitespace();
      if (!Consume(":")) return Error("expected ':'");
      Value value;
      RETURN_IF_ERROR(ParseValue(&value, depth + 1));
      out->keys.push_back(std::move(key));
      out->items.push_back(std::move(value));
      SkipWhitespace();
      if (Consume("}")) return absl::OkStatus();
      if (!Consume(",")) return Error("expected ',' or '}'");
    }
  }

  absl::Status ParseArray(Value* out, int depth) {
    out->kind = Value::Kind::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (Consume("]")) return absl::OkStatus();
    while (true) {
      Value value;
      RETURN_IF_ERROR(ParseValue(&value, depth + 1));
      out->items.push_back(std::move(value));
      SkipWhitespace();
      if (Consume("]")) return absl::OkStatus();
      if (!Consume(",")) return Error("expected ',' or ']'");
    }
  }

  // Four hex digits of a \u escape.
  absl::StatusOr<uint32_t> ParseHex4() {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t value = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        value |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        value |= c - 'A' + 10;
      } else {
        return Error("bad hex digit in \\u escape");
      }
    }
    return value;
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<uint8_t>(c) < 0x20) {
        return Error("raw control character in a string");
      }
      if (c != '\\') {
        out->push_back(c);  // the whole text was checked to be UTF-8
        continue;
      }
      if (pos_ >= text_.size()) return Error("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          ASSIGN_OR_RETURN(uint32_t code, ParseHex4());
          if (code >= 0xDC00 && code <= 0xDFFF) {
            return Error("lone low surrogate in \\u escape");
          }
          if (code >= 0xD800 && code <= 0xDBFF) {
            if (!Consume("\\u")) return Error("lone high surrogate");
            ASSIGN_OR_RETURN(uint32_t low, ParseHex4());
            if (low < 0xDC00 || low > 0xDFFF) {
              return Error("high surrogate without a low one");
            }
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(code, out);
          break;
        }
        default:
          return Error("unknown escape");
      }
    }
  }

  // The literal of a number, checked against the JSON grammar.
  absl::Status ParseNumber(std::string* out) {
    const size_t start = pos_;
    auto digits = [&]() {
      const size_t first = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9')
        ++pos_;
      return pos_ - first;
    };
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else if (digits() == 0) {
      return Error("malformed number");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) return Error("malformed number");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-'))
        ++pos_;
      if (digits() == 0) return Error("malformed number");
    }
    out->assign(text_.data() + start, pos_ - start);
    return absl::OkStatus();
  }

  const absl::string_view text_;
  const int max_depth_;
  size_t pos_ = 0;
};

}  // namespace

const char* KindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kNull:
      return "null";
    case Value::Kind::kBool:
      return "a boolean";
    case Value::Kind::kNumber:
      return "a number";
    case Value::Kind::kString:
      return "a string";
    case Value::Kind::kArray:
      return "an array";
    case Value::Kind::kObject:
      return "an object";
  }
  return "?";
}

bool IsValidUtf8(absl::string_view text) {
  return InvalidUtf8At(text) == absl::string_view::npos;
}

void AppendQuoted(absl::string_view text, std::string* out) {
  out->push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<uint8_t>(c) < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out->append("\\u00");
          out->push_back(kHex[static_cast<uint8_t>(c) >> 4]);
          out->push_back(kHex[static_cast<uint8_t>(c) & 0xF]);
        } else {
          out->push_back(c);  // ASCII or a byte of a UTF-8 sequence
        }
    }
  }
  out->push_back('"');
}

absl::StatusOr<Value> Parse(absl::string_view text, int max_depth) {
  const size_t bad = InvalidUtf8At(text);
  if (bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid UTF-8 at byte ", bad));
  }
  return Parser(text, max_depth).ParseDocument();
}

}  // namespace json
}  // namespace lossrt
