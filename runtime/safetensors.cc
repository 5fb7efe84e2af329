// Safetensors checkpoints: the atomic file write, the writer (header JSON
// built by hand with proper escaping, space padding to 8 bytes, data laid out
// by decreasing element size) and the reader, whose validation of the header
// (parsed by runtime/json_parser.h) turns every defect of a file into a
// DataLossError.
#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/json_parser.h"
#include "runtime/status.h"

namespace lossrt {
namespace {

using json::IsValidUtf8;
using Json = json::Value;

// The reference implementation's limit on the header (it refuses larger).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Nesting the JSON parser follows before it gives up (a valid header nests 3).
constexpr int kMaxJsonDepth = 64;
constexpr absl::string_view kMetadataKey = "__metadata__";

// ---- Files ----

absl::Status ErrnoError(int error, absl::string_view what,
                        absl::string_view path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path));
}

// The folder of `path` ("." when it names none), for the temporary file and
// the fsync after the rename.
std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteAll(int fd, absl::string_view bytes,
                      const std::string& path) {
  while (!bytes.empty()) {
    // Linux writes at most ~2 GiB per call; ask for 1 GiB at a time.
    const size_t chunk = std::min<size_t>(bytes.size(), size_t{1} << 30);
    const ssize_t written = ::write(fd, bytes.data(), chunk);
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "writing", path);
    }
    bytes.remove_prefix(static_cast<size_t>(written));
  }
  return absl::OkStatus();
}

// The atomic write of `pieces`, concatenated (see WriteFileAtomically).
absl::Status WritePiecesAtomically(const std::string& path,
                                   absl::Span<const absl::string_view> pieces) {
  const size_t slash = path.rfind('/');
  const std::string base =
      slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty() || base == "." || base == "..") {
    return InvalidArgument("WriteFileAtomically: '", path,
                           "' does not name a file");
  }
  const std::string prefix =
      slash == std::string::npos ? "" : path.substr(0, slash + 1);
  // A hidden name in the same folder (rename is atomic only within one file
  // system), unique through O_EXCL and a random suffix.
  std::random_device device;
  std::string temp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    const uint64_t suffix =
        (static_cast<uint64_t>(device()) << 32) ^ device() ^
        static_cast<uint64_t>(
            std::chrono::steady_clock::now().time_since_epoch().count());
    temp = absl::StrCat(prefix, ".", base, ".tmp-", absl::Hex(suffix));
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) {
      return ErrnoError(errno, "creating temporary file", temp);
    }
  }
  if (fd < 0) return ErrnoError(EEXIST, "creating temporary file", temp);

  absl::Status status = absl::OkStatus();
  for (absl::string_view piece : pieces) {
    status = WriteAll(fd, piece, temp);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0)
    status = ErrnoError(errno, "fsync", temp);
  if (::close(fd) != 0 && status.ok()) {
    status = ErrnoError(errno, "closing", temp);
  }
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, absl::StrCat("renaming ", temp, " to"), path);
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  // Makes the rename itself durable. Some file systems cannot fsync a folder
  // (EINVAL): the file is in place then, only its durability is the system's.
  const std::string folder = FolderOf(path);
  const int dir_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, "opening folder", folder);
  if (::fsync(dir_fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
    const int error = errno;
    ::close(dir_fd);
    return ErrnoError(error, "fsync of folder", folder);
  }
  ::close(dir_fd);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "opening", path);
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoError(error, "stat of", path);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file"));
  }
  std::string contents(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < contents.size()) {
    const size_t chunk =
        std::min<size_t>(contents.size() - done, size_t{1} << 30);
    const ssize_t got = ::read(fd, &contents[done], chunk);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      return ErrnoError(error, "reading", path);
    }
    if (got == 0) break;  // shrank meanwhile: validation will say what is off
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  contents.resize(done);
  return contents;
}

// ---- The header's meaning ----

absl::Status TensorError(absl::string_view name, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("safetensors: tensor '",
                                          absl::CHexEscape(name), "': ", what));
}

