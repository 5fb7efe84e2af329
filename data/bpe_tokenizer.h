// A byte-level BPE tokenizer trained on the corpus itself: the base vocabulary
// is the 256 byte values, and each merge adds one token (the concatenation of
// two existing ones). Text is first cut into words (data/pretokenizer.h) and
// merges never cross a word boundary.
//
//   ASSIGN_OR_RETURN(std::string text, lossrt::data::ReadTextCorpus(path));
//   ASSIGN_OR_RETURN(lossrt::data::BpeTokenizer tokenizer,
//                    lossrt::data::BpeTokenizer::Train(text, 8192));
//   std::vector<int32_t> ids = tokenizer.Encode(text);
//   RETURN_IF_ERROR(tokenizer.Save("run/tokenizer.txt"));
//
// Training counts the unique words once, then repeatedly merges the most
// frequent adjacent pair of tokens (counted over the words, weighted by word
// frequency), keeping the pair counts up to date incrementally. Ties go to the
// pair with the smaller (left id, right id). Merge i creates token 256 + i.
// Encoding applies the merges within each word by rank (lowest first,
// leftmost first), which reproduces the training segmentation.
//
// File lines after "kind bpe" (see data/tokenizer.h for the frame):
//   pretokenizer words-v1       the pre-tokenization rules
//   vocab_size <V>              256 + number of merges
//   merges <M>
//   <left> <right>              M lines: merge i makes token 256 + i from two
//                               ids < 256 + i (checked as in FromMerges)
//   end
#ifndef LOSSRT_DATA_BPE_TOKENIZER_H_
#define LOSSRT_DATA_BPE_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/tokenizer.h"

namespace lossrt {
namespace data {

class TokenizerFileReader;  // data/tokenizer_file.h

struct BpeTrainOptions {
  // Merging stops when the most frequent pair occurs fewer times than this
  // (>= 1); the vocabulary is then smaller than asked for.
  int64_t min_frequency = 2;
};

// Largest vocabulary BpeTokenizer trains or loads.
inline constexpr int kMaxBpeVocabSize = 1 << 20;

class BpeTokenizer final : public Tokenizer {
 public:
  using Merge = std::pair<int32_t, int32_t>;  // (left id, right id)

  // Trains on `text` up to `vocab_size` tokens (in [256, kMaxBpeVocabSize];
  // 256 means no merge). The result has vocab_size() <= `vocab_size`: less
  // when no pair occurs min_frequency times any more.
  static absl::StatusOr<BpeTokenizer> Train(
      absl::string_view text, int vocab_size,
      const BpeTrainOptions& options = BpeTrainOptions());

  // A tokenizer from its merges: merge i makes token 256 + i and must join
  // two ids below 256 + i into a token of at most kMaxWordBytes bytes (the
  // longest word, data/pretokenizer.h: a longer token could never be used);
  // no pair may appear twice. Trained merges always pass.
  static absl::StatusOr<BpeTokenizer> FromMerges(std::vector<Merge> merges);

  // Reads a file written by Save (LoadTokenizer reads any kind).
  static absl::StatusOr<BpeTokenizer> Load(const std::string& path);

  absl::string_view kind() const override { return "bpe"; }
  int vocab_size() const override {
    return 256 + static_cast<int>(merges_.size());
  }
  std::vector<int32_t> Encode(absl::string_view text) const override;
  absl::Status Save(const std::string& path) const override;

  // The merges in rank order.
  const std::vector<Merge>& merges() const { return merges_; }

 protected:
  absl::string_view TokenBytesUnchecked(int32_t id) const override {
    return token_bytes_[id];
  }

 private:
  explicit BpeTokenizer(std::vector<Merge> merges);

  // Appends the tokens of one pre-tokenized word to `ids`.
  void EncodeWord(absl::string_view word, std::vector<int32_t>* ids) const;

  std::vector<Merge> merges_;
  absl::flat_hash_map<uint64_t, int32_t> rank_;  // pair key -> merge index
  std::vector<std::string> token_bytes_;         // [vocab_size]
};

namespace tokenizer_internal {
// Internal, for LoadTokenizer: the lines of a BPE file after "kind bpe".
absl::StatusOr<BpeTokenizer> ReadBpeBody(TokenizerFileReader& reader);
}  // namespace tokenizer_internal

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_DATA_BPE_TOKENIZER_H_
