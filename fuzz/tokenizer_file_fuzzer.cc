// Fuzz target of the saved-tokenizer loader (data/tokenizer_file.h, through
// LoadTokenizer and BpeTokenizer::Load), two ways:
//  - the input is written as a tokenizer file. A refused file is
//    InvalidArgument naming the file; an accepted one is a byte or BPE
//    tokenizer whose every token is at most one pre-tokenizer word long, that
//    encodes the input itself to ids in range and decodes them back, and that
//    saves and loads back to the same tokenizer;
//  - the input, read as 4-byte merges (two ids, see PickId), is written as a
//    well-formed BPE file: the loader must accept it exactly when a simple
//    model says the merges are valid (no repeated pair, no token longer than
//    kMaxWordBytes), naming the first bad merge otherwise.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/bpe_tokenizer.h"
#include "data/pretokenizer.h"
#include "data/tokenizer.h"
#include "data/tokenizer_file.h"
#include "fuzz/fuzz_util.h"

namespace lossrt {
namespace {

void CheckRefusal(const absl::Status& status, const std::string& path) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  // "<path>:<line>: ..." or "'<path>' is not a lossrt tokenizer file ...".
  FUZZ_CHECK(status.message().find(path) != std::string::npos);
}

// Loads `bytes` as a tokenizer file and checks the result (see the top).
// Returns whether it was accepted.
bool CheckFile(const std::string& bytes) {
  const std::string path = fuzz::ScratchPath("tokenizer.txt");
  fuzz::WriteScratchFile(path, bytes);

  absl::StatusOr<std::unique_ptr<data::Tokenizer>> loaded =
      data::LoadTokenizer(path);
  absl::StatusOr<data::BpeTokenizer> bpe = data::BpeTokenizer::Load(path);
  if (!loaded.ok()) {
    CheckRefusal(loaded.status(), path);
    FUZZ_CHECK(!bpe.ok());
    CheckRefusal(bpe.status(), path);
    return false;
  }
  const data::Tokenizer& tokenizer = **loaded;
  FUZZ_CHECK(tokenizer.kind() == "byte" || tokenizer.kind() == "bpe");
  FUZZ_CHECK(bpe.ok() == (tokenizer.kind() == "bpe"));
  if (bpe.ok()) {
    FUZZ_CHECK(bpe->vocab_size() == tokenizer.vocab_size());
    FUZZ_CHECK(bpe->Encode(bytes) == tokenizer.Encode(bytes));
  }
  const int vocab = tokenizer.vocab_size();
  FUZZ_CHECK(vocab >= 256 && vocab <= data::kMaxBpeVocabSize);
  for (int32_t id = 0; id < vocab; ++id) {
    absl::StatusOr<std::string> token = tokenizer.TokenBytes(id);
    FUZZ_CHECK_OK(token.status());
    FUZZ_CHECK(!token->empty() &&
               token->size() <= static_cast<size_t>(data::kMaxWordBytes));
  }
  FUZZ_CHECK(!tokenizer.TokenBytes(vocab).ok());

  const std::vector<int32_t> ids = tokenizer.Encode(bytes);
  for (const int32_t id : ids) FUZZ_CHECK(id >= 0 && id < vocab);
  absl::StatusOr<std::string> decoded = tokenizer.Decode(ids);
  FUZZ_CHECK_OK(decoded.status());
  FUZZ_CHECK(*decoded == bytes);

  const std::string copy = lossrt::fuzz::ScratchPath("copy.txt");
  FUZZ_CHECK_OK(tokenizer.Save(copy));
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> again =
      data::LoadTokenizer(copy);
  FUZZ_CHECK_OK(again.status());
  FUZZ_CHECK((*again)->kind() == tokenizer.kind());
  FUZZ_CHECK((*again)->vocab_size() == vocab);
  if (bpe.ok()) {
    absl::StatusOr<data::BpeTokenizer> bpe_again =
        data::BpeTokenizer::Load(copy);
    FUZZ_CHECK_OK(bpe_again.status());
    FUZZ_CHECK(bpe_again->merges() == bpe->merges());
  }
  return true;
}

// An id below `ids` from two input bytes (little-endian): the low 15 bits
// modulo `ids`, counted from 0, or back from the newest id when the top bit is
// set (so that chains of merges of recent tokens are a short pattern away).
int PickId(uint8_t low, uint8_t high, size_t ids) {
  const int offset = static_cast<int>((low | ((high & 0x7F) << 8)) % ids);
  return (high & 0x80) != 0 ? static_cast<int>(ids) - 1 - offset : offset;
}

// The structured half (see the top).
void CheckMerges(const uint8_t* input, size_t size) {
  std::string file =
      absl::StrCat(data::kTokenizerMagicLine, "\nkind bpe\npretokenizer ",
                   data::kPretokenizerName, "\n");
  std::string lines;
  std::vector<int> token_bytes(256, 1);
  std::set<std::pair<int, int>> seen;
  int64_t first_bad = -1;  // the first merge the model refuses
  const size_t count = size / 4;
  for (size_t i = 0; i < count; ++i) {
    const int left = PickId(input[4 * i], input[4 * i + 1], 256 + i);
    const int right = PickId(input[4 * i + 2], input[4 * i + 3], 256 + i);
    absl::StrAppend(&lines, left, " ", right, "\n");
    // Past the limit the length no longer matters (and would overflow).
    const int bytes = std::min(token_bytes[left] + token_bytes[right],
                               data::kMaxWordBytes + 1);
    token_bytes.push_back(bytes);
    if (first_bad < 0 &&
        (!seen.insert({left, right}).second || bytes > data::kMaxWordBytes)) {
      first_bad = static_cast<int64_t>(i);
    }
  }
  absl::StrAppend(&file, "vocab_size ", 256 + count, "\nmerges ", count, "\n",
                  lines, "end\n");
  const std::string path = fuzz::ScratchPath("tokenizer.txt");
  if (first_bad < 0) {
    FUZZ_CHECK(CheckFile(file));
    return;
  }
  fuzz::WriteScratchFile(path, file);
  const absl::Status status = data::LoadTokenizer(path).status();
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  // Lines 1-5 are the header: merge i is on line 6 + i.
  FUZZ_CHECK(status.message().find(absl::StrCat(path, ":", 6 + first_bad,
                                                ": merge ", first_bad, " ")) !=
             std::string::npos);
}

}  // namespace
}  // namespace lossrt

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lossrt::CheckFile(std::string(reinterpret_cast<const char*>(data), size));
  lossrt::CheckMerges(data, size);
  return 0;
}
