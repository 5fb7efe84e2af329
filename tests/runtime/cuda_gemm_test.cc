// Tests of runtime/cuda_gemm.h's tuning: a tuned GEMM writes bitwise what the
// heuristic's first choice writes, a shape is timed once per table, an
// accumulating (beta = 1, in place) call is never timed on the caller's data
// but takes the choice a beta = 0 call of its shape and alpha made (checked
// for that accumulation), an all-zero product tunes nothing, a matrix-vector
// product is never tuned, and a disabled table times nothing. Chunked
// accumulations like the linear cross-entropy's d_weight (a first beta = 0
// chunk or not, eager or captured in a CUDA graph) write the same bits on a
// fresh context, a tuned one and one with tuning off, and match a double
// reference. The context's runners, second stream and events for ops are made
// once. GPU only: skipped (saying so) elsewhere.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/dtype.h"
#include "runtime/random.h"
#include "runtime/status.h"
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
  EXPECT_EQ(tuning.size(), 2);  // the call and its in-place accumulation
  // A second runner on the table reuses the choice (nothing new is timed).
  EXPECT_EQ(Mismatches(RunCalls(p, start, &tuning, {0.0f, 0.0f}), heuristic),
            0);
  EXPECT_EQ(tuning.size(), 2);
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
  // The beta = 0 call chose for itself and for the in-place accumulation.
  EXPECT_EQ(tuning.size(), 2);
}

// Zero operands give a zero product whatever the algorithm: such a call
// chooses nothing (the shape stays untuned, the runner's next call tries
// again), and only a runner's third such call keeps the heuristic's first
// choice.
TEST(GemmTuningTest, AllZeroProductsChooseNothing) {
  SKIP_WITHOUT_GPU();
  Problem p = MakeProblem();
  const cudaStream_t stream = *CudaStreamOf(*p.context);
  auto zero_operands = [&] {
    ASSERT_EQ(cudaMemsetAsync(p.a.view.data, 0, p.k * p.m * 2, stream),
              cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(p.b.view.data, 0, p.k * p.n * 2, stream),
              cudaSuccess);
  };
  zero_operands();
  const std::vector<uint32_t> start = Bits(p);
  GemmTuning tuning;
  const std::vector<uint32_t> zeros = RunCalls(p, start, &tuning, {0.0f});
  EXPECT_EQ(tuning.size(), 0);
  for (size_t i = 0; i < zeros.size(); ++i) {
    ASSERT_EQ(zeros[i], 0u) << "element " << i;
  }
  RunCalls(p, start, &tuning, {0.0f, 0.0f});
  EXPECT_EQ(tuning.size(), 0);
  // Real operands: the shape is tuned now.
  std::mt19937_64 rng(test::TestSeed());
  ASSERT_TRUE(FillNormal(p.a.view, rng(), 0.0f, 1.0f, *p.context).ok());
  ASSERT_TRUE(FillNormal(p.b.view, rng(), 0.0f, 1.0f, *p.context).ok());
  const std::vector<uint32_t> heuristic = RunCalls(p, start, nullptr, {0.0f});
  EXPECT_EQ(Mismatches(RunCalls(p, start, &tuning, {0.0f}), heuristic), 0);
  EXPECT_EQ(tuning.size(), 2);

  zero_operands();
  GemmTuning patient;
  RunCalls(p, start, &patient, {0.0f, 0.0f, 0.0f});
  EXPECT_EQ(patient.size(), 2);  // the heuristic's first choice, kept
}

