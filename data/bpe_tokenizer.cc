// Byte-level BPE: training with incremental pair counts, encoding by merge
// rank, and the saved-file format.
#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <queue>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "data/file_util.h"
#include "data/pretokenizer.h"
#include "data/tokenizer_file.h"
#include "runtime/status.h"

namespace lossrt {
namespace data {
namespace {

// A pair of token ids as one key; keys order like (left, right).
inline uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}
inline int32_t KeyLeft(uint64_t key) { return static_cast<int32_t>(key >> 32); }
inline int32_t KeyRight(uint64_t key) {
  return static_cast<int32_t>(key & 0xFFFFFFFFu);
}

// A candidate merge in the training heap. Entries go stale when the pair's
// count changes (a fresh entry is pushed then); stale ones are skipped when
// popped.
struct HeapEntry {
  int64_t count;
  uint64_t key;
};
// Max-heap order: the higher count first, then the smaller (left, right).
struct HeapBelow {
  bool operator()(const HeapEntry& x, const HeapEntry& y) const {
    if (x.count != y.count) return x.count < y.count;
    return x.key > y.key;
  }
};

// The training state: every unique word (of two bytes or more) as its current
// tokens, its frequency, the count of each adjacent pair over all words, and
// for each pair the words that may contain it (a superset: words are not
// removed from a list when the pair leaves them).
class BpeTrainer {
 public:
  BpeTrainer(absl::string_view text, int64_t min_frequency)
      : min_frequency_(min_frequency) {
    absl::flat_hash_map<absl::string_view, int64_t> word_counts;
    ForEachWord(text, [&](absl::string_view word) {
      if (word.size() >= 2) ++word_counts[word];
    });
    // Sorted, so that the word numbering (hence every list) is deterministic.
    std::vector<std::pair<absl::string_view, int64_t>> unique(
        word_counts.begin(), word_counts.end());
    std::sort(unique.begin(), unique.end());
    words_.reserve(unique.size());
    counts_.reserve(unique.size());
    for (const auto& [word, count] : unique) {
      const int32_t w = static_cast<int32_t>(words_.size());
      std::vector<int32_t> tokens(word.begin(), word.end());
      for (int32_t& token : tokens) token = static_cast<unsigned char>(token);
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        const uint64_t key = PairKey(tokens[i], tokens[i + 1]);
        pair_counts_[key] += count;
        std::vector<int32_t>& list = where_[key];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
      words_.push_back(std::move(tokens));
      counts_.push_back(count);
    }
    std::vector<HeapEntry> entries;
    entries.reserve(pair_counts_.size());
    for (const auto& [key, count] : pair_counts_) {
      entries.push_back({count, key});
    }
    heap_ = std::priority_queue<HeapEntry, std::vector<HeapEntry>, HeapBelow>(
        HeapBelow(), std::move(entries));
  }

  // Picks the next merge and applies it, making token `new_id`. False when no
  // pair occurs min_frequency times.
  bool MergeOnce(int32_t new_id, BpeTokenizer::Merge* merge) {
    uint64_t key = 0;
    for (;;) {
      if (heap_.empty()) return false;
      const HeapEntry top = heap_.top();
      heap_.pop();
      const auto it = pair_counts_.find(top.key);
      if (it == pair_counts_.end() || it->second != top.count) continue;
      if (top.count < min_frequency_) return false;
      key = top.key;
      break;
    }
    const int32_t a = KeyLeft(key), b = KeyRight(key);
    *merge = {a, b};
    std::vector<int32_t> list;
    if (auto it = where_.find(key); it != where_.end()) {
      list = std::move(it->second);
      where_.erase(it);
    }
    delta_.clear();
    for (const int32_t w : list) {
      std::vector<int32_t>& tokens = words_[w];
      bool found = false;
      for (size_t i = 0; i + 1 < tokens.size() && !found; ++i) {
        found = tokens[i] == a && tokens[i + 1] == b;
      }
      if (!found) continue;  // the pair left this word in an earlier merge
      // Words are short (kMaxWordBytes): take out all their pairs, merge, put
      // the new pairs back. Only net changes reach the counts and the heap.
      const int64_t count = counts_[w];
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        delta_[PairKey(tokens[i], tokens[i + 1])] -= count;
      }
      size_t out = 0;
      for (size_t i = 0; i < tokens.size();) {
        if (i + 1 < tokens.size() && tokens[i] == a && tokens[i + 1] == b) {
          tokens[out++] = new_id;
          i += 2;
        } else {
          tokens[out++] = tokens[i++];
        }
      }
      tokens.resize(out);
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        const uint64_t pair = PairKey(tokens[i], tokens[i + 1]);
        delta_[pair] += count;
        // Pairs without the new token were in this word before, so the word
        // is already on their lists.
        if (tokens[i] == new_id || tokens[i + 1] == new_id) {
          std::vector<int32_t>& pair_list = where_[pair];
          if (pair_list.empty() || pair_list.back() != w) {
            pair_list.push_back(w);
          }
        }
      }
    }
    for (const auto& [pair, change] : delta_) {
      if (change == 0) continue;
      auto it = pair_counts_.find(pair);
      const int64_t count =
          (it == pair_counts_.end() ? 0 : it->second) + change;
      if (count <= 0) {
        if (it != pair_counts_.end()) pair_counts_.erase(it);
        continue;
      }
      if (it == pair_counts_.end()) {
        pair_counts_.emplace(pair, count);
      } else {
        it->second = count;
      }
      heap_.push({count, pair});
    }
    return true;
  }

