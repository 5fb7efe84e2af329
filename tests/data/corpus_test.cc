// Tests of data/corpus.h (files and folders the test writes, fortune files,
// every error case, the real fortunes folder when installed) and of the UTF-8
// check of data/file_util.h against a reference decoder.
#include "data/corpus.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/file_util.h"
#include "gtest/gtest.h"
#include "tests/data/test_files.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace data {
namespace {

using test::MakeTempDir;
using test::WriteFile;

namespace fs = std::filesystem;

// Expects `status` to be an error of `code` whose message names `name`.
template <typename T>
void ExpectError(const absl::StatusOr<T>& result, absl::StatusCode code,
                 const std::string& name) {
  ASSERT_FALSE(result.ok()) << name;
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), name))
      << result.status() << " does not name " << name;
}

TEST(CorpusTest, ReadsOneFile) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/a.md", "line one\nline two");  // any name when named
  auto text = ReadTextCorpus(dir + "/a.md");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "line one\nline two\n");
  WriteFile(dir + "/utf8", "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\n");
  text = ReadTextCorpus(dir + "/utf8");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\n");
}

TEST(CorpusTest, ReadsFolderRecursivelyInSortedOrder) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/b", "bee\n");
  WriteFile(dir + "/a.txt", "ay\n");
  WriteFile(dir + "/sub/c.TXT", "sea");
  WriteFile(dir + "/sub/deeper/d", "dee\n\n");
  WriteFile(dir + "/empty.txt", "");
  WriteFile(dir + "/b.dat", std::string("\x00\x01\x02\xff", 4));  // skipped
  WriteFile(dir + "/notes.md", "skipped");
  WriteFile(dir + "/.hidden", "skipped");
  WriteFile(dir + "/.git/config", "skipped");
  fs::create_symlink(dir + "/a.txt", dir + "/link.txt");  // skipped
  fs::create_directory_symlink(dir + "/sub", dir + "/sublink");

  auto files = ListCorpusFiles(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{
                        dir + "/a.txt", dir + "/b", dir + "/empty.txt",
                        dir + "/sub/c.TXT", dir + "/sub/deeper/d"}));
  auto text = ReadTextCorpus(dir);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "ay\n\nbee\n\nsea\n\ndee\n\n");
}

TEST(CorpusTest, StripsFortuneSeparators) {
  EXPECT_EQ(StripFortuneSeparators("one\n%\ntwo\nlines\n%\nthree\n%\n"),
            "one\n\ntwo\nlines\n\nthree\n");
  EXPECT_EQ(StripFortuneSeparators("%\n%\n  \n%\nonly\n%"), "only\n");
  EXPECT_EQ(StripFortuneSeparators("a\r\n%\r\nb"), "a\n\nb\n");
  // Entries lose leading blank lines and trailing whitespace, not their
  // indentation or inner blank lines.
  EXPECT_EQ(StripFortuneSeparators("\n \n  art\n\n\n  more\n\n \n%\nnext  \n"),
            "  art\n\n\n  more\n\nnext\n");
  EXPECT_EQ(StripFortuneSeparators("100%\n%%\n"), "100%\n%%\n");
  EXPECT_EQ(StripFortuneSeparators(""), "");
}

TEST(CorpusTest, FortuneFilesAreRecognizedByTheirIndex) {
  const std::string dir = MakeTempDir();
  const std::string fortunes = "Be nice.\n%\nTwo\n  lines.\n%\n";
  WriteFile(dir + "/jokes", fortunes);
  WriteFile(dir + "/jokes.dat", std::string("\x00\x00\x00\x02", 4));
  WriteFile(dir + "/plain", fortunes);  // no index: plain text
  auto text = ReadTextCorpus(dir);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "Be nice.\n\nTwo\n  lines.\n\n" + fortunes);

  CorpusOptions always;
  always.fortune_format = FortuneFormat::kAlways;
  text = ReadTextCorpus(dir + "/plain", always);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "Be nice.\n\nTwo\n  lines.\n");
  CorpusOptions never;
  never.fortune_format = FortuneFormat::kNever;
  text = ReadTextCorpus(dir + "/jokes", never);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, fortunes);
}

