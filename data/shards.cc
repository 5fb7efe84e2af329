// Reading and writing llm.c token shards.
#include "data/shards.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "data/file_util.h"
#include "runtime/status.h"

namespace lossrt {
namespace data {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kHeaderBytes = kShardHeaderInts * 4;

int32_t ReadLe32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) |
                              (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
}

void WriteLe32(int32_t value, char* p) {
  const uint32_t v = static_cast<uint32_t>(value);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

bool IsShardFileName(const fs::path& path) {
  const std::string name = path.filename().string();
  return name.size() > 4 && name[0] != '.' &&
         name.compare(name.size() - 4, 4, ".bin") == 0;
}

}  // namespace

absl::Status WriteTokenShard(const std::string& path,
                             absl::Span<const int32_t> tokens) {
  if (tokens.size() >
      static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument("a token shard holds at most 2^31 - 1 tokens, got ",
                           tokens.size());
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= kShardMaxVocab) {
      return InvalidArgument(
          "token ", tokens[i], " at position ", i,
          " does not fit a uint16 shard (ids must be in [0, ", kShardMaxVocab,
          "))");
    }
  }
  std::string bytes(kHeaderBytes + 2 * tokens.size(), '\0');
  WriteLe32(kShardMagic, &bytes[0]);
  WriteLe32(kShardVersion, &bytes[4]);
  WriteLe32(static_cast<int32_t>(tokens.size()), &bytes[8]);
  char* out = &bytes[kHeaderBytes];
  for (const int32_t token : tokens) {
    *out++ = static_cast<char>(token & 0xFF);
    *out++ = static_cast<char>((token >> 8) & 0xFF);
  }
  return WriteStringToFile(path, bytes);
}

absl::StatusOr<std::vector<int32_t>> ReadTokenShard(const std::string& path,
                                                    int32_t vocab_size) {
  if (vocab_size < 1 || vocab_size > kShardMaxVocab) {
    return InvalidArgument("shard vocab_size must be in [1, ", kShardMaxVocab,
                           "], got ", vocab_size);
  }
  // Largest valid shard: the header and INT32_MAX tokens.
  ASSIGN_OR_RETURN(
      const std::string bytes,
      ReadFileToString(
          path,
          kHeaderBytes + 2 * int64_t{std::numeric_limits<int32_t>::max()}));
  if (static_cast<int64_t>(bytes.size()) < kHeaderBytes) {
    return InvalidArgument("token shard '", path, "' has ", bytes.size(),
                           " bytes, less than its ", kHeaderBytes,
                           "-byte header (truncated?)");
  }
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const int32_t magic = ReadLe32(data);
  const int32_t version = ReadLe32(data + 4);
  const int32_t count = ReadLe32(data + 8);
  if (magic != kShardMagic) {
    return InvalidArgument("'", path, "' is not an llm.c token shard: magic ",
                           magic, " instead of ", kShardMagic);
  }
  if (version != kShardVersion) {
    return InvalidArgument("token shard '", path, "' has version ", version,
                           "; only version ", kShardVersion,
                           " (uint16 tokens) is supported");
  }
  if (count < 0) {
    return InvalidArgument("token shard '", path,
                           "' has a negative token count ", count);
  }
  const int64_t expected = kHeaderBytes + 2 * int64_t{count};
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return InvalidArgument(
        "token shard '", path, "' has ", bytes.size(), " bytes but its header ",
        "says ", count, " tokens (", expected, " bytes)",
        static_cast<int64_t>(bytes.size()) < expected ? ": truncated" : "");
  }
  std::vector<int32_t> tokens(count);
  const unsigned char* p = data + kHeaderBytes;
  for (int32_t i = 0; i < count; ++i, p += 2) {
    tokens[i] = static_cast<int32_t>(p[0] | (p[1] << 8));
    if (tokens[i] >= vocab_size) {
      return InvalidArgument("token shard '", path, "' has token ", tokens[i],
                             " at position ", i,
                             ", outside the vocabulary [0, ", vocab_size, ")");
    }
  }
  return tokens;
}

absl::StatusOr<std::vector<std::string>> ListTokenShards(
    const std::string& pattern) {
  std::vector<std::string> files;
  std::error_code error;
  const fs::file_status status = fs::status(pattern, error);
  if (!error && fs::is_regular_file(status))
    return std::vector<std::string>{pattern};
  if (!error && fs::is_directory(status)) {
    fs::directory_iterator it(pattern, error), end;
    for (; !error && it != end; it.increment(error)) {
      if (IsShardFileName(it->path()) && it->is_regular_file(error) && !error) {
        files.push_back(it->path().string());
      }
    }
    if (error) {
      return absl::InternalError(absl::StrCat("cannot list shard folder '",
                                              pattern, "': ", error.message()));
    }
    if (files.empty()) {
      return absl::NotFoundError(
          absl::StrCat("no *.bin token shard in folder '", pattern, "'"));
    }
  } else {
    glob_t matches;
    const int result = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
    if (result == 0) {
      for (size_t i = 0; i < matches.gl_pathc; ++i) {
        struct stat info;
        if (::stat(matches.gl_pathv[i], &info) == 0 && S_ISREG(info.st_mode)) {
          files.push_back(matches.gl_pathv[i]);
        }
      }
    }
    ::globfree(&matches);
    if (result != 0 && result != GLOB_NOMATCH) {
      return absl::InternalError(
          absl::StrCat("cannot expand shard pattern '", pattern, "'"));
    }
    if (files.empty()) {
      return absl::NotFoundError(
          absl::StrCat("no token shard matches '", pattern, "'"));
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::vector<int32_t>> ReadTokenShards(const std::string& pattern,
                                                     int32_t vocab_size) {
  ASSIGN_OR_RETURN(const std::vector<std::string> files,
                   ListTokenShards(pattern));
  std::vector<int32_t> tokens;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(const std::vector<int32_t> shard,
                     ReadTokenShard(file, vocab_size));
    tokens.insert(tokens.end(), shard.begin(), shard.end());
  }
  if (tokens.empty()) {
    return InvalidArgument("the token shards of '", pattern, "' (",
                           files.size(), " files) hold no token");
  }
  return tokens;
}

}  // namespace data
}  // namespace lossrt
