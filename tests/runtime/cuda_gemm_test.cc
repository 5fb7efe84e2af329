// Tests of runtime/cuda_gemm.h's tuning: a tuned GEMM writes bitwise what the
// heuristic's first choice writes, a shape is timed once per table, an
// accumulating (beta = 1, in place) call is never timed on the caller's data
// but takes the choice a beta = 0 call of its shape made, and a disabled table
// times nothing; the context's runners, second stream and events for ops are
// made once. GPU only: skipped (saying so) elsewhere.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/random.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"

#ifdef LOSSRT_WITH_CUDA
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#endif

namespace lossrt {
namespace {

#ifdef LOSSRT_WITH_CUDA

// D[m, n] (fp32, column-major) = A(op N, [m, k]) @ B(op T of [n, k]), bf16
// operands from fresh seeds.
struct Problem {
  std::unique_ptr<Context> context;
  OwnedTensor a, b, d;
  int64_t m = 0, n = 0, k = 0;
};

Problem MakeProblem() {
  Problem p;
  absl::StatusOr<std::unique_ptr<Context>> context =
      Context::Create(Device::Cuda(0));
  EXPECT_TRUE(context.ok()) << context.status();
  p.context = *std::move(context);
  std::mt19937_64 rng(test::TestSeed());
  // Sizes with several cuBLASLt candidates, not multiples of the tiles.
  p.m = std::uniform_int_distribution<int64_t>(200, 500)(rng) * 8;
  p.n = std::uniform_int_distribution<int64_t>(100, 300)(rng) * 8;
  p.k = std::uniform_int_distribution<int64_t>(40, 90)(rng) * 8;
  Allocator& allocator = p.context->allocator();
  p.a = *EmptyTensor(allocator, DType::kBF16, {p.k, p.m});
  p.b = *EmptyTensor(allocator, DType::kBF16, {p.k, p.n});
  p.d = *EmptyTensor(allocator, DType::kF32, {p.n, p.m});
  EXPECT_TRUE(FillNormal(p.a.view, rng(), 0.0f, 1.0f, *p.context).ok());
  EXPECT_TRUE(FillNormal(p.b.view, rng(), 0.0f, 1.0f, *p.context).ok());
  EXPECT_TRUE(FillNormal(p.d.view, rng(), 0.0f, 1.0f, *p.context).ok());
  return p;
}

GemmCall CallOf(const Problem& p, float beta) {
  GemmCall call;
  call.a = {p.a.view.data, CUDA_R_16BF, p.m, p.k, p.m, CUBLAS_OP_N};
  call.b = {p.b.view.data, CUDA_R_16BF, p.n, p.k, p.n, CUBLAS_OP_T};
  call.d = p.d.view.data;
  call.d_type = CUDA_R_32F;
  call.m = p.m;
  call.n = p.n;
  call.ld_d = p.m;
  call.beta = beta;
  return call;
}

std::vector<uint32_t> Bits(Problem& p) {
  std::vector<float> host(p.d.view.numel());
  const Tensor view =
      Tensor::Of(host.data(), DType::kF32, p.d.view.shape, Device::Cpu());
  EXPECT_TRUE(CopyTensor(p.d.view, view, *p.context).ok());
  std::vector<uint32_t> bits(host.size());
  std::memcpy(bits.data(), host.data(), 4 * host.size());
  return bits;
}

// How many elements differ in their bits.
int64_t Mismatches(const std::vector<uint32_t>& x,
                   const std::vector<uint32_t>& y) {
  if (x.size() != y.size()) return -1;
  int64_t count = 0;
  for (size_t i = 0; i < x.size(); ++i) count += x[i] != y[i];
  return count;
}

// Runs `calls` (beta values) in order with a runner on `tuning` (null: the
// heuristic's first choice) from the same starting D; returns D's bits.
std::vector<uint32_t> RunCalls(Problem& p, const std::vector<uint32_t>& start,
                               GemmTuning* tuning,
                               const std::vector<float>& betas) {
  std::vector<float> host(start.size());
  std::memcpy(host.data(), start.data(), 4 * start.size());
  const Tensor view =
      Tensor::Of(host.data(), DType::kF32, p.d.view.shape, Device::Cpu());
  EXPECT_TRUE(CopyTensor(view, p.d.view, *p.context).ok());
  GemmRunner runner(
      *CublasLtHandleOf(*p.context), *p.context->cublaslt_workspace(),
      Context::kCublasLtWorkspaceBytes, CUBLAS_COMPUTE_32F, tuning);
  const cudaStream_t stream = *CudaStreamOf(*p.context);
  for (float beta : betas) {
    const absl::Status status = runner.Run(CallOf(p, beta), stream);
    EXPECT_TRUE(status.ok()) << status;
  }
  return Bits(p);
}

TEST(GemmTuningTest, TunedWritesTheHeuristicsBits) {
  SKIP_WITHOUT_GPU();
  Problem p = MakeProblem();
  const std::vector<uint32_t> start = Bits(p);
  const std::vector<uint32_t> heuristic = RunCalls(p, start, nullptr, {0.0f});
  GemmTuning tuning;
  EXPECT_EQ(Mismatches(RunCalls(p, start, &tuning, {0.0f}), heuristic), 0);
  EXPECT_EQ(tuning.size(), 1);
  // A second runner on the table reuses the choice (nothing new is timed).
  EXPECT_EQ(Mismatches(RunCalls(p, start, &tuning, {0.0f, 0.0f}), heuristic),
            0);
  EXPECT_EQ(tuning.size(), 1);
  // The output is not all the same value (the comparison could not fail).
  EXPECT_NE(heuristic[0], heuristic[heuristic.size() / 2]);
}

TEST(GemmTuningTest, AccumulatingCallsAreNeverTimedOnTheirOutput) {
  SKIP_WITHOUT_GPU();
  Problem p = MakeProblem();
  const std::vector<uint32_t> start = Bits(p);
  // D = AB + D, then D = AB, then D = AB + D: the first accumulation must not
  // be repeated by tuning (it would add AB more than once).
  const std::vector<float> betas = {1.0f, 0.0f, 1.0f};
  const std::vector<uint32_t> heuristic = RunCalls(p, start, nullptr, betas);
  GemmTuning tuning;
  EXPECT_EQ(Mismatches(RunCalls(p, start, &tuning, {1.0f}),
                       RunCalls(p, start, nullptr, {1.0f})),
            0);
  EXPECT_EQ(tuning.size(), 0);  // only an untimed heuristic choice
  EXPECT_EQ(Mismatches(RunCalls(p, start, &tuning, betas), heuristic), 0);
  EXPECT_EQ(tuning.size(), 1);  // the beta = 0 call timed the shape for both
}

TEST(GemmTuningTest, DisabledTableTimesNothing) {
  SKIP_WITHOUT_GPU();
  Problem p = MakeProblem();
  ASSERT_TRUE(p.context->set_gemm_tuning(false).ok());
  GemmTuning* tuning = *ContextGemmTuning(*p.context);
  const std::vector<uint32_t> start = Bits(p);
  EXPECT_EQ(Mismatches(RunCalls(p, start, tuning, {0.0f}),
                       RunCalls(p, start, nullptr, {0.0f})),
            0);
  EXPECT_EQ(tuning->size(), 0);
  ASSERT_TRUE(p.context->set_gemm_tuning(true).ok());
  RunCalls(p, start, tuning, {0.0f});
  EXPECT_EQ(tuning->size(), 1);
}

// The context's per-call resources for ops (cuda_context.h): a runner per
// compute type and workspace share, one second stream, a pool of events; each
// made once and handed out again.
TEST(ContextResourcesTest, RunnersStreamAndEventsAreMadeOnce) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Context> context = *Context::Create(Device::Cuda(0));
  absl::StatusOr<GemmRunner*> a =
      ContextGemmRunnerFor(*context, CUBLAS_COMPUTE_32F, 1 << 20);
  absl::StatusOr<GemmRunner*> again =
      ContextGemmRunnerFor(*context, CUBLAS_COMPUTE_32F, 1 << 20);
  absl::StatusOr<GemmRunner*> other_share =
      ContextGemmRunnerFor(*context, CUBLAS_COMPUTE_32F, 1 << 21);
  absl::StatusOr<GemmRunner*> other_type =
      ContextGemmRunnerFor(*context, CUBLAS_COMPUTE_32F_FAST_TF32, 1 << 20);
  ASSERT_TRUE(a.ok() && again.ok() && other_share.ok() && other_type.ok());
  EXPECT_EQ(*a, *again);
  EXPECT_NE(*a, *other_share);
  EXPECT_NE(*a, *other_type);
  EXPECT_EQ(ContextGemmRunnerFor(*context, CUBLAS_COMPUTE_32F,
                                 Context::kCublasLtWorkspaceBytes + 1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  absl::StatusOr<cudaStream_t> side = ContextSideStream(*context);
  absl::StatusOr<cudaStream_t> side_again = ContextSideStream(*context);
  absl::StatusOr<cudaStream_t> main = CudaStreamOf(*context);
  ASSERT_TRUE(side.ok() && side_again.ok() && main.ok());
  EXPECT_NE(*side, nullptr);
  EXPECT_EQ(*side, *side_again);
  EXPECT_NE(*side, *main);

  absl::StatusOr<const cudaEvent_t*> two = ContextEvents(*context, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  const cudaEvent_t first = (*two)[0];
  const cudaEvent_t second = (*two)[1];
  absl::StatusOr<const cudaEvent_t*> five = ContextEvents(*context, 5);
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ((*five)[0], first);  // the pool grows; its first events stay
  EXPECT_EQ((*five)[1], second);
  EXPECT_NE((*five)[4], nullptr);
  EXPECT_NE((*five)[4], first);
  // The events order the two streams.
  EXPECT_EQ(cudaEventRecord((*five)[4], *side), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(*main, (*five)[4], 0), cudaSuccess);
  EXPECT_TRUE(context->Synchronize().ok());
  EXPECT_EQ(ContextEvents(*context, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ContextEvents(*context, 65).status().code(),
            absl::StatusCode::kInvalidArgument);
}

#else

TEST(GemmTuningTest, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA: the GEMM tuning tests need a GPU";
}

#endif  // LOSSRT_WITH_CUDA

}  // namespace
}  // namespace lossrt
