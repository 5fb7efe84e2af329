// Internal: the line reader of the saved tokenizer format (data/tokenizer.h).
// Every error names the file and the 1-based line.
//
//   ASSIGN_OR_RETURN(TokenizerFileReader reader,
//                    TokenizerFileReader::Open(path));  // past the magic
//   ASSIGN_OR_RETURN(absl::string_view kind, reader.Field("kind"));
//   ASSIGN_OR_RETURN(int64_t vocab, reader.IntField("vocab_size", 256, 1024));
//   RETURN_IF_ERROR(reader.ExpectEnd());
#ifndef LOSSRT_DATA_TOKENIZER_FILE_H_
#define LOSSRT_DATA_TOKENIZER_FILE_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lossrt {
namespace data {

// The first line of every saved tokenizer.
inline constexpr char kTokenizerMagicLine[] = "lossrt-tokenizer 1";

// The largest tokenizer file read (bytes).
inline constexpr int64_t kMaxTokenizerFileBytes = int64_t{256} << 20;

class TokenizerFileReader {
 public:
  // Reads `path` and checks its first line (the magic and version).
  static absl::StatusOr<TokenizerFileReader> Open(const std::string& path);

  // The next line (without its "\n"); an error at the end of the file.
  absl::StatusOr<absl::string_view> Line();

  // The value of the next line, which must read "<key> <value>".
  absl::StatusOr<absl::string_view> Field(absl::string_view key);

  // The value of "<key> <integer>", which must lie in [min, max].
  absl::StatusOr<int64_t> IntField(absl::string_view key, int64_t min,
                                   int64_t max);

  // The next line as two integers "<a> <b>", each in [min, max].
  absl::StatusOr<std::pair<int64_t, int64_t>> IntPair(int64_t min, int64_t max);

  // The line "end", and nothing after it.
  absl::Status ExpectEnd();

  // InvalidArgument "<path>:<line>: <message>" for the last line read.
  absl::Status Error(absl::string_view message) const;

 private:
  TokenizerFileReader(std::string path, std::string contents)
      : path_(std::move(path)), contents_(std::move(contents)) {}

  std::string path_;
  std::string contents_;
  size_t offset_ = 0;
  int line_ = 0;
};

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_DATA_TOKENIZER_FILE_H_
