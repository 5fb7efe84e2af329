// Tests of the checks and kernel arguments that the cross-entropy and the
// linear cross-entropy share (loss/loss_checks.h, loss/kernel_args.h), on the
// CPU: every bad value is an InvalidArgument naming it, good values pass, the
// row arguments carry every option, and the two ops reject the same bad input
// with the same message.
#include "loss/loss_checks.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "loss/cross_entropy.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/kernel_args.h"
#include "loss/linear_cross_entropy.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/status_assertions.h"

namespace lossrt {
namespace {

int64_t Pick(std::mt19937_64& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

float PickFloat(std::mt19937_64& rng, float low, float high) {
  return std::uniform_real_distribution<float>(low, high)(rng);
}

// InvalidArgument whose message mentions `name`.
void ExpectRejected(const absl::Status& status, const std::string& name) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(name), std::string::npos)
      << status;
}

class LossChecksTest : public testing::Test {
 protected:
  void SetUp() override {
    rng_.seed(test::TestSeed());
    absl::StatusOr<std::unique_ptr<Context>> created =
        Context::Create(Device::Cpu());
    ASSERT_OK(created.status());
    context_ = std::move(created).value();
  }
  std::mt19937_64 rng_;
  std::unique_ptr<Context> context_;
};

TEST_F(LossChecksTest, OptionsInRangePassAndEveryBadValueIsNamed) {
  const int64_t vocab = Pick(rng_, 1, 5000);
  std::vector<float> weights(vocab, 1.0f);  // [vocab]
  CrossEntropyOptions good;
  good.label_smoothing = PickFloat(rng_, 0.0f, 0.999f);
  good.z_loss = PickFloat(rng_, 0.0f, 10.0f);
  good.softcap = PickFloat(rng_, 0.0f, 50.0f);
  good.class_weights =
      Tensor::Of(weights.data(), DType::kF32, {vocab}, Device::Cpu());
  ASSERT_OK(ce::CheckCrossEntropyOptions(good, vocab, *context_));
  good.class_weights.reset();
  ASSERT_OK(ce::CheckCrossEntropyOptions(good, vocab, *context_));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Bad {
    std::string name;  // the option the message must name
    std::function<void(CrossEntropyOptions&)> edit;
  };
  const std::vector<Bad> bads = {
      {"label_smoothing", [](auto& o) { o.label_smoothing = 1.0f; }},
      {"label_smoothing", [](auto& o) { o.label_smoothing = -1e-6f; }},
      {"label_smoothing", [&](auto& o) { o.label_smoothing = nan; }},
      {"z_loss", [](auto& o) { o.z_loss = -1e-6f; }},
      {"z_loss", [&](auto& o) { o.z_loss = inf; }},
      {"z_loss", [&](auto& o) { o.z_loss = nan; }},
      {"softcap", [](auto& o) { o.softcap = -1.0f; }},
      {"softcap", [&](auto& o) { o.softcap = inf; }},
      {"softcap", [&](auto& o) { o.softcap = nan; }},
      {"class_weights",
       [&](auto& o) {
         o.class_weights = Tensor::Of(weights.data(), DType::kF32, {vocab - 1},
                                      Device::Cpu());
       }},
      {"class_weights",
       [&](auto& o) {
         o.class_weights =
             Tensor::Of(weights.data(), DType::kF16, {vocab}, Device::Cpu());
       }},
      {"class_weights",
       [&](auto& o) {
         o.class_weights =
             Tensor::Of(weights.data(), DType::kF32, {vocab}, Device::Cuda(0));
       }},
      {"class_weights",
       [&](auto& o) {
         o.class_weights =
             Tensor::Of(nullptr, DType::kF32, {vocab}, Device::Cpu());
       }},
  };
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.name);
    CrossEntropyOptions options = good;
    bad.edit(options);
    ExpectRejected(ce::CheckCrossEntropyOptions(options, vocab, *context_),
                   bad.name);
  }
}

TEST_F(LossChecksTest, TargetStatsNameTheCountsAndFollowValidateTargets) {
  const int64_t tokens = Pick(rng_, 1, 100000), vocab = Pick(rng_, 1, 100000);
  ce::TargetStats stats{};
  CrossEntropyOptions options;
  ASSERT_OK(ce::CheckTargetStats(stats, options, tokens, vocab));
  EXPECT_TRUE(ce::ChecksTargetStats(options));

  stats.invalid = Pick(rng_, 1, tokens);
  const absl::Status invalid =
      ce::CheckTargetStats(stats, options, tokens, vocab);
  ExpectRejected(invalid, "targets");
  for (const int64_t number : {stats.invalid, tokens, vocab})
    ExpectRejected(invalid, std::to_string(number));
  ExpectRejected(invalid, std::to_string(options.ignore_index));
  // Unvalidated: the caller asked for NaN losses instead.
  options.validate_targets = false;
  ASSERT_OK(ce::CheckTargetStats(stats, options, tokens, vocab));
  EXPECT_FALSE(ce::ChecksTargetStats(options));

  // Negative weights are always rejected.
  stats.negative_weights = Pick(rng_, 1, vocab);
  const absl::Status negative =
      ce::CheckTargetStats(stats, options, tokens, vocab);
  ExpectRejected(negative, "class_weights");
  ExpectRejected(negative, std::to_string(stats.negative_weights));
  std::vector<float> weights(vocab);
  options.class_weights =
      Tensor::Of(weights.data(), DType::kF32, {vocab}, Device::Cpu());
  EXPECT_TRUE(ce::ChecksTargetStats(options));
}