bool DTypeFromName(absl::string_view name, DType* dtype) {
  static constexpr DType kAll[] = {DType::kF64,  DType::kF32, DType::kF16,
                                   DType::kBF16, DType::kI64, DType::kI32};
  for (DType candidate : kAll) {
    if (name == SafetensorsDTypeName(candidate)) {
      *dtype = candidate;
      return true;
    }
  }
  return false;
}

// A non-negative integer that fits int64 (digits only, as the reference
// reader's usize fields take), or false.
bool ToIndex(const Json& value, int64_t* out) {
  if (value.kind != Json::Kind::kNumber || value.text.empty()) return false;
  uint64_t result = 0;
  for (const char c : value.text) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (result > (std::numeric_limits<int64_t>::max() - digit) / 10) {
      return false;
    }
    result = result * 10 + digit;
  }
  *out = static_cast<int64_t>(result);
  return true;
}

// The member `key` of an object, or null when absent; DataLoss when repeated.
absl::StatusOr<const Json*> Member(const Json& object, absl::string_view key,
                                   absl::string_view tensor) {
  const Json* found = nullptr;
  for (size_t i = 0; i < object.keys.size(); ++i) {
    if (object.keys[i] != key) continue;
    if (found != nullptr) {
      return TensorError(tensor, absl::StrCat("duplicate field '", key, "'"));
    }
    found = &object.items[i];
  }
  return found;
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return "F64";
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
  }
  return "?";
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const absl::string_view pieces[] = {contents};
  return WritePiecesAtomically(path, pieces);
}

