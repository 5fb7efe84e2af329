// llm.c token shards: pre-tokenized data in Karpathy's llm.c format, one file
// per shard, read alone or as a set (a folder or a glob, in sorted order).
//
//   RETURN_IF_ERROR(lossrt::data::WriteTokenShard("data/train_000.bin", ids));
//   ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
//                    lossrt::data::ReadTokenShards("data/train_*.bin",
//                                                  /*vocab_size=*/8192));
//
// Format (little-endian): a header of 256 int32 -- [0] the magic 20240520,
// [1] the version 1, [2] the number of tokens N, the rest 0 -- then N uint16
// tokens. The file size must be exactly 1024 + 2 N bytes.
#ifndef LOSSRT_DATA_SHARDS_H_
#define LOSSRT_DATA_SHARDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lossrt {
namespace data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int kShardHeaderInts = 256;
// uint16 tokens: ids below this.
inline constexpr int32_t kShardMaxVocab = 65536;

// Writes `tokens` (each in [0, 65536), at most INT32_MAX of them) as one
// shard. Nothing is written on an InvalidArgument.
absl::Status WriteTokenShard(const std::string& path,
                             absl::Span<const int32_t> tokens);

// The tokens of one shard. Errors (naming the file): NotFound; InvalidArgument
// for a bad magic or version, a size that is not 1024 + 2 N, or a token >=
// `vocab_size` (in [1, 65536]).
absl::StatusOr<std::vector<int32_t>> ReadTokenShard(
    const std::string& path, int32_t vocab_size = kShardMaxVocab);

// The shard files `pattern` names, sorted: the file itself, every "*.bin"
// regular file of a folder, or the regular files matching a glob(3) pattern.
// NotFound when there are none.
absl::StatusOr<std::vector<std::string>> ListTokenShards(
    const std::string& pattern);

// The tokens of every shard ListTokenShards(pattern) names, concatenated in
// that order; an error when any shard is bad, and InvalidArgument when they
// hold no token at all.
absl::StatusOr<std::vector<int32_t>> ReadTokenShards(
    const std::string& pattern, int32_t vocab_size = kShardMaxVocab);

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_DATA_SHARDS_H_
