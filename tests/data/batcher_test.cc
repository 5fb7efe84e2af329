// Tests of data/batcher.h: the train/validation split, determinism and exact
// resumption of the random training batches, their window layout (targets
// are the inputs shifted by one), the fixed validation batches, and invalid
// arguments.
#include "data/batcher.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace data {
namespace {

constexpr int32_t kPoison = -7;

// Tokens 0, 1, 2, ...: a window's start can be read off its first token.
std::vector<int32_t> Iota(size_t n) {
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0);
  return tokens;
}

// Checks that every row of `batch` is a window of `tokens` (Iota) and returns
// the starts.
std::vector<int64_t> CheckWindows(const Batch& batch, int rows, int seq,
                                  size_t n) {
  std::vector<int64_t> starts;
  EXPECT_EQ(batch.inputs.size(), static_cast<size_t>(rows) * seq);
  EXPECT_EQ(batch.targets.size(), static_cast<size_t>(rows) * seq);
  for (int b = 0; b < rows; ++b) {
    const int32_t start = batch.inputs[b * seq];
    EXPECT_GE(start, 0);
    EXPECT_LE(static_cast<size_t>(start) + seq, n - 1);
    for (int t = 0; t < seq; ++t) {
      EXPECT_EQ(batch.inputs[b * seq + t], start + t);
      EXPECT_EQ(batch.targets[b * seq + t], start + t + 1);
    }
    starts.push_back(start);
  }
  return starts;
}

