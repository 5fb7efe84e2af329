// The line reader of saved tokenizers.
#include "data/tokenizer_file.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "data/file_util.h"
#include "runtime/status.h"

namespace lossrt {
namespace data {
namespace {

// Strict decimal integer: optional '-', digits only, no spaces.
bool ParseInt(absl::string_view text, int64_t* value) {
  if (text.empty() || text.size() > 20) return false;
  const size_t digits_start = text[0] == '-' ? 1 : 0;
  if (digits_start == text.size()) return false;
  for (size_t i = digits_start; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  return absl::SimpleAtoi(text, value);
}

}  // namespace

absl::StatusOr<TokenizerFileReader> TokenizerFileReader::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents,
                   ReadFileToString(path, kMaxTokenizerFileBytes));
  TokenizerFileReader reader(path, std::move(contents));
  auto first = reader.Line();
  if (!first.ok() || *first != kTokenizerMagicLine) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path,
                     "' is not a lossrt tokenizer file (version 1): "
                     "its first line is not \"",
                     kTokenizerMagicLine, "\""));
  }
  return reader;
}

absl::StatusOr<absl::string_view> TokenizerFileReader::Line() {
  if (offset_ >= contents_.size()) {
    ++line_;
    return Error("unexpected end of file (truncated?)");
  }
  const size_t end = contents_.find('\n', offset_);
  if (end == std::string::npos) {
    ++line_;
    return Error("the last line has no line end (truncated?)");
  }
  const absl::string_view line(contents_.data() + offset_, end - offset_);
  offset_ = end + 1;
  ++line_;
  return line;
}

absl::StatusOr<absl::string_view> TokenizerFileReader::Field(
    absl::string_view key) {
  ASSIGN_OR_RETURN(absl::string_view line, Line());
  if (line.size() <= key.size() + 1 || line.substr(0, key.size()) != key ||
      line[key.size()] != ' ') {
    return Error(absl::StrCat("expected \"", key, " <value>\", found \"",
                              line.substr(0, 80), "\""));
  }
  return line.substr(key.size() + 1);
}

absl::StatusOr<int64_t> TokenizerFileReader::IntField(absl::string_view key,
                                                      int64_t min,
                                                      int64_t max) {
  ASSIGN_OR_RETURN(absl::string_view text, Field(key));
  int64_t value = 0;
  if (!ParseInt(text, &value)) {
    return Error(
        absl::StrCat(key, " is not an integer: \"", text.substr(0, 80), "\""));
  }
  if (value < min || value > max) {
    return Error(
        absl::StrCat(key, " ", value, " is outside [", min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<std::pair<int64_t, int64_t>> TokenizerFileReader::IntPair(
    int64_t min, int64_t max) {
  ASSIGN_OR_RETURN(absl::string_view line, Line());
  const size_t space = line.find(' ');
  int64_t a = 0, b = 0;
  if (space == absl::string_view::npos ||
      !ParseInt(line.substr(0, space), &a) ||
      !ParseInt(line.substr(space + 1), &b)) {
    return Error(absl::StrCat("expected two integers \"<a> <b>\", found \"",
                              line.substr(0, 80), "\""));
  }
  if (a < min || a > max || b < min || b > max) {
    return Error(
        absl::StrCat("value outside [", min, ", ", max, "]: \"", line, "\""));
  }
  return std::make_pair(a, b);
}

absl::Status TokenizerFileReader::ExpectEnd() {
  ASSIGN_OR_RETURN(absl::string_view line, Line());
  if (line != "end") {
    return Error(
        absl::StrCat("expected \"end\", found \"", line.substr(0, 80), "\""));
  }
  if (offset_ != contents_.size()) {
    ++line_;
    return Error("unexpected data after \"end\"");
  }
  return absl::OkStatus();
}

absl::Status TokenizerFileReader::Error(absl::string_view message) const {
  return absl::InvalidArgumentError(
      absl::StrCat(path_, ":", line_, ": ", message));
}

}  // namespace data
}  // namespace lossrt
