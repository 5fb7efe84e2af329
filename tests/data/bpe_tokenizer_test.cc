// Tests of data/bpe_tokenizer.h: training against a naive reference (recount
// every pair at every merge), a hand-checked tiny example, encoding equal to
// the training segmentation, round trips on any bytes, compression, save/load
// and corrupt files, and the real fortunes corpus when it is installed.
#include "data/bpe_tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "data/corpus.h"
#include "data/pretokenizer.h"
#include "gtest/gtest.h"
#include "tests/data/naive_bpe.h"
#include "tests/data/test_files.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace data {
namespace {

using test::MakeTempDir;
using test::ReadFile;
using test::WriteFile;

namespace fs = std::filesystem;
using Merge = BpeTokenizer::Merge;

// Random text over a small alphabet, so that pairs repeat and ties happen.
std::string RandomText(std::mt19937_64& rng, size_t length,
                       const std::string& alphabet) {
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::string text(length, ' ');
  for (char& c : text) c = alphabet[pick(rng)];
  return text;
}

std::string RandomBytes(std::mt19937_64& rng, size_t length) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text(length, '\0');
  for (char& c : text) c = static_cast<char>(byte(rng));
  return text;
}

// An English-like text: sentences drawn from a fixed vocabulary of words.
std::string EnglishLikeText(std::mt19937_64& rng, size_t sentences) {
  const std::vector<std::string> words = {
      "the",    "quick",  "brown", "fox",     "jumps",    "over",  "lazy",
      "dog",    "and",    "then",  "runs",    "away",     "from",  "a",
      "hunter", "who",    "never", "catches", "anything", "in",    "forest",
      "today",  "people", "say",   "that",    "time",     "flies", "like",
      "an",     "arrow",  "fruit", "banana",  "is",       "not",   "what"};
  std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
  std::uniform_int_distribution<int> length(3, 12);
  std::string text;
  for (size_t s = 0; s < sentences; ++s) {
    const int n = length(rng);
    for (int i = 0; i < n; ++i) {
      std::string word = words[pick(rng)];
      if (i == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
      if (i > 0) text += ' ';
      text += word;
    }
    text += s % 5 == 4 ? ".\n" : ". ";
  }
  return text;
}

TEST(BpeTrainTest, TinyExampleMergesTheMostFrequentPairs) {
  // Words: "abab" x1, " abab" x2, " cd" x2. (a,b) occurs 6 times, then
  // (ab,ab) 3 times, then four pairs twice each, taken in (left, right) order.
  const std::string text = "abab abab abab cd cd";
  auto tokenizer = BpeTokenizer::Train(text, 1000);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<Merge> expected = {
      {'a', 'b'}, {256, 256}, {' ', 'c'}, {' ', 257}, {258, 'd'}};
  EXPECT_EQ(tokenizer->merges(), expected);
  EXPECT_EQ(tokenizer->vocab_size(), 261);  // no pair left: stops early
  EXPECT_EQ(tokenizer->Encode(text),
            (std::vector<int32_t>{257, 259, 259, 260, 260}));
  EXPECT_EQ(*tokenizer->TokenBytes(259), " abab");

  // The vocabulary asked for is respected...
  auto small = BpeTokenizer::Train(text, 258);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->merges(),
            std::vector<Merge>(expected.begin(), expected.begin() + 2));
  // ... and so is min_frequency.
  BpeTrainOptions options;
  options.min_frequency = 3;
  auto frequent = BpeTokenizer::Train(text, 1000, options);
  ASSERT_TRUE(frequent.ok());
  EXPECT_EQ(frequent->vocab_size(), 258);
  // 256 means no merge.
  auto bytes = BpeTokenizer::Train(text, 256);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->vocab_size(), 256);
  EXPECT_EQ(bytes->Encode("ab").size(), 2u);
}