TEST(CorpusTest, Errors) {
  const std::string dir = MakeTempDir();
  ExpectError(ReadTextCorpus(dir + "/missing"), absl::StatusCode::kNotFound,
              dir + "/missing");
  ExpectError(ReadTextCorpus(dir), absl::StatusCode::kInvalidArgument, dir);

  WriteFile(dir + "/empty", "");
  ExpectError(ReadTextCorpus(dir + "/empty"),
              absl::StatusCode::kInvalidArgument, dir + "/empty");
  WriteFile(dir + "/only_separators", "%\n%\n");
  ExpectError(
      ReadTextCorpus(dir + "/only_separators", {FortuneFormat::kAlways}),
      absl::StatusCode::kInvalidArgument, "only_separators");

  const std::string binary = dir + "/binary";
  fs::create_directories(binary);
  WriteFile(binary + "/index.dat", "skipped");
  ExpectError(ReadTextCorpus(binary), absl::StatusCode::kInvalidArgument,
              binary);
  WriteFile(binary + "/zeros", std::string("text\0more", 9));
  ExpectError(ReadTextCorpus(binary), absl::StatusCode::kInvalidArgument,
              binary + "/zeros");
  fs::remove(binary + "/zeros");
  WriteFile(binary + "/latin1.txt", "caf\xE9\n");
  auto latin1 = ReadTextCorpus(binary);
  ExpectError(latin1, absl::StatusCode::kInvalidArgument,
              binary + "/latin1.txt");
  EXPECT_TRUE(absl::StrContains(latin1.status().message(), "offset 3"))
      << latin1.status();
  // Named directly, any file must be text.
  WriteFile(dir + "/image.png", "\x89PNG\r\n\x1a\n");
  ExpectError(ReadTextCorpus(dir + "/image.png"),
              absl::StatusCode::kInvalidArgument, "image.png");
}

// The installed default corpus: fortune files with their .dat indexes and
// .u8 symlinks.
TEST(CorpusTest, ReadsTheFortunesFolder) {
  if (!fs::exists(kDefaultCorpus)) {
    GTEST_SKIP() << kDefaultCorpus << " is not installed";
  }
  auto files = ListCorpusFiles(kDefaultCorpus);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_FALSE(files->empty());
  for (const std::string& file : *files) {
    EXPECT_FALSE(absl::EndsWith(file, ".dat")) << file;
    EXPECT_FALSE(absl::EndsWith(file, ".u8")) << file;
  }
  EXPECT_TRUE(std::is_sorted(files->begin(), files->end()));
  auto text = ReadTextCorpus(kDefaultCorpus);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_GT(text->size(), 100000u);
  EXPECT_EQ(FindInvalidUtf8(*text), -1);
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ASSERT_NE(line, "%");
  }
  EXPECT_TRUE(absl::EndsWith(*text, "\n"));
  EXPECT_FALSE(absl::EndsWith(*text, "\n\n"));
  EXPECT_NE(text->front(), '\n');
}

// A reference: decodes one code point the long way and checks it is the
// shortest form, not a surrogate and at most U+10FFFF.
int64_t ReferenceInvalidUtf8(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = text[i];
    int length;
    uint32_t code;
    if (c < 0x80) {
      length = 1, code = c;
    } else if ((c & 0xE0) == 0xC0) {
      length = 2, code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3, code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4, code = c & 0x07;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + length > text.size()) return static_cast<int64_t>(i);
    for (int k = 1; k < length; ++k) {
      const unsigned char next = text[i + k];
      if ((next & 0xC0) != 0x80) return static_cast<int64_t>(i);
      code = (code << 6) | (next & 0x3F);
    }
    const uint32_t minimum[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < minimum[length] || code > 0x10FFFF ||
        (code >= 0xD800 && code <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += length;
  }
  return -1;
}

TEST(Utf8Test, MatchesReferenceDecoder) {
  EXPECT_EQ(FindInvalidUtf8("plain \t\n ascii"), -1);
  EXPECT_EQ(FindInvalidUtf8(std::string("nul\0ok", 6)), -1);
  EXPECT_EQ(FindInvalidUtf8("\xF4\x8F\xBF\xBF"), -1);  // U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("ab\xC0\x80"), 2);         // overlong NUL
  EXPECT_EQ(FindInvalidUtf8("\xE0\x9F\xBF"), 0);       // overlong
  EXPECT_EQ(FindInvalidUtf8("\xED\xA0\x80"), 0);       // surrogate
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0);   // > U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("x\xE2\x82"), 1);          // truncated
  EXPECT_EQ(FindInvalidUtf8("\x80"), 0);               // stray continuation
  EXPECT_EQ(FindInvalidUtf8("\xFF"), 0);

  std::mt19937_64 rng(test::TestSeed());
  // Bytes biased to lead and continuation bytes, so that many strings are
  // valid and many fail late.
  const std::vector<unsigned char> bytes = {
      'a',  0x00, 0x7F, 0x80, 0xBF, 0x9F, 0xA0, 0x8F, 0x90, 0xC0, 0xC1,
      0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF3, 0xF4, 0xF5, 0xFF};
  std::uniform_int_distribution<size_t> pick(0, bytes.size() - 1);
  int valid = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text(rng() % 12, ' ');
    for (char& c : text) c = static_cast<char>(bytes[pick(rng)]);
    const int64_t expected = ReferenceInvalidUtf8(text);
    ASSERT_EQ(FindInvalidUtf8(text), expected) << absl::CEscape(text);
    valid += expected < 0;
  }
  EXPECT_GT(valid, 100);  // the valid side was exercised too
}

}  // namespace
}  // namespace data
}  // namespace lossrt
