// Fuzz target of BPE training on arbitrary bytes (data/bpe_tokenizer.h): the
// first two input bytes pick the vocabulary size (256 to 256 + 1023) and the
// minimum pair frequency (1 to 4), the rest is the training text. Training
// must succeed within the asked vocabulary with valid merges (FromMerges
// accepts them), match a naive reference trainer (recount every pair at every
// merge) on small cases, encode every training word to the segmentation
// training ended with, and encode and decode the text back exactly.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "data/bpe_tokenizer.h"
#include "data/pretokenizer.h"
#include "fuzz/fuzz_util.h"

namespace lossrt {
namespace data {
namespace {

using Merge = BpeTokenizer::Merge;

// Naive BPE (as in tests/data/bpe_tokenizer_test.cc): the most frequent pair
// over all words wins, ties to the smaller (left, right); also each unique
// word's final tokens.
std::vector<Merge> NaiveTrain(
    absl::string_view text, int vocab_size, int64_t min_frequency,
    std::map<std::string, std::vector<int32_t>>* segmentation) {
  std::map<std::string, int64_t> counts;
  ForEachWord(text,
              [&](absl::string_view word) { ++counts[std::string(word)]; });
  std::map<std::string, std::vector<int32_t>>& words = *segmentation;
  for (const auto& [word, count] : counts) {
    for (const unsigned char c : word) words[word].push_back(c);
  }
  std::vector<Merge> merges;
  while (256 + static_cast<int>(merges.size()) < vocab_size) {
    std::map<Merge, int64_t> pairs;
    for (const auto& [word, tokens] : words) {
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        pairs[{tokens[i], tokens[i + 1]}] += counts[word];
      }
    }
    Merge best;
    int64_t best_count = 0;
    for (const auto& [pair, count] : pairs) {  // ascending pair order
      if (count > best_count) best = pair, best_count = count;
    }
    if (best_count == 0 || best_count < min_frequency) break;
    const int32_t id = 256 + static_cast<int32_t>(merges.size());
    merges.push_back(best);
    for (auto& [word, tokens] : words) {
      std::vector<int32_t> merged;
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (i + 1 < tokens.size() && tokens[i] == best.first &&
            tokens[i + 1] == best.second) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(tokens[i]);
        }
      }
      tokens = std::move(merged);
    }
  }
  return merges;
}

}  // namespace
}  // namespace data
}  // namespace lossrt

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lossrt::data::BpeTokenizer;
  if (size < 2) return 0;
  const int vocab_size = 256 + (data[0] | ((data[1] & 0x03) << 8));
  lossrt::data::BpeTrainOptions options;
  options.min_frequency = 1 + (data[1] >> 6);
  const absl::string_view text(reinterpret_cast<const char*>(data) + 2,
                               size - 2);

  absl::StatusOr<BpeTokenizer> tokenizer =
      BpeTokenizer::Train(text, vocab_size, options);
  FUZZ_CHECK_OK(tokenizer.status());
  FUZZ_CHECK(tokenizer->vocab_size() <= vocab_size);
  FUZZ_CHECK(tokenizer->vocab_size() ==
             256 + static_cast<int>(tokenizer->merges().size()));
  absl::StatusOr<BpeTokenizer> rebuilt =
      BpeTokenizer::FromMerges(tokenizer->merges());
  FUZZ_CHECK_OK(rebuilt.status());

  // The reference is quadratic: small cases only.
  if (text.size() <= 512 && vocab_size <= 256 + 64) {
    std::map<std::string, std::vector<int32_t>> segmentation;
    const std::vector<BpeTokenizer::Merge> merges = lossrt::data::NaiveTrain(
        text, vocab_size, options.min_frequency, &segmentation);
    FUZZ_CHECK(tokenizer->merges() == merges);
    for (const auto& [word, tokens] : segmentation) {
      FUZZ_CHECK(tokenizer->Encode(word) == tokens);
    }
  }

  const std::vector<int32_t> ids = tokenizer->Encode(text);
  FUZZ_CHECK(ids.size() <= text.size());
  FUZZ_CHECK(rebuilt->Encode(text) == ids);
  for (const int32_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < tokenizer->vocab_size());
  }
  absl::StatusOr<std::string> decoded = tokenizer->Decode(ids);
  FUZZ_CHECK_OK(decoded.status());
  FUZZ_CHECK(*decoded == text);
  return 0;
}
