// A naive byte-level BPE trainer, the reference that BPE training
// (data/bpe_tokenizer.h) is checked against by its unit test and its fuzz
// target: every merge recounts every pair over all words; the most frequent
// pair wins, ties to the smaller (left, right), and training stops at the
// vocabulary size or below `min_frequency`. Quadratic: small inputs only.
//
//   const NaiveBpe reference = NaiveBpeTrain(text, 256 + 64, 2);
//   EXPECT_EQ(tokenizer.merges(), reference.merges);
#ifndef LOSSRT_TESTS_DATA_NAIVE_BPE_H_
#define LOSSRT_TESTS_DATA_NAIVE_BPE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "data/bpe_tokenizer.h"
#include "data/pretokenizer.h"

namespace lossrt {
namespace data {

struct NaiveBpe {
  std::vector<BpeTokenizer::Merge> merges;
  // Each unique word of the text and its tokens after the last merge.
  std::map<std::string, std::vector<int32_t>> segmentation;
};

inline NaiveBpe NaiveBpeTrain(absl::string_view text, int vocab_size,
                              int64_t min_frequency) {
  using Merge = BpeTokenizer::Merge;
  std::map<std::string, int64_t> counts;
  ForEachWord(text,
              [&](absl::string_view word) { ++counts[std::string(word)]; });
  std::map<std::string, std::vector<int32_t>> words;
  for (const auto& [word, count] : counts) {
    for (const unsigned char c : word) words[word].push_back(c);
  }
  NaiveBpe reference;
  while (256 + static_cast<int>(reference.merges.size()) < vocab_size) {
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
    const int32_t id = 256 + static_cast<int32_t>(reference.merges.size());
    reference.merges.push_back(best);
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
  reference.segmentation = std::move(words);
  return reference;
}

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_TESTS_DATA_NAIVE_BPE_H_
