// Tests of data/tokenizer.h and data/pretokenizer.h: the byte tokenizer, the
// word splitter, and LoadTokenizer on good and corrupt files.
#include "data/tokenizer.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/pretokenizer.h"
#include "gtest/gtest.h"
#include "tests/data/test_files.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace data {
namespace {

using test::MakeTempDir;
using test::WriteFile;

namespace fs = std::filesystem;

// A fresh empty folder for the running test.
std::string RandomBytes(std::mt19937_64& rng, size_t max_length) {
  std::uniform_int_distribution<size_t> length(0, max_length);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text(length(rng), '\0');
  for (char& c : text) c = static_cast<char>(byte(rng));
  return text;
}

TEST(ByteTokenizerTest, IdsAreBytesAndRoundTrip) {
  std::mt19937_64 rng(test::TestSeed());
  ByteTokenizer tokenizer;
  EXPECT_EQ(tokenizer.vocab_size(), 256);
  EXPECT_EQ(tokenizer.kind(), "byte");
  for (int trial = 0; trial < 50; ++trial) {
    const std::string text = RandomBytes(rng, 300);
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    ASSERT_EQ(ids.size(), text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      ASSERT_EQ(ids[i], static_cast<unsigned char>(text[i]));
    }
    auto decoded = tokenizer.Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
  }
}

TEST(ByteTokenizerTest, DecodeRejectsOutOfRangeIds) {
  ByteTokenizer tokenizer;
  for (const int32_t bad : {-1, 256, 1 << 30}) {
    const std::vector<int32_t> ids = {65, bad, 66};
    auto decoded = tokenizer.Decode(ids);
    ASSERT_FALSE(decoded.ok()) << bad;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(decoded.status().message().find("position 1"),
              absl::string_view::npos)
        << decoded.status();
  }
  EXPECT_FALSE(tokenizer.TokenBytes(256).ok());
  auto a = tokenizer.TokenBytes(97);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, "a");
}

TEST(ByteTokenizerTest, SavesAndLoads) {
  const std::string path = MakeTempDir() + "/byte.txt";
  ASSERT_TRUE(ByteTokenizer().Save(path).ok());
  auto loaded = LoadTokenizer(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->kind(), "byte");
  EXPECT_EQ((*loaded)->vocab_size(), 256);
  EXPECT_EQ((*loaded)->Encode("hi"), (std::vector<int32_t>{104, 105}));
}

TEST(LoadTokenizerTest, RejectsBadFiles) {
  const std::string dir = MakeTempDir();
  EXPECT_EQ(LoadTokenizer(dir + "/missing").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(LoadTokenizer(dir).ok());  // a folder
  const std::string good =
      "lossrt-tokenizer 1\nkind byte\nvocab_size 256\nend\n";
  const char kWithNul[] =
      "lossrt-tokenizer 1\nkind byte\0\nvocab_size 256\nend\n";
  const std::vector<std::string> bad = {
      "",
      "\n",
      "lossrt-tokenizer 2\nkind byte\nvocab_size 256\nend\n",
      "lossrt-tokenizer 1\nkind words\nvocab_size 256\nend\n",
      "lossrt-tokenizer 1\nkind byte\nvocab_size 255\nend\n",
      "lossrt-tokenizer 1\nkind byte\nvocab_size 256\n",
      "lossrt-tokenizer 1\nkind byte\nvocab_size 256\nend",
      "lossrt-tokenizer 1\nkind byte\nvocab_size 256\nend\nmore\n",
      "lossrt-tokenizer 1\nkind byte\nvocab_size x256\nend\n",
      std::string(kWithNul, sizeof(kWithNul) - 1),
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string path = absl::StrCat(dir, "/bad", i);
    WriteFile(path, bad[i]);
    auto loaded = LoadTokenizer(path);
    ASSERT_FALSE(loaded.ok()) << "case " << i;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(loaded.status().message().find(path), absl::string_view::npos)
        << loaded.status();
  }
  // Every strict prefix of a good file is rejected.
  for (size_t cut = 0; cut < good.size(); ++cut) {
    const std::string path = dir + "/cut";
    WriteFile(path, good.substr(0, cut));
    EXPECT_FALSE(LoadTokenizer(path).ok()) << "cut at " << cut;
  }
  WriteFile(dir + "/good", good);
  EXPECT_TRUE(LoadTokenizer(dir + "/good").ok());
}

TEST(PretokenizerTest, SplitsLikeGpt2) {
  using Words = std::vector<absl::string_view>;
  EXPECT_EQ(SplitWords("Hello, world!\n"),
            (Words{"Hello", ",", " world", "!", "\n"}));
  EXPECT_EQ(SplitWords("a   b"), (Words{"a", "  ", " b"}));
  EXPECT_EQ(SplitWords("a b  \n c"), (Words{"a", " b", "  \n", " c"}));
  EXPECT_EQ(SplitWords("x \n\ty"), (Words{"x", " \n\t", "y"}));
  EXPECT_EQ(SplitWords("route 66, \"ok\"..."),
            (Words{"route", " 66", ",", " \"", "ok", "\"..."}));
  EXPECT_EQ(SplitWords("don't"), (Words{"don", "'", "t"}));
  EXPECT_EQ(SplitWords(" caf\xC3\xA9 na\xC3\xAFve"),
            (Words{" caf\xC3\xA9", " na\xC3\xAFve"}));
  EXPECT_EQ(SplitWords("abc123def"), (Words{"abc", "123", "def"}));
  EXPECT_EQ(SplitWords(" "), (Words{" "}));
  EXPECT_EQ(SplitWords("\n\n"), (Words{"\n\n"}));
  EXPECT_TRUE(SplitWords("").empty());
  // Runs longer than kMaxWordBytes are cut.
  const std::string long_run = " " + std::string(2 * kMaxWordBytes + 5, 'z');
  const Words pieces = SplitWords(long_run);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].size(), static_cast<size_t>(kMaxWordBytes));
  EXPECT_EQ(pieces[0][0], ' ');
  EXPECT_EQ(pieces[2].size(), 6u);
}

TEST(PretokenizerTest, WordsConcatenateToAnyInput) {
  std::mt19937_64 rng(test::TestSeed());
  // Bytes drawn from a small alphabet of every class, and raw bytes.
  const std::string alphabet = std::string("aZ9 \n\t.'\x80\xff\0", 11);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    if (trial % 2 == 0) {
      text = RandomBytes(rng, 500);
    } else {
      std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
      text.resize(rng() % 500);
      for (char& c : text) c = alphabet[pick(rng)];
    }
    const std::vector<absl::string_view> words = SplitWords(text);
    EXPECT_EQ(absl::StrJoin(words, ""), text);
    for (size_t i = 0; i < words.size(); ++i) {
      ASSERT_FALSE(words[i].empty());
      ASSERT_LE(words[i].size(), static_cast<size_t>(kMaxWordBytes));
      // Views into the input, in order, without gaps.
      if (i > 0) {
        ASSERT_EQ(words[i].data(), words[i - 1].data() + words[i - 1].size());
      }
    }
  }
}

}  // namespace
}  // namespace data
}  // namespace lossrt