TEST(SplitMix64Test, MatchesPublishedOutputs) {
  // The first outputs of SplitMix64 from state 0 (Vigna's splitmix64.c):
  // state advances by the golden gamma before each mix.
  EXPECT_EQ(SplitMix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(SplitMix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
}

TEST(TokenDatasetTest, SplitsOffTheLastTokens) {
  auto dataset = TokenDataset::Create(Iota(1000), 0.1, 16);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->train, Iota(900));
  ASSERT_EQ(dataset->val.size(), 100u);
  EXPECT_EQ(dataset->val.front(), 900);
  EXPECT_EQ(dataset->val.back(), 999);

  // At least one window of validation.
  dataset = TokenDataset::Create(Iota(1000), 0.001, 63);
  ASSERT_TRUE(dataset.ok());
  EXPECT_EQ(dataset->val.size(), 64u);
  EXPECT_EQ(dataset->train.size(), 936u);
  // ceil of the fraction.
  dataset = TokenDataset::Create(Iota(1001), 0.1, 4);
  ASSERT_TRUE(dataset.ok());
  EXPECT_EQ(dataset->val.size(), 101u);
  // No validation.
  dataset = TokenDataset::Create(Iota(20), 0.0, 4);
  ASSERT_TRUE(dataset.ok());
  EXPECT_TRUE(dataset->val.empty());
  EXPECT_EQ(dataset->train.size(), 20u);
  // Just enough: one window each.
  dataset = TokenDataset::Create(Iota(10), 0.5, 4);
  ASSERT_TRUE(dataset.ok());
  EXPECT_EQ(dataset->val.size(), 5u);
  EXPECT_EQ(dataset->train.size(), 5u);
}

TEST(TokenDatasetTest, RejectsTooLittleDataAndBadArguments) {
  EXPECT_EQ(TokenDataset::Create(Iota(9), 0.5, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(TokenDataset::Create(Iota(4), 0.0, 4).ok());
  EXPECT_FALSE(TokenDataset::Create({}, 0.1, 1).ok());
  EXPECT_FALSE(TokenDataset::Create(Iota(100), 1.0, 4).ok());
  EXPECT_FALSE(TokenDataset::Create(Iota(100), -0.1, 4).ok());
  EXPECT_FALSE(TokenDataset::Create(Iota(100), std::nan(""), 4).ok());
  EXPECT_FALSE(TokenDataset::Create(Iota(100), 0.1, 0).ok());
}

TEST(BatcherTest, BatchesAreWindowsWithShiftedTargets) {
  const std::vector<int32_t> tokens = Iota(5000);
  const uint64_t seed = test::TestSeed();
  auto batcher = Batcher::Create(tokens, 8, 33, seed);
  ASSERT_TRUE(batcher.ok()) << batcher.status();
  for (int64_t k = 0; k < 20; ++k) {
    auto batch = batcher->Get(k);
    ASSERT_TRUE(batch.ok());
    const std::vector<int64_t> starts = CheckWindows(*batch, 8, 33, 5000);
    for (int b = 0; b < 8; ++b)
      EXPECT_EQ(starts[b], batcher->WindowStart(k, b));
  }
}

TEST(BatcherTest, IsAFunctionOfSeedAndPosition) {
  std::mt19937_64 rng(test::TestSeed());
  std::vector<int32_t> tokens(20000);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 50000);
  const uint64_t seed = rng();
  auto a = Batcher::Create(tokens, 4, 64, seed);
  auto b = Batcher::Create(tokens, 4, 64, seed);
  auto other = Batcher::Create(tokens, 4, 64, seed + 1);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());

  std::vector<int32_t> inputs(4 * 64, kPoison), targets(4 * 64, kPoison);
  std::vector<Batch> history;
  for (int64_t k = 0; k < 10; ++k) {
    EXPECT_EQ(a->position(), k);
    std::fill(inputs.begin(), inputs.end(), kPoison);
    std::fill(targets.begin(), targets.end(), kPoison);
    ASSERT_TRUE(a->Next(absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
    for (size_t i = 0; i < inputs.size(); ++i) {
      ASSERT_NE(inputs[i], kPoison);
      ASSERT_NE(targets[i], kPoison);
    }
    history.push_back({inputs, targets});
    auto same = b->Get(k);
    ASSERT_TRUE(same.ok());
    EXPECT_EQ(same->inputs, inputs);
    EXPECT_EQ(same->targets, targets);
    auto different = other->Get(k);
    ASSERT_TRUE(different.ok());
    EXPECT_NE(different->inputs, inputs);
  }
  // Successive batches differ.
  EXPECT_NE(history[0].inputs, history[1].inputs);

  // A resumed run continues exactly.
  auto resumed = Batcher::Create(tokens, 4, 64, seed);
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE(resumed->set_position(6).ok());
  for (int64_t k = 6; k < 10; ++k) {
    ASSERT_TRUE(
        resumed->Next(absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
    EXPECT_EQ(inputs, history[k].inputs);
    EXPECT_EQ(targets, history[k].targets);
  }
  EXPECT_EQ(resumed->position(), 10);
  // Going back replays too.
  ASSERT_TRUE(resumed->set_position(2).ok());
  ASSERT_TRUE(
      resumed->Next(absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  EXPECT_EQ(inputs, history[2].inputs);
}

TEST(BatcherTest, FollowsTheDocumentedFormula) {
  const uint64_t seed = test::TestSeed();
  const std::vector<int32_t> tokens = Iota(1000);
  auto batcher = Batcher::Create(tokens, 3, 10, seed);
  ASSERT_TRUE(batcher.ok());
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{12345}, int64_t{1} << 40}) {
    for (int b = 0; b < 3; ++b) {
      const uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed) ^ k) ^ b);
      const int64_t start = static_cast<int64_t>(
          (static_cast<unsigned __int128>(h) * (1000 - 10)) >> 64);
      EXPECT_EQ(batcher->WindowStart(k, b), start);
    }
  }
}

TEST(BatcherTest, CoversEveryStart) {
  // 12 tokens, seq 4: starts 0..7 (the last window ends on the last token).
  const std::vector<int32_t> tokens = Iota(12);
  auto batcher = Batcher::Create(tokens, 2, 4, test::TestSeed());
  ASSERT_TRUE(batcher.ok());
  std::set<int64_t> seen;
  for (int64_t k = 0; k < 400; ++k) {
    auto batch = batcher->Get(k);
    ASSERT_TRUE(batch.ok());
    for (int64_t start : CheckWindows(*batch, 2, 4, 12)) seen.insert(start);
  }
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // The smallest data: one window.
  const std::vector<int32_t> five = Iota(5);
  auto single = Batcher::Create(five, 3, 4, 1);
  ASSERT_TRUE(single.ok());
  auto batch = single->Get(99);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(CheckWindows(*batch, 3, 4, 5), (std::vector<int64_t>{0, 0, 0}));
}

TEST(BatcherTest, RejectsBadArguments) {
  const std::vector<int32_t> tokens = Iota(100);
  EXPECT_FALSE(Batcher::Create(tokens, 0, 4, 1).ok());
  EXPECT_FALSE(Batcher::Create(tokens, 4, 0, 1).ok());
  EXPECT_FALSE(Batcher::Create(tokens, 4, 100, 1).ok());  // needs 101
  EXPECT_TRUE(Batcher::Create(tokens, 4, 99, 1).ok());
  EXPECT_FALSE(Batcher::Create(tokens, 1 << 16, 1 << 16, 1).ok());

  auto batcher = Batcher::Create(tokens, 2, 8, 1);
  ASSERT_TRUE(batcher.ok());
  std::vector<int32_t> inputs(16, kPoison), targets(16, kPoison);
  std::vector<int32_t> short_targets(15, kPoison);
  EXPECT_FALSE(
      batcher->Next(absl::MakeSpan(inputs), absl::MakeSpan(short_targets))
          .ok());
  EXPECT_EQ(batcher->position(), 0);  // a failed Next does not advance
  EXPECT_FALSE(
      batcher->Fill(-1, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  EXPECT_EQ(inputs, std::vector<int32_t>(16, kPoison));  // nothing written
  EXPECT_EQ(batcher->set_position(-1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batcher->position(), 0);
}

TEST(EvalBatcherTest, FixedEvenlySpacedWindows) {
  const std::vector<int32_t> tokens = Iota(1000);
  // (1000 - 1) / 10 = 99 windows fit, 24 batches of 4; capped at 5.
  auto eval = EvalBatcher::Create(tokens, 4, 10, 5);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->num_batches(), 5);
  std::vector<int64_t> starts;
  for (int64_t k = 0; k < eval->num_batches(); ++k) {
    auto batch = eval->Get(k);
    ASSERT_TRUE(batch.ok());
    for (int64_t s : CheckWindows(*batch, 4, 10, 1000)) starts.push_back(s);
    auto again = eval->Get(k);
    EXPECT_EQ(again->inputs, batch->inputs);  // the same every time
  }
  ASSERT_EQ(starts.size(), 20u);
  EXPECT_EQ(starts.front(), 0);
  EXPECT_EQ(starts.back(), 1000 - 10 - 1);  // reaches the end
  for (size_t j = 1; j < starts.size(); ++j) {
    const int64_t gap = starts[j] - starts[j - 1];
    EXPECT_GE(gap, 10);  // no overlap of predicted tokens
    EXPECT_LE(gap, 989 / 19 + 1);
  }

  // Uncapped: all the non-overlapping windows that fill whole batches.
  auto all = EvalBatcher::Create(tokens, 4, 10, 1000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->num_batches(), 24);
  int64_t previous = -10;
  for (int64_t k = 0; k < 24; ++k) {
    for (int b = 0; b < 4; ++b) {
      EXPECT_GE(all->WindowStart(k, b) - previous, 10);
      previous = all->WindowStart(k, b);
    }
  }
  // Fewer windows than a batch: one batch (windows overlap).
  const std::vector<int32_t> few = Iota(25);
  auto small = EvalBatcher::Create(few, 8, 10, 3);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->num_batches(), 1);
  auto batch = small->Get(0);
  ASSERT_TRUE(batch.ok());
  const std::vector<int64_t> small_starts = CheckWindows(*batch, 8, 10, 25);
  EXPECT_EQ(small_starts.front(), 0);
  EXPECT_EQ(small_starts.back(), 14);
}

TEST(EvalBatcherTest, RejectsBadArguments) {
  const std::vector<int32_t> tokens = Iota(100);
  EXPECT_FALSE(EvalBatcher::Create(tokens, 2, 8, 0).ok());
  EXPECT_FALSE(EvalBatcher::Create(tokens, 0, 8, 1).ok());
  EXPECT_FALSE(EvalBatcher::Create(tokens, 2, 100, 1).ok());
  auto eval = EvalBatcher::Create(tokens, 2, 8, 2);
  ASSERT_TRUE(eval.ok());
  std::vector<int32_t> inputs(16, kPoison), targets(16, kPoison);
  EXPECT_FALSE(
      eval->Fill(2, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  EXPECT_FALSE(
      eval->Fill(-1, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  EXPECT_EQ(inputs, std::vector<int32_t>(16, kPoison));
  EXPECT_TRUE(
      eval->Fill(1, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
}

}  // namespace
}  // namespace data
}  // namespace lossrt
