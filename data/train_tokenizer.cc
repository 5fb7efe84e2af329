// train_tokenizer: trains the byte-level BPE tokenizer on a text corpus, saves
// it, reports training time and compression, and optionally writes the
// encoded corpus as an llm.c token shard.
//
//   ./bazelw run -c opt //data:train_tokenizer -- --vocab=8192
//       --out=/tmp/tokenizer.txt [--corpus=/usr/share/games/fortunes]
//       [--min_frequency=2] [--shard=/tmp/corpus.bin]
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "runtime/status.h"

namespace lossrt {
namespace data {
namespace {

struct Flags {
  std::string corpus = kDefaultCorpus;
  int vocab = 8192;
  int64_t min_frequency = 2;
  std::string out;
  std::string shard;
};

absl::Status ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    auto value = [&](absl::string_view name) -> const char* {
      const std::string prefix = absl::StrCat("--", name, "=");
      return absl::StartsWith(arg, prefix) ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("corpus")) {
      flags->corpus = v;
    } else if (const char* v = value("out")) {
      flags->out = v;
    } else if (const char* v = value("shard")) {
      flags->shard = v;
    } else if (const char* v = value("vocab")) {
      if (!absl::SimpleAtoi(v, &flags->vocab)) {
        return InvalidArgument("--vocab needs an integer, got '", v, "'");
      }
    } else if (const char* v = value("min_frequency")) {
      if (!absl::SimpleAtoi(v, &flags->min_frequency)) {
        return InvalidArgument("--min_frequency needs an integer, got '", v,
                               "'");
      }
    } else {
      return InvalidArgument(
          "unknown argument '", arg,
          "'; flags: --corpus=PATH --vocab=N --min_frequency=N --out=PATH "
          "--shard=PATH");
    }
  }
  return absl::OkStatus();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::Status Run(int argc, char** argv) {
  Flags flags;
  RETURN_IF_ERROR(ParseFlags(argc, argv, &flags));
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const std::string text, ReadTextCorpus(flags.corpus));
  std::printf("corpus %s: %zu bytes (read in %.2f s)\n", flags.corpus.c_str(),
              text.size(), SecondsSince(start));

  BpeTrainOptions options;
  options.min_frequency = flags.min_frequency;
  start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const BpeTokenizer tokenizer,
                   BpeTokenizer::Train(text, flags.vocab, options));
  const double train_seconds = SecondsSince(start);

  start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tokenizer.Encode(text);
  const double encode_seconds = SecondsSince(start);
  ASSIGN_OR_RETURN(const std::string decoded, tokenizer.Decode(ids));
  if (decoded != text) {
    return absl::InternalError("the corpus does not round-trip");
  }
  std::printf(
      "bpe: vocab %d (asked %d), trained in %.2f s; encode %.2f s: %zu tokens, "
      "%.3f bytes/token; round trip ok\n",
      tokenizer.vocab_size(), flags.vocab, train_seconds, encode_seconds,
      ids.size(), static_cast<double>(text.size()) / ids.size());
  if (!flags.out.empty()) {
    RETURN_IF_ERROR(tokenizer.Save(flags.out));
    std::printf("saved %s\n", flags.out.c_str());
  }
  if (!flags.shard.empty()) {
    RETURN_IF_ERROR(WriteTokenShard(flags.shard, ids));
    std::printf("wrote %s\n", flags.shard.c_str());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace data
}  // namespace lossrt

int main(int argc, char** argv) {
  const absl::Status status = lossrt::data::Run(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "train_tokenizer: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
