// Tests of train_step's host logic (bench/train_step_options.h): every flag's
// check names the flag and rejects the values next to its range; --gpus
// against the visible GPUs; when a communicator is built; the bucket size the
// trainer gets; the median; tokens/s and the scaling against random figures.
#include "bench/train_step_options.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace bench {
namespace {

// The check fails with InvalidArgument whose message names --`flag`.
void ExpectBadFlag(const TrainStepOptions& options, const std::string& flag,
                   int visible_gpus = 8) {
  const absl::Status status = CheckTrainStepOptions(options, visible_gpus);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("--" + flag + "="), std::string::npos)
      << status;
}

TEST(TrainStepOptionsTest, DefaultsAreValid) {
  EXPECT_TRUE(CheckTrainStepOptions(TrainStepOptions(), 1).ok());
  EXPECT_EQ(LmHeads(TrainStepOptions()),
            (std::vector<std::string>{"fused", "unfused"}));
}

TEST(TrainStepOptionsTest, IntegerRanges) {
  struct Case {
    const char* flag;
    int64_t TrainStepOptions::*field;
    int64_t lo, hi;
  };
  const std::vector<Case> cases = {
      {"batch", &TrainStepOptions::batch, 1, 65536},
      {"seq", &TrainStepOptions::seq, 1, 1 << 20},
      {"layers", &TrainStepOptions::layers, 1, 1024},
      {"vocab", &TrainStepOptions::vocab, 1,
       std::numeric_limits<int32_t>::max()},
      {"warmup", &TrainStepOptions::warmup, 0, 1 << 20},
      {"steps", &TrainStepOptions::steps, 1, 1 << 20},
      {"lce_workspace_mb", &TrainStepOptions::lce_workspace_mb, 0, 1 << 24},
      {"gpus", &TrainStepOptions::gpus, 1, kMaxGpus},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    for (int64_t good : {c.lo, c.hi}) {
      TrainStepOptions options;
      options.*c.field = good;
      EXPECT_TRUE(CheckTrainStepOptions(options, kMaxGpus).ok()) << good;
    }
    for (int64_t bad : {c.lo - 1, c.hi + 1}) {
      TrainStepOptions options;
      options.*c.field = bad;
      ExpectBadFlag(options, c.flag, kMaxGpus);
    }
  }
}

TEST(TrainStepOptionsTest, HeadsMustDivideWidth) {
  TrainStepOptions options;
  options.heads = 5;
  ExpectBadFlag(options, "heads");
  options.heads = 0;
  ExpectBadFlag(options, "heads");
  options.heads = 16;  // 768 = 16 * 48
  EXPECT_TRUE(CheckTrainStepOptions(options, 1).ok());
  options.width = 0;
  ExpectBadFlag(options, "width");
}

