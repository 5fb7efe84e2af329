// Tests of data/shards.h: llm.c token shards written and read back (alone and
// as folders or globs), their exact byte layout, and every kind of corrupt
// shard.
#include "data/shards.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/data/test_files.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace data {
namespace {

using test::MakeTempDir;
using test::ReadFile;
using test::WriteFile;

namespace fs = std::filesystem;

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, size_t count,
                                  int32_t vocab) {
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = token(rng);
  return tokens;
}

uint32_t Le32(const std::string& bytes, size_t offset) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(bytes[offset + i]);
  }
  return v;
}

void SetLe32(std::string* bytes, size_t offset, uint32_t value) {
  for (int i = 0; i < 4; ++i) {
    (*bytes)[offset + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  }
}

template <typename T>
void ExpectInvalid(const absl::StatusOr<T>& result, const std::string& name,
                   const std::string& what) {
  ASSERT_FALSE(result.ok()) << what;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << what << ": " << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), name))
      << what << ": " << result.status();
}

TEST(ShardsTest, RoundTripsWithTheLlmcLayout) {
  std::mt19937_64 rng(test::TestSeed());
  const std::string dir = MakeTempDir();
  for (const size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{5000}}) {
    const std::vector<int32_t> tokens = RandomTokens(rng, count, 65536);
    const std::string path = absl::StrCat(dir, "/shard_", count, ".bin");
    ASSERT_TRUE(WriteTokenShard(path, tokens).ok());
    const std::string bytes = ReadFile(path);
    ASSERT_EQ(bytes.size(), 1024 + 2 * count);
    EXPECT_EQ(Le32(bytes, 0), 20240520u);
    EXPECT_EQ(Le32(bytes, 4), 1u);
    EXPECT_EQ(Le32(bytes, 8), count);
    for (size_t i = 12; i < 1024; ++i) ASSERT_EQ(bytes[i], '\0');
    for (size_t i = 0; i < count; ++i) {
      const uint32_t token =
          static_cast<unsigned char>(bytes[1024 + 2 * i]) |
          (static_cast<unsigned char>(bytes[1025 + 2 * i]) << 8);
      ASSERT_EQ(token, static_cast<uint32_t>(tokens[i]));
    }
    auto read = ReadTokenShard(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, tokens);
  }
}

TEST(ShardsTest, WriteRejectsTokensThatDoNotFit) {
  const std::string path = MakeTempDir() + "/bad.bin";
  for (const int32_t bad : {-1, 65536, 1 << 20}) {
    const std::vector<int32_t> tokens = {1, 2, bad};
    const absl::Status status = WriteTokenShard(path, tokens);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_FALSE(fs::exists(path));  // nothing written
  }
}

TEST(ShardsTest, RejectsCorruptShards) {
  std::mt19937_64 rng(test::TestSeed());
  const std::string dir = MakeTempDir();
  const std::string good_path = dir + "/good.bin";
  const std::vector<int32_t> tokens = RandomTokens(rng, 100, 1000);
  ASSERT_TRUE(WriteTokenShard(good_path, tokens).ok());
  const std::string good = ReadFile(good_path);
  const std::string path = dir + "/bad.bin";
  auto read_modified = [&](const std::string& contents) {
    WriteFile(path, contents);
    return ReadTokenShard(path);
  };

  std::string bad = good;
  SetLe32(&bad, 0, 20240521);
  ExpectInvalid(read_modified(bad), path, "magic");
  bad = good;
  SetLe32(&bad, 4, 2);
  ExpectInvalid(read_modified(bad), path, "version");
  bad = good;
  SetLe32(&bad, 8, 101);
  ExpectInvalid(read_modified(bad), path, "count larger than the data");
  bad = good;
  SetLe32(&bad, 8, 99);
  ExpectInvalid(read_modified(bad), path, "count smaller than the data");
  bad = good;
  SetLe32(&bad, 8, 0x80000000u);
  ExpectInvalid(read_modified(bad), path, "negative count");
  ExpectInvalid(read_modified(good + "x"), path, "extra byte");
  ExpectInvalid(read_modified(""), path, "empty file");
  // Every truncation point in the header, and a sample in the tokens.
  for (size_t cut = 0; cut < good.size(); cut += cut < 1030 ? 1 : 17) {
    ExpectInvalid(read_modified(good.substr(0, cut)), path,
                  absl::StrCat("cut at ", cut));
  }
  // Tokens outside the vocabulary.
  auto small_vocab = ReadTokenShard(good_path, 10);
  ExpectInvalid(small_vocab, good_path, "vocab 10");
  EXPECT_TRUE(ReadTokenShard(good_path, 1000).ok());
  EXPECT_FALSE(ReadTokenShard(good_path, 0).ok());
  EXPECT_FALSE(ReadTokenShard(good_path, 65537).ok());

  auto missing = ReadTokenShard(dir + "/missing.bin");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(ReadTokenShard(dir).ok());  // a folder
}

TEST(ShardsTest, ReadsSetsInSortedOrder) {
  std::mt19937_64 rng(test::TestSeed());
  const std::string dir = MakeTempDir();
  std::vector<std::vector<int32_t>> parts;
  for (int i = 0; i < 3; ++i) parts.push_back(RandomTokens(rng, 50 + i, 500));
  // Written out of order; read back sorted by name.
  ASSERT_TRUE(WriteTokenShard(dir + "/train_002.bin", parts[2]).ok());
  ASSERT_TRUE(WriteTokenShard(dir + "/train_000.bin", parts[0]).ok());
  ASSERT_TRUE(WriteTokenShard(dir + "/train_001.bin", parts[1]).ok());
  WriteFile(dir + "/notes.txt", "not a shard");
  std::vector<int32_t> all;
  for (const auto& part : parts)
    all.insert(all.end(), part.begin(), part.end());

  auto from_folder = ReadTokenShards(dir, 500);
  ASSERT_TRUE(from_folder.ok()) << from_folder.status();
  EXPECT_EQ(*from_folder, all);
  auto from_glob = ReadTokenShards(dir + "/train_*.bin");
  ASSERT_TRUE(from_glob.ok()) << from_glob.status();
  EXPECT_EQ(*from_glob, all);
  auto two = ReadTokenShards(dir + "/train_00[12].bin");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size(), parts[1].size() + parts[2].size());
  auto one = ReadTokenShards(dir + "/train_001.bin");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, parts[1]);

  EXPECT_EQ(ReadTokenShards(dir + "/val_*.bin").status().code(),
            absl::StatusCode::kNotFound);
  const std::string empty = dir + "/empty";
  fs::create_directories(empty);
  EXPECT_EQ(ReadTokenShards(empty).status().code(),
            absl::StatusCode::kNotFound);
  // Shards with no token at all are an error as a set.
  const std::string hollow = dir + "/hollow";
  fs::create_directories(hollow);
  ASSERT_TRUE(WriteTokenShard(hollow + "/a.bin", {}).ok());
  EXPECT_TRUE(ReadTokenShard(hollow + "/a.bin").ok());
  ExpectInvalid(ReadTokenShards(hollow), hollow, "no token");
  // One bad shard spoils the set, and is named.
  WriteFile(dir + "/train_003.bin", "junk");
  ExpectInvalid(ReadTokenShards(dir), dir + "/train_003.bin", "junk shard");
  ExpectInvalid(ReadTokenShards(dir + "/train_00[0-2].bin", 100),
                dir + "/train_000.bin", "vocab 100");
}

}  // namespace
}  // namespace data
}  // namespace lossrt
