// Whole-file reads and writes through stdio, and the UTF-8 validator.
#include "data/file_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace lossrt {
namespace data {
namespace {

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

absl::Status ErrnoError(int error, absl::string_view what,
                        const std::string& path) {
  const std::string message =
      absl::StrCat(what, " '", path, "': ", std::strerror(error));
  if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(message);
  if (error == EACCES || error == EPERM) {
    return absl::PermissionDeniedError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             int64_t max_bytes) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    return ErrnoError(errno, "cannot read", path);
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a regular file"));
  }
  if (info.st_size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' has ", info.st_size,
                     " bytes, more than the limit of ", max_bytes));
  }
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return ErrnoError(errno, "cannot open", path);
  std::string contents;
  contents.resize(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < contents.size()) {
    const size_t got =
        std::fread(&contents[done], 1, contents.size() - done, file.get());
    if (got == 0) break;
    done += got;
  }
  if (std::ferror(file.get())) return ErrnoError(errno, "cannot read", path);
  // The file may have changed size since stat: keep what was read, then read
  // anything that follows.
  contents.resize(done);
  char buffer[1 << 16];
  for (;;) {
    const size_t got = std::fread(buffer, 1, sizeof(buffer), file.get());
    if (got == 0) break;
    contents.append(buffer, got);
    if (static_cast<int64_t>(contents.size()) > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "' is larger than the limit of ", max_bytes, " bytes"));
    }
  }
  if (std::ferror(file.get())) return ErrnoError(errno, "cannot read", path);
  return contents;
}

absl::Status WriteStringToFile(const std::string& path,
                               absl::string_view contents) {
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr) return ErrnoError(errno, "cannot create", path);
  if (!contents.empty() && std::fwrite(contents.data(), 1, contents.size(),
                                       file.get()) != contents.size()) {
    return ErrnoError(errno, "cannot write", path);
  }
  if (std::fflush(file.get()) != 0) {
    return ErrnoError(errno, "cannot write", path);
  }
  std::FILE* raw = file.release();
  if (std::fclose(raw) != 0) return ErrnoError(errno, "cannot close", path);
  return absl::OkStatus();
}

int64_t FindInvalidUtf8(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = bytes[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Length of the sequence and the allowed range of its second byte
    // (Unicode's table 3-7 of well-formed byte sequences).
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;   // no overlong 3-byte forms
      if (c == 0xED) high = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;   // no overlong 4-byte forms
      if (c == 0xF4) high = 0x8F;  // nothing above U+10FFFF
    } else {
      return static_cast<int64_t>(i);  // stray continuation, C0/C1, F5..FF
    }
    if (i + length > n) return static_cast<int64_t>(i);
    if (bytes[i + 1] < low || bytes[i + 1] > high) {
      return static_cast<int64_t>(i);
    }
    for (size_t k = 2; k < length; ++k) {
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) {
        return static_cast<int64_t>(i);
      }
    }
    i += length;
  }
  return -1;
}

}  // namespace data
}  // namespace lossrt