TEST(TrainStepOptionsTest, PeakTflops) {
  for (double bad :
       {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    TrainStepOptions options;
    options.peak_tflops = bad;
    ExpectBadFlag(options, "peak_tflops");
  }
}

TEST(TrainStepOptionsTest, LmHeads) {
  for (const char* good : {"fused", "unfused", "unfused,fused"}) {
    TrainStepOptions options;
    options.lm_heads = good;
    EXPECT_TRUE(CheckTrainStepOptions(options, 1).ok()) << good;
  }
  TrainStepOptions options;
  options.lm_heads = "unfused,fused";
  EXPECT_EQ(LmHeads(options), (std::vector<std::string>{"unfused", "fused"}));
  for (const char* bad : {"", "fused,", "fused,fused", "Fused", "fused,foo"}) {
    options.lm_heads = bad;
    SCOPED_TRACE(bad);
    ExpectBadFlag(options, "lm_heads");
  }
}

TEST(TrainStepOptionsTest, BucketMib) {
  for (double good : {kBucketMibUnset, 0.0, 1e-6, 25.0, 1048576.0}) {
    TrainStepOptions options;
    options.bucket_mib = good;
    EXPECT_TRUE(CheckTrainStepOptions(options, 1).ok()) << good;
  }
  for (double bad : {-0.5, -2.0, 1048577.0, std::nan(""),
                     std::numeric_limits<double>::infinity()}) {
    TrainStepOptions options;
    options.bucket_mib = bad;
    ExpectBadFlag(options, "bucket_mib");
  }
}

TEST(TrainStepOptionsTest, GpusAgainstVisibleGpus) {
  TrainStepOptions options;
  options.gpus = 2;
  EXPECT_TRUE(CheckTrainStepOptions(options, 2).ok());
  ExpectBadFlag(options, "gpus", 1);
  const absl::Status none = CheckTrainStepOptions(options, 0);
  EXPECT_NE(none.message().find("sees none"), std::string::npos) << none;
  const absl::Status one = CheckTrainStepOptions(options, 1);
  EXPECT_NE(one.message().find("the 1 visible GPU"), std::string::npos) << one;
  // One GPU asked for and none visible: the same clear error.
  options.gpus = 1;
  ExpectBadFlag(options, "gpus", 0);
}

TEST(TrainStepOptionsTest, UsesCommunicator) {
  TrainStepOptions options;
  EXPECT_FALSE(UsesCommunicator(options));  // today's one-GPU path
  options.gpus = 2;
  EXPECT_TRUE(UsesCommunicator(options));
  options = TrainStepOptions();
  options.bucket_mib = 0;
  EXPECT_TRUE(UsesCommunicator(options));
  options = TrainStepOptions();
  options.bucket_mib = 25;
  EXPECT_TRUE(UsesCommunicator(options));
  options = TrainStepOptions();
  options.zero1 = true;
  EXPECT_TRUE(UsesCommunicator(options));
  options = TrainStepOptions();
  options.force_communicator = true;
  EXPECT_TRUE(UsesCommunicator(options));
}

TEST(TrainStepOptionsTest, BucketBytes) {
  EXPECT_EQ(BucketBytes(kBucketMibUnset), int64_t{25} << 20);
  EXPECT_EQ(BucketBytes(25), int64_t{25} << 20);
  EXPECT_EQ(BucketBytes(0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(BucketBytes(0.5), int64_t{1} << 19);
  EXPECT_EQ(BucketBytes(1e-9), 4);  // at least one f32 element
  // Whole f32 elements: 1.00001 MiB = 1048586.49 bytes, 262146.6 elements.
  EXPECT_EQ(BucketBytes(1.00001), 4 * 262147);
  std::mt19937_64 engine(test::TestSeed());
  std::uniform_real_distribution<double> mib(1e-3, 1024);
  for (int i = 0; i < 1000; ++i) {
    const double value = mib(engine);
    const int64_t bytes = BucketBytes(value);
    EXPECT_EQ(bytes % 4, 0) << value;
    EXPECT_LE(std::abs(bytes - value * 1048576.0), 2.0) << value;
  }
}

TEST(TrainStepOptionsTest, Median) {
  EXPECT_EQ(MedianMs({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MedianMs({3.0}).value(), 3.0);
  EXPECT_EQ(MedianMs({5.0, 1.0}).value(), 5.0);  // the upper middle
  EXPECT_EQ(MedianMs({9.0, 1.0, 4.0}).value(), 4.0);
  std::mt19937_64 engine(test::TestSeed());
  std::uniform_real_distribution<double> ms(0.1, 100);
  for (int n = 1; n <= 41; ++n) {
    std::vector<double> times(n);
    for (double& t : times) t = ms(engine);
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(MedianMs(times).value(), sorted[n / 2]) << n;
  }
}

TEST(TrainStepOptionsTest, Throughput) {
  // 16 x 1024 tokens a GPU in 100 ms: 163840 tokens/s per GPU.
  Throughput one = MeasureThroughput(1, 16 * 1024, 100.0, std::nullopt);
  EXPECT_DOUBLE_EQ(one.tokens_per_s_per_gpu, 163840.0);
  EXPECT_DOUBLE_EQ(one.tokens_per_s_total, 163840.0);
  EXPECT_FALSE(one.scaling.has_value());
  EXPECT_FALSE(one.efficiency.has_value());
  // 4 GPUs at 104 ms a step against 100 ms alone: 4 * 100 / 104.
  Throughput four = MeasureThroughput(4, 16 * 1024, 104.0, 163840.0);
  EXPECT_DOUBLE_EQ(four.tokens_per_s_total, 4 * 16 * 1024 / 0.104);
  ASSERT_TRUE(four.scaling.has_value());
  EXPECT_NEAR(*four.scaling, 400.0 / 104.0, 1e-12);
  EXPECT_NEAR(*four.efficiency, 100.0 / 104.0, 1e-12);
  // A baseline of 0 (nothing measured) gives no scaling.
  EXPECT_FALSE(MeasureThroughput(2, 1024, 10.0, 0.0).scaling.has_value());
  std::mt19937_64 engine(test::TestSeed());
  std::uniform_real_distribution<double> ms(1, 1000);
  std::uniform_int_distribution<int64_t> gpus(1, 8), tokens(1, 1 << 20);
  for (int i = 0; i < 1000; ++i) {
    const int64_t n = gpus(engine), t = tokens(engine);
    const double alone_ms = ms(engine), step_ms = ms(engine);
    const double alone = t / (alone_ms * 1e-3);
    const Throughput r = MeasureThroughput(n, t, step_ms, alone);
    EXPECT_NEAR(r.tokens_per_s_per_gpu, t / (step_ms * 1e-3),
                1e-12 * r.tokens_per_s_per_gpu);
    EXPECT_NEAR(r.tokens_per_s_total, n * r.tokens_per_s_per_gpu,
                1e-12 * r.tokens_per_s_total);
    // The scaling is n times the ratio of the step times.
    EXPECT_NEAR(*r.scaling, n * alone_ms / step_ms, 1e-12 * *r.scaling);
    EXPECT_NEAR(*r.efficiency, alone_ms / step_ms, 1e-12 * *r.efficiency);
  }
}

}  // namespace
}  // namespace bench
}  // namespace lossrt