TEST(BpeTrainTest, MatchesNaiveReferenceAndItsSegmentation) {
  std::mt19937_64 rng(test::TestSeed());
  const std::vector<std::string> alphabets = {"ab ", "abc \n", "aab0 .\xC3\xA9",
                                              "xyz 12,!\n\t"};
  for (int trial = 0; trial < 40; ++trial) {
    const std::string text =
        RandomText(rng, 200 + rng() % 2000, alphabets[trial % 4]);
    const int vocab = 256 + 1 + static_cast<int>(rng() % 150);
    const int64_t min_frequency = 1 + static_cast<int64_t>(rng() % 3);
    SCOPED_TRACE(absl::StrCat("trial ", trial, " vocab ", vocab,
                              " min_frequency ", min_frequency));
    BpeTrainOptions options;
    options.min_frequency = min_frequency;
    auto tokenizer = BpeTokenizer::Train(text, vocab, options);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const NaiveBpe reference = NaiveBpeTrain(text, vocab, min_frequency);
    ASSERT_EQ(tokenizer->merges(), reference.merges);
    ASSERT_LE(tokenizer->vocab_size(), vocab);
    // Encoding a training word gives the segmentation training ended with.
    for (const auto& [word, tokens] : reference.segmentation) {
      ASSERT_EQ(tokenizer->Encode(word), tokens) << "word '" << word << "'";
    }
  }
}

TEST(BpeTrainTest, IsDeterministicAndRespectsVocabSize) {
  std::mt19937_64 rng(test::TestSeed());
  const std::string text = EnglishLikeText(rng, 2000);
  auto first = BpeTokenizer::Train(text, 400);
  auto second = BpeTokenizer::Train(text, 400);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->merges(), second->merges());
  EXPECT_EQ(first->vocab_size(), 400);
  for (const int32_t id : first->Encode(text)) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, 400);
  }
}

TEST(BpeTrainTest, CompressesText) {
  std::mt19937_64 rng(test::TestSeed());
  const std::string text = EnglishLikeText(rng, 3000);
  auto tokenizer = BpeTokenizer::Train(text, 512);
  ASSERT_TRUE(tokenizer.ok());
  const std::vector<int32_t> ids = tokenizer->Encode(text);
  // 35 words in the vocabulary: each becomes one token with its space, so a
  // sentence costs about one token per word plus punctuation.
  EXPECT_LT(ids.size() * 4, text.size())
      << text.size() << " bytes -> " << ids.size() << " tokens";
  // Held-out text from the same distribution compresses as well.
  const std::string other = EnglishLikeText(rng, 300);
  EXPECT_LT(tokenizer->Encode(other).size() * 4, other.size());
}

TEST(BpeTokenizerTest, RoundTripsAnyBytes) {
  std::mt19937_64 rng(test::TestSeed());
  // Train on text mixed with raw bytes, so merges involve bytes >= 0x80.
  std::string training = EnglishLikeText(rng, 500);
  for (int i = 0; i < 20; ++i)
    training += RandomBytes(rng, 50) + " caf\xC3\xA9 ";
  auto tokenizer = BpeTokenizer::Train(training, 700, BpeTrainOptions{1});
  ASSERT_TRUE(tokenizer.ok());
  std::vector<std::string> samples = {"",
                                      " ",
                                      "\xff\xfe\x80",
                                      "\xC3",
                                      std::string(1000, 'a'),
                                      std::string(3, '\0'),
                                      training};
  for (int i = 0; i < 100; ++i) {
    samples.push_back(RandomBytes(rng, rng() % 400));
    samples.push_back(EnglishLikeText(rng, 3) + RandomBytes(rng, 5));
  }
  for (const std::string& text : samples) {
    const std::vector<int32_t> ids = tokenizer->Encode(text);
    auto decoded = tokenizer->Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_EQ(*decoded, text);
  }
}