// LOSSRT_INITCHECK_GEMM_OUTPUTS=1 (for compute-sanitizer's initcheck) zeroes
// the output of each call that does not read it: the same bits as without,
// and an accumulating call (beta = 1) still adds to what D held.
TEST(GemmTuningTest, InitcheckZeroingKeepsTheBits) {
  SKIP_WITHOUT_GPU();
  Problem p = MakeProblem();
  const std::vector<uint32_t> start = Bits(p);
  const std::vector<float> betas = {1.0f, 0.0f, 1.0f};
  const std::vector<uint32_t> accumulate = RunCalls(p, start, nullptr, {1.0f});
  const std::vector<uint32_t> chained = RunCalls(p, start, nullptr, betas);
  ASSERT_EQ(setenv("LOSSRT_INITCHECK_GEMM_OUTPUTS", "1", 1), 0);
  const std::vector<uint32_t> zeroed_accumulate =
      RunCalls(p, start, nullptr, {1.0f});
  const std::vector<uint32_t> zeroed_chained =
      RunCalls(p, start, nullptr, betas);
  GemmTuning tuning;
  const std::vector<uint32_t> zeroed_tuned = RunCalls(p, start, &tuning, betas);
  ASSERT_EQ(unsetenv("LOSSRT_INITCHECK_GEMM_OUTPUTS"), 0);
  EXPECT_EQ(Mismatches(zeroed_accumulate, accumulate), 0);
  EXPECT_EQ(Mismatches(zeroed_chained, chained), 0);
  EXPECT_EQ(Mismatches(zeroed_tuned, chained), 0);
  // D = AB + D differs from D = AB + (AB + D) (the comparison could fail).
  EXPECT_GT(Mismatches(accumulate, chained), 0);
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
  EXPECT_EQ(tuning->size(), 2);  // the call and its in-place accumulation
}

// ---------------------------------------------------------------------------
// Chunked accumulation, as the linear cross-entropy's d_weight over token
// chunks: call j computes D[m, n] = alpha * A_j @ B_j + beta_j * D in place,
// A_j op N of [m, k] and B_j op T of [n, k] in bf16, D fp32.

struct ChunkShape {
  std::string name;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
};

// Host images: per chunk A_j (column-major [m, k]) and B_j ([n, k]) as bf16
// bits, and the starting D ([m, n], column-major).
struct ChunkData {
  std::vector<std::vector<uint16_t>> a;
  std::vector<std::vector<uint16_t>> b;
  std::vector<float> start;
};

ChunkData MakeChunkData(const ChunkShape& s, int chunks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  ChunkData data;
  for (int j = 0; j < chunks; ++j) {
    data.a.emplace_back(s.m * s.k);
    data.b.emplace_back(s.n * s.k);
    for (uint16_t& x : data.a.back()) x = FloatToBf16Bits(normal(rng));
    for (uint16_t& x : data.b.back()) x = FloatToBf16Bits(normal(rng));
  }
  data.start.resize(s.m * s.n);
  for (float& x : data.start) x = 10.0f * normal(rng);
  return data;
}

GemmCall ChunkCall(const ChunkShape& s, const void* a, const void* b, void* d,
                   float beta) {
  GemmCall call;
  call.a = {a, CUDA_R_16BF, s.m, s.k, s.m, CUBLAS_OP_N};
  // One column (a matrix-vector product) as the linear cross-entropy's d_bias
  // passes its vector of ones: op N of [k, 1].
  call.b = s.n == 1 ? GemmOperand{b, CUDA_R_16BF, s.k, 1, s.k, CUBLAS_OP_N}
                    : GemmOperand{b, CUDA_R_16BF, s.n, s.k, s.n, CUBLAS_OP_T};
  call.d = d;
  call.d_type = CUDA_R_32F;
  call.m = s.m;
  call.n = s.n;
  call.ld_d = s.m;
  call.alpha = s.alpha;
  call.beta = beta;
  return call;
}

// The chunks and D on a context's device.
struct DeviceChunks {
  std::vector<OwnedTensor> a;
  std::vector<OwnedTensor> b;
  OwnedTensor d;
};

absl::StatusOr<DeviceChunks> Upload(Context& context, const ChunkShape& s,
                                    const ChunkData& data) {
  DeviceChunks chunks;
  auto upload_bf16 = [&](const std::vector<uint16_t>& host,
                         int64_t rows) -> absl::StatusOr<OwnedTensor> {
    ASSIGN_OR_RETURN(
        OwnedTensor tensor,
        EmptyTensor(context.allocator(), DType::kBF16, {s.k, rows}));
    RETURN_IF_ERROR(
        CopyTensor(Tensor::Of(const_cast<uint16_t*>(host.data()), DType::kBF16,
                              {s.k, rows}, Device::Cpu()),
                   tensor.view, context));
    return tensor;
  };
  for (size_t j = 0; j < data.a.size(); ++j) {
    ASSIGN_OR_RETURN(OwnedTensor a, upload_bf16(data.a[j], s.m));
    ASSIGN_OR_RETURN(OwnedTensor b, upload_bf16(data.b[j], s.n));
    chunks.a.push_back(std::move(a));
    chunks.b.push_back(std::move(b));
  }
  ASSIGN_OR_RETURN(chunks.d,
                   EmptyTensor(context.allocator(), DType::kF32, {s.n, s.m}));
  RETURN_IF_ERROR(CopyTensor(Tensor::Of(const_cast<float*>(data.start.data()),
                                        DType::kF32, {s.n, s.m}, Device::Cpu()),
                             chunks.d.view, context));
  RETURN_IF_ERROR(context.Synchronize());
  return chunks;
}

