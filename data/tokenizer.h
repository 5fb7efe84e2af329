// Tokenizers: the abstract Tokenizer (text <-> token ids), the 256-token
// ByteTokenizer, and LoadTokenizer, which reads any saved tokenizer back.
// The trainable byte-level BPE tokenizer is in data/bpe_tokenizer.h.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<lossrt::data::Tokenizer> tokenizer,
//                    lossrt::data::LoadTokenizer("run/tokenizer.txt"));
//   std::vector<int32_t> ids = tokenizer->Encode("Hello, world!\n");
//   ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(ids));  // the input
//
// Every tokenizer here is byte-level: any bytes (invalid UTF-8 included)
// encode, and Decode(Encode(s)) == s. Encode and Decode are const and
// thread-safe.
//
// Saved file format (text, one item per line, "\n" line ends, ASCII):
//   lossrt-tokenizer 1          magic and format version
//   kind <kind>                 "byte" or "bpe"
//   ... kind-specific lines (see ByteTokenizer and BpeTokenizer) ...
//   end
// Anything else (another version, a missing or extra line, a bad number)
// makes loading fail with an error that names the file and the line.
#ifndef LOSSRT_DATA_TOKENIZER_H_
#define LOSSRT_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lossrt {
namespace data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The kind written in saved files: "byte" or "bpe".
  virtual absl::string_view kind() const = 0;

  // Number of token ids: ids are in [0, vocab_size()).
  virtual int vocab_size() const = 0;

  // The token ids of `text` (any bytes).
  virtual std::vector<int32_t> Encode(absl::string_view text) const = 0;

  // The bytes of `ids` concatenated. InvalidArgument (naming the position)
  // when an id is outside [0, vocab_size()).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  // The bytes of one token (InvalidArgument when out of range).
  absl::StatusOr<std::string> TokenBytes(int32_t id) const;

  // Writes the tokenizer to `path` in the format above.
  virtual absl::Status Save(const std::string& path) const = 0;

 protected:
  // The bytes of token `id`, 0 <= id < vocab_size().
  virtual absl::string_view TokenBytesUnchecked(int32_t id) const = 0;
};

// One token per byte value: id = byte. Its file has the lines
// "vocab_size 256" and "end" after the kind.
class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer();

  absl::string_view kind() const override { return "byte"; }
  int vocab_size() const override { return 256; }
  std::vector<int32_t> Encode(absl::string_view text) const override;
  absl::Status Save(const std::string& path) const override;

 protected:
  absl::string_view TokenBytesUnchecked(int32_t id) const override;

 private:
  std::string bytes_;  // the 256 byte values in order
};

// Reads a tokenizer saved by Tokenizer::Save, whatever its kind. NotFound when
// the file does not exist; InvalidArgument (naming the file and line) when it
// is not a valid tokenizer file.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& path);

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_DATA_TOKENIZER_H_
