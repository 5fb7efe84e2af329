// Internal file helpers of the data package: whole-file reads and writes with
// absl::Status errors that name the file, and a strict UTF-8 check. Used by
// the tokenizers, the corpus reader and the token shards.
//
//   ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
//   if (FindInvalidUtf8(text) >= 0) { ... }
#ifndef LOSSRT_DATA_FILE_UTIL_H_
#define LOSSRT_DATA_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lossrt {
namespace data {

// The whole content of the regular file at `path` (symlinks followed).
// NotFound when nothing is there, InvalidArgument when it is not a regular file
// or is larger than `max_bytes`, an errno-based error when reading fails.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             int64_t max_bytes = int64_t{1}
                                                                 << 40);

// Writes `contents` to `path` (created or truncated). The error names the file.
absl::Status WriteStringToFile(const std::string& path,
                               absl::string_view contents);

// The byte offset of the first ill-formed UTF-8 sequence in `text` (overlong
// forms, surrogates, code points above U+10FFFF, stray or missing continuation
// bytes), or -1 when `text` is well-formed UTF-8. NUL bytes are well-formed.
int64_t FindInvalidUtf8(absl::string_view text);

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_DATA_FILE_UTIL_H_