absl::Status WriteSafetensors(
    const std::string& path, absl::Span<const SafetensorsEntry> entries,
    const std::map<std::string, std::string>& metadata) {
  // Checks, and every tensor's byte count.
  std::vector<int64_t> bytes(entries.size());
  absl::flat_hash_map<absl::string_view, size_t> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& entry = entries[i];
    const std::string shown = absl::CHexEscape(entry.name);
    if (entry.name.empty()) {
      return InvalidArgument("WriteSafetensors: entry ", i, " has no name");
    }
    if (entry.name == kMetadataKey) {
      return InvalidArgument("WriteSafetensors: the name '", kMetadataKey,
                             "' is reserved for metadata");
    }
    if (!IsValidUtf8(entry.name)) {
      return InvalidArgument("WriteSafetensors: name '", shown,
                             "' is not valid UTF-8");
    }
    if (!seen.emplace(entry.name, i).second) {
      return InvalidArgument("WriteSafetensors: duplicate name '", shown, "'");
    }
    int64_t count = DTypeSize(entry.dtype);
    if (count == 0) {
      return InvalidArgument("WriteSafetensors: '", shown,
                             "' has an unknown dtype");
    }
    for (int64_t d : entry.shape) {
      if (d < 0) {
        return InvalidArgument("WriteSafetensors: '", shown,
                               "' has a negative dim");
      }
      if (__builtin_mul_overflow(count, d, &count)) {
        return InvalidArgument("WriteSafetensors: the size of '", shown,
                               "' overflows");
      }
    }
    if (count > 0 && entry.data == nullptr) {
      return InvalidArgument("WriteSafetensors: '", shown, "' has no data");
    }
    bytes[i] = count;
  }
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return InvalidArgument("WriteSafetensors: metadata '",
                             absl::CHexEscape(key), "' is not valid UTF-8");
    }
  }

  // Data by decreasing element size (then in the order given): every tensor
  // starts at a multiple of its element size.
  std::vector<size_t> layout(entries.size());
  for (size_t i = 0; i < layout.size(); ++i) layout[i] = i;
  std::stable_sort(layout.begin(), layout.end(), [&](size_t a, size_t b) {
    return DTypeSize(entries[a].dtype) > DTypeSize(entries[b].dtype);
  });
  std::vector<int64_t> begin(entries.size());
  int64_t offset = 0;
  for (size_t i : layout) {
    begin[i] = offset;
    if (__builtin_add_overflow(offset, bytes[i], &offset)) {
      return InvalidArgument("WriteSafetensors: the total size overflows");
    }
  }

  // The header, compact as the reference writer makes it.
  std::string header = "{";
  if (!metadata.empty()) {
    json::AppendQuoted(kMetadataKey, &header);
    header.append(":{");
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header.push_back(',');
      first = false;
      json::AppendQuoted(key, &header);
      header.push_back(':');
      json::AppendQuoted(value, &header);
    }
    header.push_back('}');
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (header.size() > 1) header.push_back(',');
    json::AppendQuoted(entries[i].name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"",
                    SafetensorsDTypeName(entries[i].dtype), "\",\"shape\":[");
    for (size_t d = 0; d < entries[i].shape.size(); ++d) {
      absl::StrAppend(&header, d > 0 ? "," : "", entries[i].shape[d]);
    }
    absl::StrAppend(&header, "],\"data_offsets\":[", begin[i], ",",
                    begin[i] + bytes[i], "]}");
  }
  header.push_back('}');
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxHeaderBytes) {
    return InvalidArgument("WriteSafetensors: the header would take ",
                           header.size(), " bytes, more than readers accept (",
                           kMaxHeaderBytes, ")");
  }

  char length[8];
  uint64_t n = header.size();
  for (int k = 0; k < 8; ++k) length[k] = static_cast<char>(n >> (8 * k));
  std::vector<absl::string_view> pieces = {absl::string_view(length, 8),
                                           header};
  for (size_t i : layout) {
    if (bytes[i] > 0) {
      pieces.emplace_back(static_cast<const char*>(entries[i].data),
                          static_cast<size_t>(bytes[i]));
    }
  }
  return WritePiecesAtomically(path, pieces);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents, ReadWholeFile(path));
  auto file = Parse(std::move(contents));
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(path, ": ", file.status().message()));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string contents) {
  const uint64_t size = contents.size();
  if (size < 8) {
    return absl::DataLossError(
        absl::StrCat("safetensors: ", size,
                     " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) {
    n = (n << 8) | static_cast<uint8_t>(contents[k]);
  }
  if (n > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat("safetensors: header length ", n,
                                            " exceeds the limit of ",
                                            kMaxHeaderBytes));
  }
  if (n > size - 8) {
    return absl::DataLossError(absl::StrCat("safetensors: header length ", n,
                                            " runs past the end of ",
                                            "the file (", size, " bytes)"));
  }
  const absl::string_view header(contents.data() + 8, n);
  if (!IsValidUtf8(header)) {
    return absl::DataLossError("safetensors: the header is not valid UTF-8");
  }
  if (header.empty() || header[0] != '{') {
    return absl::DataLossError(
        "safetensors: the header does not start with '{'");
  }
  absl::StatusOr<Json> root_or = json::Parse(header, kMaxJsonDepth);
  if (!root_or.ok()) {
    return absl::DataLossError(absl::StrCat(
        "safetensors: invalid JSON header: ", root_or.status().message()));
  }
  const Json& root = *root_or;

  SafetensorsFile file;
  const int64_t data_start = static_cast<int64_t>(8 + n);
  const int64_t data_size = static_cast<int64_t>(size - 8 - n);
  bool have_metadata = false;
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& name = root.keys[i];
    const Json& value = root.items[i];
    if (name == kMetadataKey) {
      if (have_metadata) {
        return absl::DataLossError("safetensors: duplicate __metadata__");
      }
      have_metadata = true;
      if (value.kind == Json::Kind::kNull) continue;
      if (value.kind != Json::Kind::kObject) {
        return absl::DataLossError(absl::StrCat("safetensors: __metadata__ is ",
                                                json::KindName(value.kind),
                                                ", not an object"));
      }
      for (size_t k = 0; k < value.keys.size(); ++k) {
        if (value.items[k].kind != Json::Kind::kString) {
          return absl::DataLossError(absl::StrCat(
              "safetensors: __metadata__ '", absl::CHexEscape(value.keys[k]),
              "' is ", json::KindName(value.items[k].kind), ", not a string"));
        }
        if (!file.metadata_.emplace(value.keys[k], value.items[k].text)
                 .second) {
          return absl::DataLossError(
              absl::StrCat("safetensors: duplicate __metadata__ key '",
                           absl::CHexEscape(value.keys[k]), "'"));
        }
      }
      continue;
    }
    if (value.kind != Json::Kind::kObject) {
      return TensorError(name, absl::StrCat("is ", json::KindName(value.kind),
                                            ", not an object"));
    }
    ASSIGN_OR_RETURN(const Json* dtype, Member(value, "dtype", name));
    ASSIGN_OR_RETURN(const Json* shape, Member(value, "shape", name));
    ASSIGN_OR_RETURN(const Json* offsets, Member(value, "data_offsets", name));
    if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
      return TensorError(name, "needs dtype, shape and data_offsets");
    }
    Entry entry;
    entry.name = name;
    if (dtype->kind != Json::Kind::kString ||
        !DTypeFromName(dtype->text, &entry.dtype)) {
      return TensorError(
          name, dtype->kind == Json::Kind::kString
                    ? absl::StrCat(
                          "unsupported dtype '", absl::CHexEscape(dtype->text),
                          "' (supported: F64, F32, F16, BF16, I64, I32)")
                    : absl::StrCat("dtype is ", json::KindName(dtype->kind)));
    }
    if (shape->kind != Json::Kind::kArray) {
      return TensorError(name, "shape is not an array");
    }
    int64_t expected_bytes = DTypeSize(entry.dtype);
    for (const Json& dim : shape->items) {
      int64_t d;
      if (!ToIndex(dim, &d)) {
        return TensorError(name,
                           "shape holds something other than a "
                           "non-negative 64-bit integer");
      }
      if (__builtin_mul_overflow(expected_bytes, d, &expected_bytes)) {
        return TensorError(name, "the size of its shape overflows");
      }
      entry.shape.push_back(d);
    }
    int64_t begin, end;
    if (offsets->kind != Json::Kind::kArray || offsets->items.size() != 2 ||
        !ToIndex(offsets->items[0], &begin) ||
        !ToIndex(offsets->items[1], &end)) {
      return TensorError(name, "data_offsets is not [begin, end]");
    }
    if (end < begin || end > data_size) {
      return TensorError(
          name, absl::StrCat("data_offsets [", begin, ", ", end,
                             "] are outside the data (", data_size, " bytes)"));
    }
    if (end - begin != expected_bytes) {
      return TensorError(name,
                         absl::StrCat("data_offsets span ", end - begin,
                                      " bytes, but its dtype and shape take ",
                                      expected_bytes));
    }
    entry.begin = data_start + begin;
    entry.end = data_start + end;
    if (!file.index_.emplace(name, file.entries_.size()).second) {
      return TensorError(name, "appears twice");
    }
    file.entries_.push_back(std::move(entry));
  }

  // The tensors must tile the data: sorted by offsets, each starts where the
  // previous ended, the last ends at the end of the file.
  std::vector<const Entry*> order;
  order.reserve(file.entries_.size());
  for (const Entry& entry : file.entries_) order.push_back(&entry);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  int64_t at = data_start;
  for (const Entry* entry : order) {
    if (entry->begin != at) {
      return TensorError(
          entry->name,
          entry->begin < at
              ? "its data overlaps another tensor's"
              : "its data does not start where the previous tensor's ends "
                "(a hole in the data)");
    }
    at = entry->end;
  }
  if (at != static_cast<int64_t>(size)) {
    return absl::DataLossError(absl::StrCat("safetensors: the tensors cover ",
                                            at - data_start, " of the ",
                                            data_size, " data bytes"));
  }
  file.contents_ = std::move(contents);
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const Entry& entry : entries_) names.push_back(entry.name);
  return names;
}

absl::StatusOr<SafetensorsFile::View> SafetensorsFile::Find(
    absl::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("safetensors: no tensor named '",
                                            absl::CHexEscape(name), "'"));
  }
  const Entry& entry = entries_[it->second];
  View view;
  view.dtype = entry.dtype;
  view.shape = entry.shape;
  view.bytes = absl::Span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(contents_.data()) + entry.begin,
      static_cast<size_t>(entry.end - entry.begin));
  return view;
}

}  // namespace lossrt