TEST(BpeTokenizerTest, RejectsBadArguments) {
  EXPECT_EQ(BpeTokenizer::Train("abc", 255).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(BpeTokenizer::Train("abc", kMaxBpeVocabSize + 1).ok());
  EXPECT_FALSE(BpeTokenizer::Train("abc", 300, BpeTrainOptions{0}).ok());
  EXPECT_TRUE(BpeTokenizer::Train("", 300).ok());

  EXPECT_TRUE(BpeTokenizer::FromMerges({{'a', 'b'}, {256, 'c'}}).ok());
  EXPECT_FALSE(BpeTokenizer::FromMerges({{'a', 256}}).ok());  // future id
  EXPECT_FALSE(BpeTokenizer::FromMerges({{-1, 'a'}}).ok());   // negative
  EXPECT_FALSE(BpeTokenizer::FromMerges({{'a', 'b'}, {'a', 'b'}}).ok());

  auto tokenizer = BpeTokenizer::FromMerges({{'a', 'b'}});
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_FALSE(tokenizer->Decode(std::vector<int32_t>{257}).ok());
  EXPECT_FALSE(tokenizer->Decode(std::vector<int32_t>{-5}).ok());
  EXPECT_EQ(*tokenizer->Decode(std::vector<int32_t>{256, 'c'}), "abc");
}

// Merges whose token would be longer than a word are refused: such a token
// can never be used, and a chain of merges that each join the last token to
// itself doubles its length every line (40 lines asked for a 2^41-byte
// token, which crashed the loader before the limit).
TEST(BpeTokenizerTest, RejectsTokensLongerThanAWord) {
  std::vector<Merge> doubling = {{'a', 'a'}};  // token 256: "aa"
  while (doubling.size() < 6) {                // up to token 261: 64 bytes
    const int32_t last = 255 + static_cast<int32_t>(doubling.size());
    doubling.push_back({last, last});
  }
  auto tokenizer = BpeTokenizer::FromMerges(doubling);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(*tokenizer->TokenBytes(261), std::string(kMaxWordBytes, 'a'));
  EXPECT_EQ(tokenizer->Encode(std::string(kMaxWordBytes, 'a')),
            std::vector<int32_t>{261});
  doubling.push_back({261, 261});  // 128 bytes
  absl::Status status = BpeTokenizer::FromMerges(doubling).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("merge 6 (261, 261) makes a token of 128"),
            std::string::npos)
      << status;

  // One byte at a time: 64 bytes pass, 65 do not.
  std::vector<Merge> growing = {{'x', 'y'}};  // token 256: 2 bytes
  for (int32_t id = 256; id < 256 + kMaxWordBytes - 2; ++id) {
    growing.push_back({id, 'z'});
  }
  ASSERT_TRUE(BpeTokenizer::FromMerges(growing).ok());
  growing.push_back({255 + static_cast<int32_t>(growing.size()), 'z'});
  EXPECT_FALSE(BpeTokenizer::FromMerges(growing).ok());

  // The file of 40 doubling merges.
  std::string file =
      "lossrt-tokenizer 1\nkind bpe\npretokenizer words-v1\n"
      "vocab_size 296\nmerges 40\n97 97\n";
  for (int id = 256; id < 256 + 39; ++id) {
    absl::StrAppend(&file, id, " ", id, "\n");
  }
  file += "end\n";
  const std::string path = MakeTempDir() + "/doubling.txt";
  WriteFile(path, file);
  for (const absl::Status& loaded :
       {LoadTokenizer(path).status(), BpeTokenizer::Load(path).status()}) {
    EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument) << loaded;
    // Line 12: the seventh merge.
    EXPECT_NE(loaded.message().find(path + ":12: merge 6"), std::string::npos)
        << loaded;
  }
}

TEST(BpeTokenizerTest, SavesAndLoads) {
  std::mt19937_64 rng(test::TestSeed());
  const std::string text = EnglishLikeText(rng, 1000) + "\xC3\xA9\xff";
  auto tokenizer = BpeTokenizer::Train(text, 600, BpeTrainOptions{1});
  ASSERT_TRUE(tokenizer.ok());
  const std::string path = MakeTempDir() + "/bpe.txt";
  ASSERT_TRUE(tokenizer->Save(path).ok());

  auto loaded = BpeTokenizer::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->merges(), tokenizer->merges());
  auto any = LoadTokenizer(path);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ((*any)->kind(), "bpe");
  EXPECT_EQ((*any)->vocab_size(), tokenizer->vocab_size());
  for (int i = 0; i < 20; ++i) {
    const std::string sample = EnglishLikeText(rng, 2) + RandomBytes(rng, 8);
    EXPECT_EQ((*any)->Encode(sample), tokenizer->Encode(sample));
  }
  EXPECT_FALSE(BpeTokenizer::Load(path + ".missing").ok());
}