TEST_F(LossChecksTest, TensorsOnTheContext) {
  const int64_t rows = Pick(rng_, 1, 50), cols = Pick(rng_, 1, 50);
  std::vector<float> data((rows - 1) * (cols + 3) + cols);
  const Tensor contiguous =
      Tensor::Of(data.data(), DType::kF32, {rows, cols}, Device::Cpu());
  ASSERT_OK(ce::CheckOnContext(contiguous, *context_, "x"));
  ASSERT_OK(
      ce::CheckOnContext(Tensor::Of(data.data(), DType::kF32, {rows, cols},
                                    Device::Cpu(), cols + 3),
                         *context_, "x"));
  ASSERT_OK(ce::CheckOnContext(
      Tensor::Of(nullptr, DType::kF32, {0, cols}, Device::Cpu()), *context_,
      "x"));
  ExpectRejected(ce::CheckOnContext(Tensor::Of(data.data(), DType::kF32,
                                               {rows, cols}, Device::Cuda(0)),
                                    *context_, "hidden"),
                 "hidden is on cuda:0 but the context is on cpu");
  ExpectRejected(ce::CheckOnContext(Tensor::Of(nullptr, DType::kF32,
                                               {rows, cols}, Device::Cpu()),
                                    *context_, "weight"),
                 "weight: null data");
  if (cols > 1) {
    ExpectRejected(
        ce::CheckOnContext(Tensor::Of(data.data(), DType::kF32, {rows, cols},
                                      Device::Cpu(), cols - 1),
                           *context_, "logits"),
        "logits: row_stride");
  }
}

TEST_F(LossChecksTest, LossLseAndVocabShapes) {
  const int64_t tokens = Pick(rng_, 2, 1000);
  std::vector<float> data(tokens);
  const Device cpu = Device::Cpu();
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum}) {
    ASSERT_OK(ce::CheckLossTensor(Tensor::Of(data.data(), DType::kF32, {}, cpu),
                                  reduction, tokens, *context_, "loss"));
    ASSERT_OK(
        ce::CheckLossTensor(Tensor::Of(data.data(), DType::kF32, {1}, cpu),
                            reduction, tokens, *context_, "loss"));
    ExpectRejected(
        ce::CheckLossTensor(Tensor::Of(data.data(), DType::kF32, {tokens}, cpu),
                            reduction, tokens, *context_, "grad_loss"),
        "grad_loss: expected a scalar");
  }
  ASSERT_OK(
      ce::CheckLossTensor(Tensor::Of(data.data(), DType::kF32, {tokens}, cpu),
                          Reduction::kNone, tokens, *context_, "loss"));
  ExpectRejected(
      ce::CheckLossTensor(Tensor::Of(data.data(), DType::kF32, {}, cpu),
                          Reduction::kNone, tokens, *context_, "loss"),
      "loss");
  ExpectRejected(
      ce::CheckLossTensor(Tensor::Of(data.data(), DType::kBF16, {}, cpu),
                          Reduction::kMean, tokens, *context_, "loss"),
      "loss");
  ASSERT_OK(ce::CheckLseTensor(
      Tensor::Of(data.data(), DType::kF32, {tokens}, cpu), tokens, *context_));
  ExpectRejected(ce::CheckLseTensor(
                     Tensor::Of(data.data(), DType::kF32, {tokens - 1}, cpu),
                     tokens, *context_),
                 "lse");

  ASSERT_OK(ce::CheckVocab(Pick(rng_, 1, ce::kMaxVocab), "logits"));
  ExpectRejected(ce::CheckVocab(0, "logits"), "logits");
  ExpectRejected(ce::CheckVocab(ce::kMaxVocab + Pick(rng_, 1, 1000), "weight"),
                 "weight");
}

