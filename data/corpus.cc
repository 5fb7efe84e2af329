// The corpus reader: folder walk, text checks and fortune-file cleanup.
#include "data/corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "data/file_util.h"
#include "runtime/status.h"

namespace lossrt {
namespace data {
namespace {

namespace fs = std::filesystem;

bool IsCorpusFileName(const fs::path& name) {
  const std::string file = name.filename().string();
  if (file.empty() || file[0] == '.') return false;
  const std::string extension =
      absl::AsciiStrToLower(name.extension().string());
  return extension.empty() || extension == ".txt";
}

absl::Status FsError(const std::error_code& error, absl::string_view what,
                     const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " '", path, "': ", error.message()));
}

// Fails unless `text` (the content of `path`) is text.
absl::Status CheckText(absl::string_view text, const std::string& path) {
  const size_t nul = text.find('\0');
  if (nul != absl::string_view::npos) {
    return InvalidArgument("corpus file '", path,
                           "' is not a text file: NUL byte at offset ", nul);
  }
  const int64_t bad = FindInvalidUtf8(text);
  if (bad >= 0) {
    return InvalidArgument("corpus file '", path,
                           "' is not a text file: invalid UTF-8 at offset ",
                           bad);
  }
  return absl::OkStatus();
}

bool IsFortuneFile(const std::string& path, FortuneFormat format) {
  switch (format) {
    case FortuneFormat::kAlways:
      return true;
    case FortuneFormat::kNever:
      return false;
    case FortuneFormat::kAuto:
      break;
  }
  struct stat info;
  const std::string index = path + ".dat";
  return ::stat(index.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

}  // namespace

std::string StripFortuneSeparators(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  // Appends entry [begin, end) of `text` without its leading blank lines and
  // trailing whitespace, so that entries end up one blank line apart.
  auto flush = [&](size_t begin, size_t end) {
    const absl::string_view entry = text.substr(begin, end - begin);
    const size_t first = entry.find_first_not_of(" \t\r\n");
    if (first == absl::string_view::npos) return;  // a blank entry
    const size_t line_start = entry.rfind('\n', first);
    const size_t start =
        line_start == absl::string_view::npos ? 0 : line_start + 1;
    const size_t last = entry.find_last_not_of(" \t\r\n");
    if (!out.empty()) out += '\n';
    out.append(entry.data() + start, last + 1 - start);
    out += '\n';
  };
  size_t entry_start = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == absl::string_view::npos) end = text.size();
    const absl::string_view line = text.substr(start, end - start);
    if (line == "%" || line == "%\r") {
      flush(entry_start, start);
      entry_start = std::min(end + 1, text.size());
    }
    start = end + 1;
  }
  flush(entry_start, text.size());
  return out;
}

absl::StatusOr<std::vector<std::string>> ListCorpusFiles(
    const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error || !fs::exists(status)) {
    if (error && error != std::errc::no_such_file_or_directory) {
      return FsError(error, "cannot read corpus", path);
    }
    return absl::NotFoundError(absl::StrCat("corpus '", path, "' not found"));
  }
  if (fs::is_regular_file(status)) return std::vector<std::string>{path};
  if (!fs::is_directory(status)) {
    return InvalidArgument("corpus '", path,
                           "' is neither a regular file nor a folder");
  }
  std::vector<std::string> files;
  fs::recursive_directory_iterator it(path, error), end;
  if (error) return FsError(error, "cannot list corpus folder", path);
  for (; it != end; it.increment(error)) {
    if (error) return FsError(error, "cannot list corpus folder", path);
    const fs::directory_entry& entry = *it;
    // Symlinks are skipped (their targets are read under their own names);
    // the iterator does not descend into symlinked folders.
    const fs::file_status link_status = entry.symlink_status(error);
    if (error) {
      return FsError(error, "cannot stat", entry.path().string());
    }
    if (fs::is_directory(link_status)) {
      const std::string name = entry.path().filename().string();
      if (!name.empty() && name[0] == '.') it.disable_recursion_pending();
      continue;
    }
    if (!fs::is_regular_file(link_status)) continue;
    if (!IsCorpusFileName(entry.path())) continue;
    files.push_back(entry.path().string());
  }
  if (error) return FsError(error, "cannot list corpus folder", path);
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::string> ReadTextCorpus(const std::string& path,
                                           const CorpusOptions& options) {
  ASSIGN_OR_RETURN(const std::vector<std::string> files, ListCorpusFiles(path));
  std::string corpus;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
    RETURN_IF_ERROR(CheckText(text, file));
    if (IsFortuneFile(file, options.fortune_format)) {
      text = StripFortuneSeparators(text);
    }
    if (text.empty()) continue;
    if (!corpus.empty()) corpus += '\n';
    corpus += text;
    if (corpus.back() != '\n') corpus += '\n';
  }
  if (corpus.empty()) {
    return InvalidArgument("corpus '", path, "' holds no text (",
                           files.empty()
                               ? "no text file: files need no extension or .txt"
                               : "every file is empty",
                           ")");
  }
  return corpus;
}

}  // namespace data
}  // namespace lossrt