absl::StatusOr<std::vector<uint32_t>> DownloadBits(Context& context,
                                                   const OwnedTensor& d) {
  std::vector<uint32_t> bits(d.view.numel());
  RETURN_IF_ERROR(CopyTensor(
      d.view, Tensor::Of(bits.data(), DType::kF32, d.view.shape, Device::Cpu()),
      context));
  RETURN_IF_ERROR(context.Synchronize());
  return bits;
}

// What one sequence of calls left: D's bits after each call, and how many
// candidates the heuristic offered for the first call's shape.
struct Trace {
  std::vector<std::vector<uint32_t>> bits;
  int64_t candidates = 0;
};

// Runs call j (chunk j, betas[j]) through the context's runner, eagerly.
absl::StatusOr<Trace> RunChunks(Context& context, const ChunkShape& s,
                                const ChunkData& data,
                                const std::vector<float>& betas) {
  ASSIGN_OR_RETURN(DeviceChunks chunks, Upload(context, s, data));
  ASSIGN_OR_RETURN(GemmRunner * runner, ContextGemmRunner(context));
  ASSIGN_OR_RETURN(const cudaStream_t stream, CudaStreamOf(context));
  Trace trace;
  for (size_t j = 0; j < betas.size(); ++j) {
    const GemmCall call =
        ChunkCall(s, chunks.a[j].view.data, chunks.b[j].view.data,
                  chunks.d.view.data, betas[j]);
    RETURN_IF_ERROR(runner->Run(call, stream));
    ASSIGN_OR_RETURN(std::vector<uint32_t> bits,
                     DownloadBits(context, chunks.d));
    trace.bits.push_back(std::move(bits));
    if (j == 0) trace.candidates = runner->CandidatesOf(call);
  }
  return trace;
}

// The same calls captured in a CUDA graph on the context's stream, then the
// graph launched `replays` times, each from the starting D; D's bits after
// each launch.
absl::StatusOr<std::vector<std::vector<uint32_t>>> CaptureChunks(
    Context& context, const ChunkShape& s, const ChunkData& data,
    const std::vector<float>& betas, int replays) {
  ASSIGN_OR_RETURN(DeviceChunks chunks, Upload(context, s, data));
  ASSIGN_OR_RETURN(GemmRunner * runner, ContextGemmRunner(context));
  ASSIGN_OR_RETURN(const cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  absl::Status captured = absl::OkStatus();
  for (size_t j = 0; j < betas.size() && captured.ok(); ++j) {
    captured =
        runner->Run(ChunkCall(s, chunks.a[j].view.data, chunks.b[j].view.data,
                              chunks.d.view.data, betas[j]),
                    stream);
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  std::unique_ptr<CUgraph_st, cudaError_t (*)(cudaGraph_t)> graph_guard(
      graph, cudaGraphDestroy);
  RETURN_IF_ERROR(captured);
  CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  std::unique_ptr<CUgraphExec_st, cudaError_t (*)(cudaGraphExec_t)> exec_guard(
      exec, cudaGraphExecDestroy);
  std::vector<std::vector<uint32_t>> bits;
  for (int replay = 0; replay < replays; ++replay) {
    RETURN_IF_ERROR(
        CopyTensor(Tensor::Of(const_cast<float*>(data.start.data()),
                              DType::kF32, {s.n, s.m}, Device::Cpu()),
                   chunks.d.view, context));
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    ASSIGN_OR_RETURN(std::vector<uint32_t> replayed,
                     DownloadBits(context, chunks.d));
    bits.push_back(std::move(replayed));
  }
  return bits;
}

// Checks every element of `trace` (after each call) against the calls in
// double: |D - ref| <= 1e-5 * (|alpha| sum |a b| + |beta| * the previous
// bound). fp32 accumulation of K terms errs by at most about K * 2^-24 of
// sum |a b| and in practice by far less (blocked sums); a lost or repeated
// chunk errs by about sqrt(K) times a typical |a b|, far beyond.
void ExpectMatchesReference(const ChunkShape& s, const ChunkData& data,
                            const std::vector<float>& betas,
                            const Trace& trace) {
  std::vector<double> want(data.start.begin(), data.start.end());
  std::vector<double> bound(want.size());
  for (size_t i = 0; i < want.size(); ++i) bound[i] = std::fabs(want[i]);
  std::vector<double> product(want.size()), magnitude(want.size());
  for (size_t j = 0; j < betas.size(); ++j) {
    std::fill(product.begin(), product.end(), 0.0);
    std::fill(magnitude.begin(), magnitude.end(), 0.0);
    for (int64_t kk = 0; kk < s.k; ++kk) {
      const uint16_t* a = data.a[j].data() + kk * s.m;
      const uint16_t* b = data.b[j].data() + kk * s.n;
      for (int64_t col = 0; col < s.n; ++col) {
        const double bv = Bf16BitsToFloat(b[col]);
        double* p = product.data() + col * s.m;
        double* q = magnitude.data() + col * s.m;
        for (int64_t row = 0; row < s.m; ++row) {
          const double term = Bf16BitsToFloat(a[row]) * bv;
          p[row] += term;
          q[row] += std::fabs(term);
        }
      }
    }
    int64_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = s.alpha * product[i] + betas[j] * want[i];
      bound[i] =
          std::fabs(s.alpha) * magnitude[i] + std::fabs(betas[j]) * bound[i];
      float got = 0;
      std::memcpy(&got, &trace.bits[j][i], 4);
      const double error = std::fabs(got - want[i]);
      worst = std::max(worst, error / bound[i]);
      bad += !(error <= 1e-5 * bound[i]);
    }
    EXPECT_EQ(bad, 0) << "call " << j << " (beta " << betas[j]
                      << "): elements off the double reference; worst error "
                      << worst << " of the bound's scale";
  }
}

void ExpectSameTraces(const std::vector<std::vector<uint32_t>>& got,
                      const std::vector<std::vector<uint32_t>>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t j = 0; j < got.size(); ++j) {
    EXPECT_EQ(Mismatches(got[j], want[j]), 0)
        << what << ": elements whose bits differ after call " << j;
  }
}

