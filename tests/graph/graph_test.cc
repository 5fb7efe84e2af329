// Tests of the graph executor's buffer sharing: a residual added in a Linear
// or GeluMlp node's GEMM (whose gradient the memory plan may give the output
// gradient's buffer) gives the gradients of an explicit Add, including when
// the residual is also the node's x and when it has other consumers; the loss
// head's in-place logits gradient gives the gradients of a separate buffer.
#include "graph/graph.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "tests/gpu_test_util.h"
#include "tests/graph/op_test_util.h"

namespace lossrt {
namespace graph {
namespace {

using test::FromHost;
using test::ToHost;

constexpr int64_t kRows = 12, kWidth = 8, kHidden = 16, kVocab = 10;

struct Built {
  std::unique_ptr<Graph> graph;
  Value ids, targets, loss;
  std::vector<Value> params;
};

// ids -> embedding h0; h1 = h0 W1^T + b1 + h0 (the residual is also x);
// h2 = mlp(ln(h1)) + h1; h3 = ln(h2) W3^T + h2 + h1 (h1 consumed again);
// loss = CE(h3 Wout^T). With `fused`, the residuals go into the nodes;
// otherwise explicit Adds.
absl::StatusOr<Built> Build(Context& context, DType dtype, bool fused) {
  Built b;
  b.graph = std::make_unique<Graph>(dtype);
  Graph& g = *b.graph;
  auto param = [&](const std::string& name, Shape shape) {
    const Value v = g.Parameter(name, std::move(shape), true);
    b.params.push_back(v);
    return v;
  };
  b.ids = g.Input("ids", {kRows}, DType::kI32, kVocab);
  b.targets = g.Input("targets", {kRows}, DType::kI32, kVocab);
  const Value table = param("table", {kVocab, kWidth});
  const Value w1 = param("w1", {kWidth, kWidth});
  const Value b1 = param("b1", {kWidth});
  const Value gamma = param("gamma", {kWidth});
  const Value beta = param("beta", {kWidth});
  const Value m1 = param("m1", {kHidden, kWidth});
  const Value mb1 = param("mb1", {kHidden});
  const Value m2 = param("m2", {kWidth, kHidden});
  const Value mb2 = param("mb2", {kWidth});
  const Value w3 = param("w3", {kWidth, kWidth});
  const Value out = param("out", {kVocab, kWidth});
  const Value h0 = g.Embedding(b.ids, table, std::nullopt, kRows);
  Value h1, h2, h3;
  if (fused) {
    h1 = g.Linear(h0, w1, b1, h0);
    h2 = g.GeluMlp(g.LayerNorm(h1, gamma, beta, 1e-5f), m1, mb1, m2, mb2, h1);
    h3 = g.Linear(g.LayerNorm(h2, gamma, beta, 1e-5f), w3, std::nullopt, h2);
  } else {
    h1 = g.Add(h0, g.Linear(h0, w1, b1));
    h2 = g.Add(
        h1, g.GeluMlp(g.LayerNorm(h1, gamma, beta, 1e-5f), m1, mb1, m2, mb2));
    h3 = g.Add(h2,
               g.Linear(g.LayerNorm(h2, gamma, beta, 1e-5f), w3, std::nullopt));
  }
  h3 = g.Add(h3, h1);
  b.loss = g.CrossEntropy(g.Linear(h3, out, std::nullopt), b.targets,
                          CrossEntropyOptions{});
  RETURN_IF_ERROR(g.Compile(context));
  return b;
}

// Loss and parameter gradients after one forward and backward from
// parameters drawn from `seed`.
absl::StatusOr<std::vector<std::vector<double>>> StepGradients(Context& context,
                                                               DType dtype,
                                                               bool fused,
                                                               uint64_t seed) {
  ASSIGN_OR_RETURN(Built b, Build(context, dtype, fused));
  Graph& g = *b.graph;
  for (const Value& p : b.params) {
    const Tensor master = g.master(p);
    const std::vector<double> values =
        test::RandomValues(master.numel(), seed + p.id, -0.5, 0.5);
    ASSIGN_OR_RETURN(OwnedTensor t,
                     FromHost(context, master.dtype, master.shape, values));
    RETURN_IF_ERROR(CopyTensor(t.view, master, context));
  }
  RETURN_IF_ERROR(g.SyncComputeCopy());
  std::mt19937_64 engine(seed);
  std::vector<int32_t> ids(kRows), targets(kRows);
  for (int32_t& id : ids) id = static_cast<int32_t>(engine() % kVocab);
  for (int32_t& t : targets) t = static_cast<int32_t>(engine() % kVocab);
  RETURN_IF_ERROR(g.ZeroGradients());
  RETURN_IF_ERROR(g.SetInput(b.ids, ids));
  RETURN_IF_ERROR(g.SetInput(b.targets, targets));
  RETURN_IF_ERROR(g.Forward(/*training=*/true));
  RETURN_IF_ERROR(g.Backward());
  std::vector<std::vector<double>> result;
  ASSIGN_OR_RETURN(float loss, g.ReadScalar(b.loss));
  result.push_back({loss});
  for (const Value& p : b.params) {
    ASSIGN_OR_RETURN(std::vector<double> grad, ToHost(context, g.grad(p)));
    result.push_back(std::move(grad));
  }
  return result;
}

TEST(GraphResidualTest, FusedResidualsMatchExplicitAdds) {
  const uint64_t seed = test::TestSeed();
  const auto runs = test::TestRuns(DType::kF32, {DType::kF32});
  for (const auto& [device, dtype] : runs) {
    SCOPED_TRACE(DTypeName(dtype));
    std::unique_ptr<Context> context = test::MakeContext(device);
    ASSERT_NE(context, nullptr);
    ASSERT_OK_AND_ASSIGN(auto want,
                         StepGradients(*context, dtype, false, seed));
    ASSERT_OK_AND_ASSIGN(auto got, StepGradients(*context, dtype, true, seed));
    ASSERT_EQ(got.size(), want.size());
    // f32 (the loss heads' dtype): the two paths add in another order.
    const double tol = 1e-5;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(test::AllClose(got[i], want[i], tol, tol)) << "entry " << i;
    }
  }
}

// The unfused loss head writes the logits' gradient over the logits when
// nothing else reads them (and gives the fused head's gradients); with another
// reader the gradient keeps a buffer of its own.
TEST(GraphLossHeadTest, LogitsGradientTakesTheLogitsBufferWhenItCan) {
  const uint64_t seed = test::TestSeed();
  const auto runs = test::TestRuns(DType::kF32, {DType::kF32});
  for (const auto& [device, dtype] : runs) {
    SCOPED_TRACE(device.ToString());
    std::unique_ptr<Context> context = test::MakeContext(device);
    ASSERT_NE(context, nullptr);
    std::vector<std::vector<double>> results[2];
    for (bool fused : {false, true}) {
      Graph g(dtype);
      const Value ids = g.Input("ids", {kRows}, DType::kI32, kVocab);
      const Value targets = g.Input("targets", {kRows}, DType::kI32, kVocab);
      const Value table = g.Parameter("table", {kVocab, kWidth}, true);
      const Value out = g.Parameter("out", {kVocab, kWidth}, true);
      const Value hidden = g.Embedding(ids, table, std::nullopt, kRows);
      Value loss, logits;
      if (fused) {
        loss = g.LinearCrossEntropy(hidden, out, std::nullopt, targets,
                                    LinearCrossEntropyOptions{});
      } else {
        logits = g.Linear(hidden, out, std::nullopt);
        loss = g.CrossEntropy(logits, targets, CrossEntropyOptions{});
      }
      ASSERT_OK(g.Compile(*context));
      if (!fused) {
        EXPECT_EQ(g.info(logits).grad_offset, g.info(logits).data_offset);
      }
      for (const Value& p : {table, out}) {
        const Tensor master = g.master(p);
        ASSERT_OK_AND_ASSIGN(
            OwnedTensor t,
            FromHost(*context, master.dtype, master.shape,
                     test::RandomValues(master.numel(), seed + p.id, -1, 1)));
        ASSERT_OK(CopyTensor(t.view, master, *context));
      }
      ASSERT_OK(g.SyncComputeCopy());
      std::mt19937_64 engine(seed);
      std::vector<int32_t> id_values(kRows), target_values(kRows);
      for (int32_t& id : id_values)
        id = static_cast<int32_t>(engine() % kVocab);
      for (int32_t& t : target_values) {
        t = static_cast<int32_t>(engine() % kVocab);
      }
      ASSERT_OK(g.ZeroGradients());
      ASSERT_OK(g.SetInput(ids, id_values));
      ASSERT_OK(g.SetInput(targets, target_values));
      ASSERT_OK(g.Forward(/*training=*/true));
      ASSERT_OK(g.Backward());
      ASSERT_OK_AND_ASSIGN(float loss_value, g.ReadScalar(loss));
      results[fused].push_back({loss_value});
      for (const Value& p : {table, out}) {
        ASSERT_OK_AND_ASSIGN(std::vector<double> grad,
                             ToHost(*context, g.grad(p)));
        results[fused].push_back(std::move(grad));
      }
    }
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(test::AllClose(results[0][i], results[1][i], 1e-5, 1e-5))
          << "entry " << i;
    }
  }
  // A second reader of the logits (before the loss, so that the loss's
  // backward writes the gradient first): no sharing. The context outlives the
  // graph, whose buffers it allocated.
  std::unique_ptr<Context> context = test::MakeContext(Device::Cpu());
  ASSERT_NE(context, nullptr);
  Graph g(DType::kF32);
  const Value ids = g.Input("ids", {kRows}, DType::kI32, kVocab);
  const Value targets = g.Input("targets", {kRows}, DType::kI32, kVocab);
  const Value table = g.Parameter("table", {kVocab, kWidth}, true);
  const Value out = g.Parameter("out", {kVocab, kWidth}, true);
  const Value logits =
      g.Linear(g.Embedding(ids, table, std::nullopt, kRows), out, std::nullopt);
  g.CrossEntropy(g.Add(logits, logits), targets, CrossEntropyOptions{});
  g.CrossEntropy(logits, targets, CrossEntropyOptions{});
  ASSERT_OK(g.Compile(*context));
  EXPECT_NE(g.info(logits).grad_offset, g.info(logits).data_offset);
}

TEST(GraphResidualTest, RejectsAResidualOfAnotherShape) {
  Graph g(DType::kF32);
  const Value ids = g.Input("ids", {kRows}, DType::kI32, kVocab);
  const Value table = g.Parameter("table", {kVocab, kWidth}, true);
  const Value w = g.Parameter("w", {kHidden, kWidth}, true);
  const Value h = g.Embedding(ids, table, std::nullopt, kRows);
  const Value y =
      g.Linear(h, w, std::nullopt, h);  // [rows, hidden] + [rows, C]
  EXPECT_FALSE(y.valid());
  std::unique_ptr<Context> context = test::MakeContext(Device::Cpu());
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(g.Compile(*context).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace graph
}  // namespace lossrt
