// Pre-tokenization of the byte-level BPE tokenizer: text is cut into "words"
// (GPT-2-like, simplified) and BPE merges never cross a word boundary.
//
//   for (absl::string_view word : SplitWords("Hello, world!\n")) ...
//   // "Hello" "," " world" "!" "\n"
//
// Rules ("words-v1"), on bytes:
//  - classes: letters (A-Z, a-z and every byte >= 0x80, so that UTF-8
//    sequences stay inside words), digits (0-9), whitespace (space, \t, \n,
//    \v, \f, \r) and other (punctuation, symbols, control bytes);
//  - a word is a run of letters, a run of digits or a run of other bytes,
//    with at most one leading space (0x20) attached;
//  - a run of whitespace is a word of its own, except that when it is longer
//    than one byte, ends with a space and is followed by a non-whitespace
//    byte, that last space goes to the next word ("a   b" -> "a" "  " " b");
//  - no word is longer than kMaxWordBytes: longer runs are cut into pieces of
//    kMaxWordBytes (the last one shorter).
// There are no special cases for contractions ("don't" -> "don" "'" "t").
// The words concatenate back to the input exactly, for any bytes.
#ifndef LOSSRT_DATA_PRETOKENIZER_H_
#define LOSSRT_DATA_PRETOKENIZER_H_

#include <vector>

#include "absl/strings/string_view.h"

namespace lossrt {
namespace data {

// The name of the rules above, recorded in saved tokenizers.
inline constexpr char kPretokenizerName[] = "words-v1";

// The longest word SplitWords makes, in bytes.
inline constexpr int kMaxWordBytes = 64;

// Calls `visit(absl::string_view word)` for every word of `text`, in order.
template <typename Visit>
void ForEachWord(absl::string_view text, Visit&& visit);

// The words of `text`, in order (views into `text`).
std::vector<absl::string_view> SplitWords(absl::string_view text);

// ---------------------------------------------------------------------------
// Implementation.

namespace pretokenizer_internal {

enum ByteClass : unsigned char { kLetter, kDigit, kSpace, kOther };

inline ByteClass ClassOf(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) {
    return kLetter;
  }
  if (c >= '0' && c <= '9') return kDigit;
  if (c == ' ' || (c >= '\t' && c <= '\r')) return kSpace;
  return kOther;
}

}  // namespace pretokenizer_internal

template <typename Visit>
void ForEachWord(absl::string_view text, Visit&& visit) {
  using pretokenizer_internal::ClassOf;
  using pretokenizer_internal::kSpace;
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // Emits [start, end) in pieces of at most kMaxWordBytes.
  auto emit = [&](size_t start, size_t end) {
    while (end - start > static_cast<size_t>(kMaxWordBytes)) {
      visit(text.substr(start, kMaxWordBytes));
      start += kMaxWordBytes;
    }
    visit(text.substr(start, end - start));
  };
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    if (bytes[i] == ' ' && i + 1 < n && ClassOf(bytes[i + 1]) != kSpace) {
      ++i;  // the leading space joins the run that follows
    }
    const auto cls = ClassOf(bytes[i]);
    if (cls != kSpace) {
      while (i < n && ClassOf(bytes[i]) == cls) ++i;
      emit(start, i);
      continue;
    }
    while (i < n && ClassOf(bytes[i]) == kSpace) ++i;
    if (i < n && i - start >= 2 && bytes[i - 1] == ' ') --i;
    emit(start, i);
  }
}

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_DATA_PRETOKENIZER_H_
