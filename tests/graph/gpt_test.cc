// Tests of the graph through the GPT model: whole-model gradients against
// finite differences, the memory plan's reuse, overfitting one batch, CPU and
// GPU training from one initialization, and configuration errors.
#include "graph/gpt.h"

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "graph/trainer.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "tests/gpu_test_util.h"
#include "tests/graph/op_test_util.h"

namespace lossrt {
namespace graph {
namespace {

using test::FromHost;
using test::ToHost;

GptConfig TinyConfig() {
  GptConfig config;
  config.layers = 2;
  config.heads = 2;
  config.width = 16;
  config.context = 8;
  config.vocab = 40;
  return config;
}

std::vector<int32_t> RandomTokens(int64_t count, int64_t vocab, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<int32_t> tokens(count);
  for (int32_t& token : tokens) token = static_cast<int32_t>(engine() % vocab);
  return tokens;
}

absl::StatusOr<float> Loss(Gpt& model, const std::vector<int32_t>& ids,
                           const std::vector<int32_t>& targets) {
  RETURN_IF_ERROR(model.graph().SetInput(model.ids(), ids));
  RETURN_IF_ERROR(model.graph().SetInput(model.targets(), targets));
  RETURN_IF_ERROR(model.graph().Forward(/*training=*/false));
  return model.graph().ReadScalar(model.loss());
}

struct GradCase {
  NormKind norm;
  MlpKind mlp;
  bool tied;
  GptHead head;
};

class GptGradientTest : public ::testing::TestWithParam<GradCase> {};

// For every parameter tensor: the directional derivative along a random unit
// direction, by central differences of the loss, against <gradient,
// direction>. (The heads compute in f32, so the check runs in f32 with a step
// that keeps the rounding noise of the loss small.)
TEST_P(GptGradientTest, MatchesFiniteDifferences) {
  const GradCase c = GetParam();
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  GptConfig config = TinyConfig();
  config.norm = c.norm;
  config.mlp = c.mlp;
  config.tied_head = c.tied;
  const BatchShape shape{2, 6};
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Gpt> model,
      Gpt::Create(*context, config, shape, DType::kF32, c.head));
  ASSERT_OK(model->Initialize(seed));
  // Larger weights than GPT-2's init, so every path carries gradient.
  Graph& g = model->graph();
  for (const GptParameter& p : model->named_parameters()) {
    ASSERT_OK_AND_ASSIGN(std::vector<double> values,
                         ToHost(*context, g.master(p.value)));
    const std::vector<double> noise =
        test::RandomValues(values.size(), seed ^ p.value.id, -0.3, 0.3);
    for (size_t i = 0; i < values.size(); ++i) values[i] += noise[i];
    ASSERT_OK_AND_ASSIGN(
        OwnedTensor t,
        FromHost(*context, DType::kF32, g.info(p.value).shape, values));
    ASSERT_OK(CopyTensor(t.view, g.master(p.value), *context));
  }
  ASSERT_OK(g.SyncComputeCopy());
  const std::vector<int32_t> ids =
      RandomTokens(shape.rows(), config.vocab, seed + 1);
  std::vector<int32_t> targets =
      RandomTokens(shape.rows(), config.vocab, seed + 2);
  targets[3] = -100;  // an ignored position
  ASSERT_OK(g.ZeroGradients());
  ASSERT_OK(g.SetInput(model->ids(), ids));
  ASSERT_OK(g.SetInput(model->targets(), targets));
  ASSERT_OK(g.Forward(/*training=*/true));
  ASSERT_OK(g.Backward());
  int checked = 0;
  for (const GptParameter& p : model->named_parameters()) {
    const Tensor master = g.master(p.value);
    ASSERT_OK_AND_ASSIGN(std::vector<double> theta, ToHost(*context, master));
    ASSERT_OK_AND_ASSIGN(std::vector<double> gradient,
                         ToHost(*context, g.grad(p.value)));
    std::vector<double> direction =
        test::RandomValues(theta.size(), seed + 7 * p.value.id, -1, 1);
    double norm = 0;
    for (double d : direction) norm += d * d;
    norm = std::sqrt(norm);
    double analytic = 0;
    for (size_t i = 0; i < theta.size(); ++i) {
      direction[i] /= norm;
      analytic += gradient[i] * direction[i];
    }
    const double h = 1e-2;
    double losses[2];
    for (int side = 0; side < 2; ++side) {
      std::vector<double> moved = theta;
      for (size_t i = 0; i < theta.size(); ++i) {
        moved[i] += (side == 0 ? h : -h) * direction[i];
      }
      ASSERT_OK_AND_ASSIGN(
          OwnedTensor t, FromHost(*context, DType::kF32, master.shape, moved));
      ASSERT_OK(CopyTensor(t.view, master, *context));
      ASSERT_OK(g.SyncComputeCopy());
      ASSERT_OK_AND_ASSIGN(float loss, Loss(*model, ids, targets));
      losses[side] = loss;
    }
    ASSERT_OK_AND_ASSIGN(OwnedTensor restore,
                         FromHost(*context, DType::kF32, master.shape, theta));
    ASSERT_OK(CopyTensor(restore.view, master, *context));
    ASSERT_OK(g.SyncComputeCopy());
    const double numeric = (losses[0] - losses[1]) / (2 * h);
    EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric)) << p.name;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

INSTANTIATE_TEST_SUITE_P(
    Models, GptGradientTest,
    ::testing::Values(GradCase{NormKind::kLayerNorm, MlpKind::kGelu, true,
                               GptHead::kFusedLoss},
                      GradCase{NormKind::kRmsNorm, MlpKind::kSwiGlu, false,
                               GptHead::kFusedLoss},
                      GradCase{NormKind::kLayerNorm, MlpKind::kGelu, false,
                               GptHead::kUnfusedLoss}));

TEST(GptTest, MemoryPlanReusesActivationMemory) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  GptConfig config = TinyConfig();
  config.layers = 6;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Gpt> model,
      Gpt::Create(*context, config, {4, 8}, DType::kF32, GptHead::kFusedLoss));
  const Graph& g = model->graph();
  int64_t unplanned = 0;
  for (const auto& node : g.nodes()) {
    const ValueInfo& out = g.info(node->outputs[0]);
    unplanned +=
        out.numel() * DTypeSize(out.dtype) * (out.requires_grad ? 2 : 1);
    // Saved tensors (the GELU MLP's hidden activations among them) live in
    // the arena too.
    for (const AuxSpec& aux : node->aux) {
      int64_t numel = 1;
      for (int64_t dim : aux.shape) numel *= dim;
      unplanned += numel * DTypeSize(aux.dtype);
    }
  }
  EXPECT_LT(g.arena_bytes(), unplanned * 3 / 4)
      << "arena " << g.arena_bytes() << " of " << unplanned;
}

