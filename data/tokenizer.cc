// Tokenizer's shared methods, ByteTokenizer, and LoadTokenizer.
#include "data/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "data/bpe_tokenizer.h"
#include "data/file_util.h"
#include "data/tokenizer_file.h"
#include "runtime/status.h"

namespace lossrt {
namespace data {

absl::StatusOr<std::string> Tokenizer::Decode(
    absl::Span<const int32_t> ids) const {
  const int vocab = vocab_size();
  size_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidArgument("token id ", ids[i], " at position ", i,
                             " is outside [0, ", vocab, ") of this ", kind(),
                             " tokenizer");
    }
    bytes += TokenBytesUnchecked(ids[i]).size();
  }
  std::string text;
  text.reserve(bytes);
  for (const int32_t id : ids) {
    const absl::string_view piece = TokenBytesUnchecked(id);
    text.append(piece.data(), piece.size());
  }
  return text;
}

absl::StatusOr<std::string> Tokenizer::TokenBytes(int32_t id) const {
  return Decode(absl::MakeConstSpan(&id, 1));
}

ByteTokenizer::ByteTokenizer() {
  bytes_.resize(256);
  for (int i = 0; i < 256; ++i) bytes_[i] = static_cast<char>(i);
}

std::vector<int32_t> ByteTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    ids[i] = static_cast<unsigned char>(text[i]);
  }
  return ids;
}

absl::string_view ByteTokenizer::TokenBytesUnchecked(int32_t id) const {
  return absl::string_view(bytes_).substr(id, 1);
}

absl::Status ByteTokenizer::Save(const std::string& path) const {
  return WriteStringToFile(
      path,
      absl::StrCat(kTokenizerMagicLine, "\nkind byte\nvocab_size 256\nend\n"));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& path) {
  ASSIGN_OR_RETURN(TokenizerFileReader reader, TokenizerFileReader::Open(path));
  ASSIGN_OR_RETURN(absl::string_view kind, reader.Field("kind"));
  if (kind == "byte") {
    RETURN_IF_ERROR(reader.IntField("vocab_size", 256, 256).status());
    RETURN_IF_ERROR(reader.ExpectEnd());
    return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  }
  if (kind == "bpe") {
    ASSIGN_OR_RETURN(BpeTokenizer bpe, tokenizer_internal::ReadBpeBody(reader));
    return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(bpe)));
  }
  return reader.Error(absl::StrCat("unknown tokenizer kind \"",
                                   kind.substr(0, 80),
                                   "\" (known: byte, bpe)"));
}

}  // namespace data
}  // namespace lossrt