TEST(BpeTokenizerTest, RejectsCorruptFiles) {
  std::mt19937_64 rng(test::TestSeed());
  auto tokenizer = BpeTokenizer::Train(EnglishLikeText(rng, 200), 300);
  ASSERT_TRUE(tokenizer.ok());
  const std::string dir = MakeTempDir();
  const std::string good_path = dir + "/good.txt";
  ASSERT_TRUE(tokenizer->Save(good_path).ok());
  const std::string good = ReadFile(good_path);
  ASSERT_EQ(tokenizer->vocab_size(), 300);

  const std::string path = dir + "/bad.txt";
  auto expect_rejected = [&](const std::string& contents,
                             const std::string& what) {
    WriteFile(path, contents);
    auto loaded = LoadTokenizer(path);
    EXPECT_FALSE(loaded.ok()) << what;
    if (!loaded.ok()) {
      EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument)
          << what << ": " << loaded.status();
    }
  };
  // Every truncation.
  for (size_t cut = 0; cut < good.size(); ++cut) {
    expect_rejected(good.substr(0, cut), absl::StrCat("cut at ", cut));
  }
  std::vector<std::string> lines = absl::StrSplit(good, '\n');
  auto with_line = [&](size_t index, const std::string& line) {
    std::vector<std::string> copy = lines;
    copy[index] = line;
    return absl::StrJoin(copy, "\n");
  };
  // Header lines: 0 magic, 1 kind, 2 pretokenizer, 3 vocab_size, 4 merges.
  expect_rejected(with_line(2, "pretokenizer words-v0"), "pretokenizer");
  expect_rejected(with_line(3, "vocab_size 301"), "vocab mismatch");
  expect_rejected(with_line(3, "vocab_size 3000000"), "vocab too large");
  expect_rejected(with_line(4, "merges 45"), "merge count");
  expect_rejected(with_line(4, "merges -1"), "negative count");
  expect_rejected(with_line(5, "97 299"), "future id");
  expect_rejected(with_line(5, "97 -3"), "negative id");
  expect_rejected(with_line(5, "97"), "one number");
  expect_rejected(with_line(5, "97 98 99"), "three numbers");
  expect_rejected(with_line(5, "97  98"), "double space");
  expect_rejected(with_line(6, lines[5]), "duplicate merge");
  expect_rejected(good + "end\n", "data after end");
  expect_rejected(with_line(1, "kind byte"), "kind byte with BPE lines");
  EXPECT_FALSE(BpeTokenizer::Load(dir).ok());  // a folder

  // Random byte changes never crash: each gives an error or a valid
  // tokenizer that round-trips.
  for (int trial = 0; trial < 300; ++trial) {
    std::string contents = good;
    const int changes = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < changes; ++c) {
      contents[rng() % contents.size()] = static_cast<char>(rng() % 256);
    }
    WriteFile(path, contents);
    auto loaded = LoadTokenizer(path);
    if (loaded.ok()) {
      const std::string sample = "the quick brown fox\xff";
      EXPECT_EQ(*(*loaded)->Decode((*loaded)->Encode(sample)), sample);
    }
  }
}

// The project's default corpus, when installed (Debian's fortunes).
TEST(BpeTokenizerTest, TrainsOnFortunes) {
  if (!fs::exists(kDefaultCorpus)) {
    GTEST_SKIP() << kDefaultCorpus
                 << " is not installed (apt-get install "
                    "fortunes fortunes-min)";
  }
  auto text = ReadTextCorpus(kDefaultCorpus);
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_GT(text->size(), 100000u);
  const auto start = std::chrono::steady_clock::now();
  auto tokenizer = BpeTokenizer::Train(*text, 1024);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ(tokenizer->vocab_size(), 1024);
  const std::vector<int32_t> ids = tokenizer->Encode(*text);
  const double bytes_per_token =
      static_cast<double>(text->size()) / static_cast<double>(ids.size());
  std::printf(
      "fortunes: %zu bytes, vocab 1024 trained in %.2f s, %.3f bytes/token\n",
      text->size(), seconds, bytes_per_token);
  EXPECT_GT(bytes_per_token, 2.2);  // 1 for bytes; measured 2.36
  EXPECT_EQ(*tokenizer->Decode(ids), *text);
}

}  // namespace
}  // namespace data
}  // namespace lossrt