TEST(GptTest, OverfitsOneBatch) {
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  GptConfig config = TinyConfig();
  config.width = 32;
  config.context = 16;
  const BatchShape shape{2, 16};
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Gpt> model,
      Gpt::Create(*context, config, shape, DType::kF32, GptHead::kFusedLoss));
  ASSERT_OK(model->Initialize(seed));
  TrainerOptions options;
  options.schedule = {3e-3f, 3e-3f, 10, 300};
  options.adamw.weight_decay = 0.0f;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer,
                       Trainer::Create(*model, options));
  const std::vector<int32_t> ids =
      RandomTokens(shape.rows(), config.vocab, seed + 1);
  const std::vector<int32_t> targets =
      RandomTokens(shape.rows(), config.vocab, seed + 2);
  float first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    ASSERT_OK_AND_ASSIGN(Trainer::StepStats stats, trainer->Step(ids, targets));
    if (step == 0) first = stats.loss;
    last = stats.loss;
  }
  EXPECT_GT(first, 3.0f);  // about log(40) at the start
  EXPECT_LT(last, 0.05f) << "from " << first;
}

TEST(GptTest, CpuAndGpuTrainAlike) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  GptConfig config = TinyConfig();
  config.width = 64;
  config.heads = 4;
  config.context = 32;
  config.vocab = 256;
  const BatchShape shape{4, 32};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Gpt> on_cpu,
        Gpt::Create(*cpu, config, shape, DType::kF32, GptHead::kFusedLoss));
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Gpt> on_gpu,
        Gpt::Create(*gpu, config, shape, dtype, GptHead::kFusedLoss));
    ASSERT_OK(on_cpu->Initialize(seed));
    ASSERT_OK(on_gpu->CopyParametersFrom(*on_cpu));
    TrainerOptions options;
    options.schedule = {1e-3f, 1e-4f, 2, 6};
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> cpu_trainer,
                         Trainer::Create(*on_cpu, options));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> gpu_trainer,
                         Trainer::Create(*on_gpu, options));
    for (int step = 0; step < 6; ++step) {
      const std::vector<int32_t> ids =
          RandomTokens(shape.rows(), config.vocab, seed + 10 + step);
      const std::vector<int32_t> targets =
          RandomTokens(shape.rows(), config.vocab, seed + 20 + step);
      ASSERT_OK_AND_ASSIGN(Trainer::StepStats a,
                           cpu_trainer->Step(ids, targets));
      ASSERT_OK_AND_ASSIGN(Trainer::StepStats b,
                           gpu_trainer->Step(ids, targets));
      const float tolerance = dtype == DType::kF32 ? 1e-4f : 2e-2f;
      EXPECT_NEAR(a.loss, b.loss, tolerance * a.loss)
          << DTypeName(dtype) << " step " << step;
      EXPECT_NEAR(a.grad_norm, b.grad_norm,
                  (dtype == DType::kF32 ? 1e-3f : 5e-2f) * a.grad_norm)
          << DTypeName(dtype) << " step " << step;
    }
  }
}