class ChunkedAccumulationTest : public testing::TestWithParam<ChunkShape> {
 protected:
  // Runs `betas` on a fresh context (tuning on: its first beta = 0 call tunes
  // the shape), again on that context (tuned), and on a fresh context with
  // tuning off (the heuristic's first choice throughout): the same bits after
  // every call, and the values of the double reference.
  void ExpectBitsIndependentOfTuning(const std::vector<float>& betas) {
    const ChunkShape& s = GetParam();
    const ChunkData data =
        MakeChunkData(s, static_cast<int>(betas.size()), test::TestSeed());
    std::unique_ptr<Context> fresh = *Context::Create(Device::Cuda(0));
    const absl::StatusOr<Trace> first = RunChunks(*fresh, s, data, betas);
    ASSERT_TRUE(first.ok()) << first.status();
    std::printf("%s: %lld candidates for %lld x %lld x %lld\n", s.name.c_str(),
                static_cast<long long>(first->candidates),
                static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k));
    // Else there would be nothing to choose and the test could not fail.
    EXPECT_GE(first->candidates, 2);
    // The beta = 0 call chose for itself and for the accumulation.
    EXPECT_EQ((*ContextGemmTuning(*fresh))->size(), 2);
    const absl::StatusOr<Trace> tuned = RunChunks(*fresh, s, data, betas);
    ASSERT_TRUE(tuned.ok()) << tuned.status();
    ExpectSameTraces(tuned->bits, first->bits, "tuned context");

    std::unique_ptr<Context> untuned = *Context::Create(Device::Cuda(0));
    ASSERT_TRUE(untuned->set_gemm_tuning(false).ok());
    const absl::StatusOr<Trace> heuristic = RunChunks(*untuned, s, data, betas);
    ASSERT_TRUE(heuristic.ok()) << heuristic.status();
    ExpectSameTraces(heuristic->bits, first->bits, "tuning off");
    EXPECT_EQ((*ContextGemmTuning(*untuned))->size(), 0);

    ExpectMatchesReference(s, data, betas, *first);
  }
};

TEST_P(ChunkedAccumulationTest, FirstChunkBetaZero) {
  SKIP_WITHOUT_GPU();
  ExpectBitsIndependentOfTuning({0.0f, 1.0f, 1.0f, 1.0f});
}