 private:
  const int64_t min_frequency_;
  std::vector<std::vector<int32_t>> words_;  // current tokens of each word
  std::vector<int64_t> counts_;              // frequency of each word
  absl::flat_hash_map<uint64_t, int64_t> pair_counts_;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> where_;
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, HeapBelow> heap_;
  absl::flat_hash_map<uint64_t, int64_t> delta_;  // scratch of MergeOnce
};

// What FromMerges checks of each merge, for it and for the file reader: the
// ids, repeats, and the length of the token the merge makes.
class MergeChecker {
 public:
  MergeChecker() : token_bytes_(256, 1) {}

  // Checks the next merge (number 0, then 1, ...) and accepts it when valid;
  // `error` builds the error from its message.
  template <typename Error>
  absl::Status Add(const BpeTokenizer::Merge& merge, Error&& error) {
    const size_t index = token_bytes_.size() - 256;
    const int64_t limit = static_cast<int64_t>(token_bytes_.size());
    if (merge.first < 0 || merge.first >= limit || merge.second < 0 ||
        merge.second >= limit) {
      return error(absl::StrCat("merge ", index, " (", merge.first, ", ",
                                merge.second, ") uses an id outside [0, ",
                                limit, ")"));
    }
    const uint64_t key = PairKey(merge.first, merge.second);
    if (seen_.contains(key)) {
      return error(absl::StrCat("merge ", index, " (", merge.first, ", ",
                                merge.second, ") repeats an earlier merge"));
    }
    // No word is longer than kMaxWordBytes, so a longer token could never be
    // used; and without the limit a few dozen merges that each join the last
    // token to itself would ask for a token of gigabytes.
    const int bytes = token_bytes_[merge.first] + token_bytes_[merge.second];
    if (bytes > kMaxWordBytes) {
      return error(absl::StrCat("merge ", index, " (", merge.first, ", ",
                                merge.second, ") makes a token of ", bytes,
                                " bytes, longer than the longest word (",
                                kMaxWordBytes, " bytes)"));
    }
    seen_.insert(key);
    token_bytes_.push_back(bytes);
    return absl::OkStatus();
  }

 private:
  absl::flat_hash_set<uint64_t> seen_;
  std::vector<int> token_bytes_;  // [256 + merges accepted]: bytes per token
};

}  // namespace

