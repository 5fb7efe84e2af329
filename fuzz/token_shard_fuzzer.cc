// Fuzz target of the llm.c token shard reader (data/shards.h): the input is
// written as a shard file and read with the full vocabulary and with a smaller
// one taken from the input. A refused shard is InvalidArgument; an accepted
// one has exactly the tokens its bytes spell, is refused by a vocabulary its
// largest token does not fit, and writes back to the same bytes (the header's
// unused ints, which the reader ignores, aside).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "data/shards.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace data_ns = lossrt::data;
  constexpr size_t kHeaderBytes = data_ns::kShardHeaderInts * 4;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string path = lossrt::fuzz::ScratchPath("shard.bin");
  lossrt::fuzz::WriteScratchFile(path, bytes);

  absl::StatusOr<std::vector<int32_t>> tokens = data_ns::ReadTokenShard(path);
  if (!tokens.ok()) {
    FUZZ_CHECK(tokens.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(tokens.status().message().find(path) != std::string::npos);
    return 0;
  }
  FUZZ_CHECK(size == kHeaderBytes + 2 * tokens->size());
  int32_t largest = -1;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const int32_t expected =
        data[kHeaderBytes + 2 * i] | (data[kHeaderBytes + 2 * i + 1] << 8);
    FUZZ_CHECK((*tokens)[i] == expected);
    largest = std::max(largest, expected);
  }

  // A vocabulary from the input's last bytes: accepted iff every token fits.
  const int32_t vocab_size =
      1 + ((size >= 2 ? data[size - 2] | (data[size - 1] << 8) : 0) %
           data_ns::kShardMaxVocab);
  absl::StatusOr<std::vector<int32_t>> limited =
      data_ns::ReadTokenShard(path, vocab_size);
  if (largest < vocab_size) {
    FUZZ_CHECK_OK(limited.status());
    FUZZ_CHECK(*limited == *tokens);
  } else {
    FUZZ_CHECK(limited.status().code() == absl::StatusCode::kInvalidArgument);
  }
  for (const int32_t bad : {0, -1, data_ns::kShardMaxVocab + 1}) {
    FUZZ_CHECK(data_ns::ReadTokenShard(path, bad).status().code() ==
               absl::StatusCode::kInvalidArgument);
  }

  const std::string copy = lossrt::fuzz::ScratchPath("copy.bin");
  FUZZ_CHECK_OK(data_ns::WriteTokenShard(copy, *tokens));
  const std::string written = lossrt::fuzz::ReadScratchFile(copy);
  FUZZ_CHECK(written.size() == bytes.size());
  FUZZ_CHECK(written.compare(0, 12, bytes, 0, 12) == 0);  // magic, version, N
  FUZZ_CHECK(written.find_first_not_of('\0', 12) >= kHeaderBytes);
  FUZZ_CHECK(written.compare(kHeaderBytes, std::string::npos, bytes,
                             kHeaderBytes) == 0);
  return 0;
}