TEST(GptTest, CudaGraphStepsMatchEagerSteps) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  GptConfig config = TinyConfig();
  config.width = 64;
  config.heads = 4;
  config.context = 32;
  config.vocab = 256;
  const BatchShape shape{4, 32};
  LinearCrossEntropyOptions head;
  head.cross_entropy.validate_targets = false;
  head.overlap_streams = false;
  std::vector<std::vector<float>> losses;
  for (bool graph : {false, true}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Gpt> model,
                         Gpt::Create(*gpu, config, shape, DType::kBF16,
                                     GptHead::kFusedLoss, head));
    ASSERT_OK(model->Initialize(seed));
    TrainerOptions options;
    options.schedule = {1e-3f, 1e-4f, 2, 6};
    options.cuda_graph = graph;
    options.micro_batches = 2;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer,
                         Trainer::Create(*model, options));
    losses.emplace_back();
    for (int step = 0; step < 6; ++step) {
      std::vector<int32_t> ids =
          RandomTokens(2 * shape.rows(), config.vocab, seed + 10 + step);
      std::vector<int32_t> targets =
          RandomTokens(2 * shape.rows(), config.vocab, seed + 20 + step);
      ASSERT_OK_AND_ASSIGN(Trainer::StepStats stats,
                           trainer->Step(ids, targets));
      losses.back().push_back(stats.loss);
    }
    EXPECT_EQ(model->graph().has_cuda_graph(), graph);
  }
  for (int step = 0; step < 6; ++step) {
    // Only the embedding's fp32 atomics may order sums differently.
    EXPECT_NEAR(losses[0][step], losses[1][step], 1e-4f * losses[0][step])
        << "step " << step;
  }
}

TEST(GptTest, RejectsBadConfigurations) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  auto create = [&](GptConfig config, BatchShape shape) {
    return Gpt::Create(*context, config, shape, DType::kF32,
                       GptHead::kFusedLoss)
        .status()
        .code();
  };
  GptConfig heads = TinyConfig();
  heads.heads = 3;  // does not divide 16
  EXPECT_EQ(create(heads, {1, 4}), absl::StatusCode::kInvalidArgument);
  GptConfig vocab = TinyConfig();
  vocab.vocab = 0;
  EXPECT_EQ(create(vocab, {1, 4}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(TinyConfig(), {1, 9}),  // over the context of 8
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(TinyConfig(), {0, 4}), absl::StatusCode::kInvalidArgument);
  GptConfig layers = TinyConfig();
  layers.layers = 0;
  EXPECT_EQ(create(layers, {1, 4}), absl::StatusCode::kInvalidArgument);
  // bf16 activations are for GPUs.
  EXPECT_EQ(Gpt::Create(*context, TinyConfig(), {1, 4}, DType::kBF16,
                        GptHead::kFusedLoss)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Token ids past the vocabulary are refused before anything runs.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Gpt> model,
                       Gpt::Create(*context, TinyConfig(), {1, 4}, DType::kF32,
                                   GptHead::kFusedLoss));
  EXPECT_EQ(model->graph().SetInput(model->ids(), {1, 2, 40, 3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->graph().SetInput(model->ids(), {1, 2, 3}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace graph
}  // namespace lossrt