TEST_F(LossChecksTest, RowArgsCarryEveryOption) {
  std::vector<float> weights(10);
  std::vector<int32_t> targets(7);
  const float logits = 0.0f;
  for (Reduction reduction :
       {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    CrossEntropyOptions options;
    options.ignore_index = Pick(rng_, -1000, 1000);
    options.reduction = reduction;
    options.label_smoothing = PickFloat(rng_, 0.0f, 0.9f);
    options.z_loss = PickFloat(rng_, 0.0f, 1.0f);
    options.softcap = PickFloat(rng_, 0.0f, 30.0f);
    if (reduction != Reduction::kSum) {
      options.class_weights =
          Tensor::Of(weights.data(), DType::kF32, {10}, Device::Cpu());
    }
    const int64_t stride = Pick(rng_, 10, 20), rows = Pick(rng_, 1, 7);
    const ce::RowArgs args =
        ce::MakeRowArgs(&logits, DType::kBF16, stride, rows, 10, targets.data(),
                        false, options);
    EXPECT_EQ(args.logits, &logits);
    EXPECT_EQ(args.logits_type, DType::kBF16);
    EXPECT_EQ(args.logits_stride, stride);
    EXPECT_EQ(args.rows, rows);
    EXPECT_EQ(args.vocab, 10);
    EXPECT_EQ(args.targets, targets.data());
    EXPECT_FALSE(args.targets_i64);
    EXPECT_EQ(args.ignore_index, options.ignore_index);
    EXPECT_EQ(args.label_smoothing, options.label_smoothing);
    EXPECT_EQ(args.z_loss, options.z_loss);
    EXPECT_EQ(args.softcap, options.softcap);
    EXPECT_EQ(args.class_weights,
              reduction != Reduction::kSum ? weights.data() : nullptr);
    EXPECT_EQ(args.reduction, reduction == Reduction::kMean  ? ce::kMean
                              : reduction == Reduction::kSum ? ce::kSum
                                                             : ce::kNone);
    // What the caller sets stays unset.
    EXPECT_EQ(args.stats, nullptr);
    EXPECT_EQ(args.row_loss, nullptr);
    EXPECT_EQ(args.lse, nullptr);
    EXPECT_EQ(args.grad, nullptr);
    EXPECT_EQ(args.grad_loss, nullptr);
    EXPECT_FALSE(args.follows_scan);
  }
}

// The same bad input to the cross-entropy (logits [N, V]) and to the linear
// cross-entropy (hidden [N, H], weight [V, H]): one message.
TEST_F(LossChecksTest, BothOpsRejectTheSameInputWithTheSameMessage) {
  const int64_t n = Pick(rng_, 2, 40), h = Pick(rng_, 1, 16),
                v = Pick(rng_, 2, 200);
  const Device cpu = Device::Cpu();
  std::normal_distribution<float> normal;
  std::vector<float> logits(n * v), hidden(n * h), weight(v * h), weights(v),
      loss(n), d_hidden(n * h), d_weight(v * h);
  for (std::vector<float>* values : {&logits, &hidden, &weight})
    for (float& x : *values) x = normal(rng_);
  for (float& w : weights) w = PickFloat(rng_, 0.5f, 2.0f);
  std::vector<int64_t> targets(n);
  for (int64_t& t : targets) t = Pick(rng_, 0, v - 1);

  struct Bad {
    std::string name;
    std::function<void(CrossEntropyOptions&)> edit_options;
    int64_t bad_target = -1;  // index of a target set past the vocabulary
    int64_t bad_weight = -1;  // index of a class weight set negative
    Shape loss_shape = {};    // the loss's shape (mean reduction)
  };
  std::vector<Bad> bads = {
      {"label_smoothing", [](auto& o) { o.label_smoothing = 1.0f; }},
      {"z_loss", [](auto& o) { o.z_loss = -2.0f; }},
      {"softcap", [](auto& o) { o.softcap = NAN; }},
      {"class_weights shape",
       [&](auto& o) {
         o.class_weights =
             Tensor::Of(weights.data(), DType::kF32, {v - 1}, cpu);
       }},
      {"target", [](auto&) {}, Pick(rng_, 0, n - 1)},
      {"class weight", [](auto&) {}, -1, Pick(rng_, 0, v - 1)},
      {"loss shape", [](auto&) {}, -1, -1, {2}},
  };
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.name);
    std::vector<int64_t> bad_targets = targets;
    if (bad.bad_target >= 0) bad_targets[bad.bad_target] = v + 7;
    std::vector<float> bad_weights = weights;
    if (bad.bad_weight >= 0) bad_weights[bad.bad_weight] = -1.0f;
    CrossEntropyOptions options;
    options.class_weights =
        Tensor::Of(bad_weights.data(), DType::kF32, {v}, cpu);
    bad.edit_options(options);
    const Tensor targets_view =
        Tensor::Of(bad_targets.data(), DType::kI64, {n}, cpu);
    const Tensor loss_view =
        Tensor::Of(loss.data(), DType::kF32, bad.loss_shape, cpu);

    const absl::Status ce_status = CrossEntropyForward(
        *context_, Tensor::Of(logits.data(), DType::kF32, {n, v}, cpu),
        targets_view, options, loss_view);
    LinearCrossEntropyOptions lce_options;
    lce_options.cross_entropy = options;
    const absl::Status lce_status = LinearCrossEntropyForwardBackward(
        *context_,
        {Tensor::Of(hidden.data(), DType::kF32, {n, h}, cpu),
         Tensor::Of(weight.data(), DType::kF32, {v, h}, cpu), std::nullopt,
         targets_view},
        lce_options, loss_view, nullptr,
        {Tensor::Of(d_hidden.data(), DType::kF32, {n, h}, cpu),
         Tensor::Of(d_weight.data(), DType::kF32, {v, h}, cpu), std::nullopt});
    EXPECT_EQ(ce_status.code(), absl::StatusCode::kInvalidArgument)
        << ce_status;
    EXPECT_EQ(ce_status, lce_status);
  }
}

}  // namespace
}  // namespace lossrt
