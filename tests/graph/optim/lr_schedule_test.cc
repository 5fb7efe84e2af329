// Tests of the learning-rate schedule (graph/optim/lr_schedule.h): warmup
// endpoints and linearity, monotone cosine decay, the midpoint, min_lr at and
// after the end, the degenerate schedules and validation.
#include "graph/optim/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace lossrt {
namespace optim {
namespace {

constexpr LrSchedule kSchedule{/*max_lr=*/6e-4f, /*min_lr=*/6e-5f,
                               /*warmup_steps=*/100, /*total_steps=*/1000};

TEST(LrScheduleTest, WarmupIsLinearFromMaxOverWarmupToMax) {
  EXPECT_FLOAT_EQ(LearningRate(kSchedule, 1), 6e-4f / 100);
  EXPECT_FLOAT_EQ(LearningRate(kSchedule, 50), 6e-4f * 50 / 100);
  EXPECT_FLOAT_EQ(LearningRate(kSchedule, 100), 6e-4f);
  for (int64_t step = 1; step <= 100; ++step) {
    EXPECT_FLOAT_EQ(LearningRate(kSchedule, step),
                    static_cast<double>(6e-4f) * step / 100)
        << "step " << step;
  }
  // Steps before 1 are step 1.
  EXPECT_EQ(LearningRate(kSchedule, 0), LearningRate(kSchedule, 1));
  EXPECT_EQ(LearningRate(kSchedule, -5), LearningRate(kSchedule, 1));
}

TEST(LrScheduleTest, CosineDecayIsMonotoneToMinAtTheEnd) {
  float previous = LearningRate(kSchedule, 100);
  for (int64_t step = 101; step <= 1000; ++step) {
    const float lr = LearningRate(kSchedule, step);
    EXPECT_LT(lr, previous) << "step " << step;
    EXPECT_GE(lr, kSchedule.min_lr) << "step " << step;
    previous = lr;
  }
  // Just past the warmup the decay has barely started.
  EXPECT_GT(LearningRate(kSchedule, 101), 0.9999f * kSchedule.max_lr);
  // Halfway through the decay: the mean of max and min.
  EXPECT_FLOAT_EQ(LearningRate(kSchedule, 550), (6e-4f + 6e-5f) / 2);
  // A quarter of the way: min + (max - min) * (1 + cos(pi / 4)) / 2.
  EXPECT_FLOAT_EQ(LearningRate(kSchedule, 325),
                  6e-5 + 5.4e-4 * (1 + std::sqrt(0.5)) / 2);
  EXPECT_FLOAT_EQ(LearningRate(kSchedule, 1000), kSchedule.min_lr);
  EXPECT_EQ(LearningRate(kSchedule, 1001), kSchedule.min_lr);
  EXPECT_EQ(LearningRate(kSchedule, 1 << 30), kSchedule.min_lr);
}

TEST(LrScheduleTest, DegenerateSchedules) {
  // No warmup: the decay starts at step 0 (max_lr), step 1 is just below.
  const LrSchedule no_warmup{1.0f, 0.0f, 0, 10};
  ASSERT_TRUE(ValidateLrSchedule(no_warmup).ok());
  EXPECT_LT(LearningRate(no_warmup, 1), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(no_warmup, 1), 0.5 * (1 + std::cos(M_PI / 10)));
  EXPECT_FLOAT_EQ(LearningRate(no_warmup, 10), 0.0f);
  // Warmup over the whole run: max_lr at the last step, then min_lr.
  const LrSchedule all_warmup{1.0f, 0.5f, 10, 10};
  ASSERT_TRUE(ValidateLrSchedule(all_warmup).ok());
  EXPECT_FLOAT_EQ(LearningRate(all_warmup, 10), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(all_warmup, 11), 0.5f);
  // A constant schedule.
  const LrSchedule constant{3e-4f, 3e-4f, 0, 100};
  ASSERT_TRUE(ValidateLrSchedule(constant).ok());
  for (int64_t step : {1, 50, 100, 200}) {
    EXPECT_FLOAT_EQ(LearningRate(constant, step), 3e-4f);
  }
}

TEST(LrScheduleTest, Validation) {
  EXPECT_TRUE(ValidateLrSchedule(kSchedule).ok());
  struct Bad {
    LrSchedule schedule;
    const char* field;
  };
  const Bad bad[] = {
      {{0.0f, 0.0f, 10, 100}, "max_lr"},
      {{-1e-3f, 0.0f, 10, 100}, "max_lr"},
      {{INFINITY, 0.0f, 10, 100}, "max_lr"},
      {{NAN, 0.0f, 10, 100}, "max_lr"},
      {{1e-3f, -1e-4f, 10, 100}, "min_lr"},
      {{1e-3f, 2e-3f, 10, 100}, "min_lr"},
      {{1e-3f, NAN, 10, 100}, "min_lr"},
      {{1e-3f, 1e-4f, -1, 100}, "warmup_steps"},
      {{1e-3f, 1e-4f, 101, 100}, "warmup_steps"},
      {{1e-3f, 1e-4f, 0, 0}, "total_steps"},
  };
  for (const Bad& b : bad) {
    const absl::Status status = ValidateLrSchedule(b.schedule);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << b.field << ": " << status;
    EXPECT_NE(status.message().find(b.field), absl::string_view::npos)
        << status;
  }
}

}  // namespace
}  // namespace optim
}  // namespace lossrt