// The accumulations before any beta = 0 call run untuned (the heuristic's
// first choice), those after it with the tuned choice.
TEST_P(ChunkedAccumulationTest, AccumulationBeforeTheFirstBetaZeroCall) {
  SKIP_WITHOUT_GPU();
  ExpectBitsIndependentOfTuning({1.0f, 1.0f, 0.0f, 1.0f});
}

// Captured on a fresh context, the calls run untuned (nothing waits for the
// stream inside a capture); eager calls then tune the shape; the graph
// replayed before and after that writes what the eager calls write.
TEST_P(ChunkedAccumulationTest, CapturedCallsWriteTheTunedBits) {
  SKIP_WITHOUT_GPU();
  const ChunkShape& s = GetParam();
  const std::vector<float> betas = {0.0f, 1.0f, 1.0f, 1.0f};
  const ChunkData data = MakeChunkData(s, 4, test::TestSeed());
  std::unique_ptr<Context> context = *Context::Create(Device::Cuda(0));
  ASSERT_TRUE(context->stream().ok());
  const absl::StatusOr<std::vector<std::vector<uint32_t>>> captured =
      CaptureChunks(*context, s, data, betas, 1);
  ASSERT_TRUE(captured.ok()) << captured.status();
  EXPECT_EQ((*ContextGemmTuning(*context))->size(), 0);
  const absl::StatusOr<Trace> eager = RunChunks(*context, s, data, betas);
  ASSERT_TRUE(eager.ok()) << eager.status();
  EXPECT_EQ((*ContextGemmTuning(*context))->size(), 2);
  ExpectSameTraces(*captured, {eager->bits.back()}, "captured, untuned");
  // Captured again, now with the tuned choices, and replayed twice.
  const absl::StatusOr<std::vector<std::vector<uint32_t>>> tuned =
      CaptureChunks(*context, s, data, betas, 2);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  ExpectSameTraces(*tuned, {eager->bits.back(), eager->bits.back()},
                   "captured, tuned");
  ExpectMatchesReference(s, data, betas, *eager);
}

// A matrix-vector product (d_bias's shape: a vocabulary slice summed over a
// short token chunk) is never tuned: no candidates are kept, nothing enters
// the table, and the bits are the heuristic's first choice's.
TEST(ChunkedMatrixVectorTest, IsNeverTuned) {
  SKIP_WITHOUT_GPU();
  const ChunkShape s{"d_bias", 1536, 1, 52, 1.0f};
  const std::vector<float> betas = {0.0f, 1.0f, 1.0f};
  const ChunkData data = MakeChunkData(s, 3, test::TestSeed());
  std::unique_ptr<Context> context = *Context::Create(Device::Cuda(0));
  const absl::StatusOr<Trace> tuned = RunChunks(*context, s, data, betas);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_EQ(tuned->candidates, 0);
  EXPECT_EQ((*ContextGemmTuning(*context))->size(), 0);
  std::unique_ptr<Context> untuned = *Context::Create(Device::Cuda(0));
  ASSERT_TRUE(untuned->set_gemm_tuning(false).ok());
  const absl::StatusOr<Trace> heuristic = RunChunks(*untuned, s, data, betas);
  ASSERT_TRUE(heuristic.ok()) << heuristic.status();
  ExpectSameTraces(heuristic->bits, tuned->bits, "tuning off");
  ExpectMatchesReference(s, data, betas, *tuned);
}

// Shapes with several candidates: k large against m and n, at alpha 1 and at
// an alpha that is not a power of two; a skinny one for which, on the H200
// with cuBLAS 13, a candidate writes other bits than the heuristic's first
// choice (tuning must pass it over); and a d_weight-like slice (H x a
// vocabulary slice over a token chunk) at an alpha like the f16 gradient
// scale's inverse.
INSTANTIATE_TEST_SUITE_P(
    Shapes, ChunkedAccumulationTest,
    testing::Values(ChunkShape{"k_heavy", 128, 192, 4096, 1.0f},
                    ChunkShape{"k_heavy_alpha", 128, 192, 4096, 0.3f},
                    ChunkShape{"skinny", 32, 1024, 8192, 1.0f},
                    ChunkShape{"d_weight_slice", 512, 1000, 256, 0.5f}),
    [](const testing::TestParamInfo<ChunkShape>& info) {
      return info.param.name;
    });

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
