// Fuzz target of BPE training on arbitrary bytes (data/bpe_tokenizer.h): the
// first two input bytes pick the vocabulary size (256 to 256 + 1023) and the
// minimum pair frequency (1 to 4), the rest is the training text. Training
// must succeed within the asked vocabulary with valid merges (FromMerges
// accepts them), match the naive reference trainer (tests/data/naive_bpe.h) on
// small cases, encode every training word to the segmentation
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
#include "tests/data/naive_bpe.h"

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
    const lossrt::data::NaiveBpe reference =
        lossrt::data::NaiveBpeTrain(text, vocab_size, options.min_frequency);
    FUZZ_CHECK(tokenizer->merges() == reference.merges);
    for (const auto& [word, tokens] : reference.segmentation) {
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