BpeTokenizer::BpeTokenizer(std::vector<Merge> merges)
    : merges_(std::move(merges)) {
  token_bytes_.reserve(256 + merges_.size());
  for (int byte = 0; byte < 256; ++byte) {
    token_bytes_.push_back(std::string(1, static_cast<char>(byte)));
  }
  rank_.reserve(merges_.size());
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [left, right] = merges_[i];
    rank_.emplace(PairKey(left, right), static_cast<int32_t>(i));
    token_bytes_.push_back(token_bytes_[left] + token_bytes_[right]);
  }
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::Train(
    absl::string_view text, int vocab_size, const BpeTrainOptions& options) {
  if (vocab_size < 256 || vocab_size > kMaxBpeVocabSize) {
    return InvalidArgument("BPE vocab_size must be in [256, ", kMaxBpeVocabSize,
                           "], got ", vocab_size);
  }
  if (options.min_frequency < 1) {
    return InvalidArgument("BpeTrainOptions::min_frequency must be >= 1, got ",
                           options.min_frequency);
  }
  std::vector<Merge> merges;
  if (vocab_size > 256) {
    BpeTrainer trainer(text, options.min_frequency);
    merges.reserve(vocab_size - 256);
    Merge merge;
    while (
        static_cast<int>(merges.size()) < vocab_size - 256 &&
        trainer.MergeOnce(256 + static_cast<int32_t>(merges.size()), &merge)) {
      merges.push_back(merge);
    }
  }
  return BpeTokenizer(std::move(merges));
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromMerges(
    std::vector<Merge> merges) {
  if (merges.size() > static_cast<size_t>(kMaxBpeVocabSize - 256)) {
    return InvalidArgument("too many BPE merges: ", merges.size(), " > ",
                           kMaxBpeVocabSize - 256);
  }
  MergeChecker checker;
  auto error = [](const std::string& message) {
    return absl::InvalidArgumentError(message);
  };
  for (const Merge& merge : merges) {
    RETURN_IF_ERROR(checker.Add(merge, error));
  }
  return BpeTokenizer(std::move(merges));
}

void BpeTokenizer::EncodeWord(absl::string_view word,
                              std::vector<int32_t>* ids) const {
  // Words are at most kMaxWordBytes long (pretokenizer.h), so the quadratic
  // scan below stays cheap; callers cache the result per unique word.
  int32_t tokens[kMaxWordBytes];
  size_t n = 0;
  for (const char c : word.substr(0, kMaxWordBytes)) {
    tokens[n++] = static_cast<unsigned char>(c);
  }
  while (n >= 2) {
    // The lowest-ranked pair present; merging it makes only pairs of higher
    // rank, so this applies the merges in training order.
    int32_t best_rank = -1;
    for (size_t i = 0; i + 1 < n; ++i) {
      const auto it = rank_.find(PairKey(tokens[i], tokens[i + 1]));
      if (it != rank_.end() && (best_rank < 0 || it->second < best_rank)) {
        best_rank = it->second;
      }
    }
    if (best_rank < 0) break;
    const auto [a, b] = merges_[best_rank];
    const int32_t merged = 256 + best_rank;
    size_t out = 0;
    for (size_t i = 0; i < n;) {
      if (i + 1 < n && tokens[i] == a && tokens[i + 1] == b) {
        tokens[out++] = merged;
        i += 2;
      } else {
        tokens[out++] = tokens[i++];
      }
    }
    n = out;
  }
  ids->insert(ids->end(), tokens, tokens + n);
}

std::vector<int32_t> BpeTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  // Per call (so Encode stays const and thread-safe): each unique word's
  // tokens, as [offset, offset + length) in `cached`.
  absl::flat_hash_map<absl::string_view, std::pair<uint32_t, uint32_t>> cache;
  std::vector<int32_t> cached;
  ForEachWord(text, [&](absl::string_view word) {
    if (word.size() == 1) {
      ids.push_back(static_cast<unsigned char>(word[0]));
      return;
    }
    auto [it, inserted] = cache.try_emplace(word);
    if (inserted) {
      const size_t offset = cached.size();
      EncodeWord(word, &cached);
      it->second = {static_cast<uint32_t>(offset),
                    static_cast<uint32_t>(cached.size() - offset)};
    }
    ids.insert(ids.end(), cached.begin() + it->second.first,
               cached.begin() + it->second.first + it->second.second);
  });
  return ids;
}

absl::Status BpeTokenizer::Save(const std::string& path) const {
  std::string out = absl::StrCat(
      kTokenizerMagicLine, "\nkind bpe\npretokenizer ", kPretokenizerName,
      "\nvocab_size ", vocab_size(), "\nmerges ", merges_.size(), "\n");
  for (const auto& [left, right] : merges_) {
    absl::StrAppend(&out, left, " ", right, "\n");
  }
  out += "end\n";
  return WriteStringToFile(path, out);
}

namespace tokenizer_internal {

absl::StatusOr<BpeTokenizer> ReadBpeBody(TokenizerFileReader& reader) {
  ASSIGN_OR_RETURN(absl::string_view pretokenizer,
                   reader.Field("pretokenizer"));
  if (pretokenizer != kPretokenizerName) {
    return reader.Error(absl::StrCat("unknown pretokenizer \"", pretokenizer,
                                     "\" (this build knows \"",
                                     kPretokenizerName, "\")"));
  }
  ASSIGN_OR_RETURN(const int64_t vocab_size,
                   reader.IntField("vocab_size", 256, kMaxBpeVocabSize));
  ASSIGN_OR_RETURN(const int64_t count,
                   reader.IntField("merges", 0, kMaxBpeVocabSize - 256));
  if (count != vocab_size - 256) {
    return reader.Error(absl::StrCat("merges ", count,
                                     " does not match vocab_size ", vocab_size,
                                     " (which needs ", vocab_size - 256, ")"));
  }
  std::vector<BpeTokenizer::Merge> merges;
  MergeChecker checker;
  auto error = [&reader](const std::string& message) {
    return reader.Error(message);
  };
  for (int64_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(const auto pair, reader.IntPair(0, kMaxBpeVocabSize));
    const BpeTokenizer::Merge merge(static_cast<int32_t>(pair.first),
                                    static_cast<int32_t>(pair.second));
    RETURN_IF_ERROR(checker.Add(merge, error));
    merges.push_back(merge);
  }
  RETURN_IF_ERROR(reader.ExpectEnd());
  return BpeTokenizer::FromMerges(std::move(merges));
}

}  // namespace tokenizer_internal

absl::StatusOr<BpeTokenizer> BpeTokenizer::Load(const std::string& path) {
  ASSIGN_OR_RETURN(TokenizerFileReader reader, TokenizerFileReader::Open(path));
  ASSIGN_OR_RETURN(absl::string_view kind, reader.Field("kind"));
  if (kind != "bpe") {
    return reader.Error(absl::StrCat("kind is \"", kind, "\", not \"bpe\""));
  }
  return tokenizer_internal::ReadBpeBody(reader);
}

}  // namespace data
}  // namespace lossrt
