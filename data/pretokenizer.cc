// SplitWords: the vector form of ForEachWord (pretokenizer.h).
#include "data/pretokenizer.h"

namespace lossrt {
namespace data {

std::vector<absl::string_view> SplitWords(absl::string_view text) {
  std::vector<absl::string_view> words;
  ForEachWord(text, [&](absl::string_view word) { words.push_back(word); });
  return words;
}

}  // namespace data
}  // namespace lossrt
