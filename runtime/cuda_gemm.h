// GEMMs through cuBLASLt with cached plans: GemmCall describes one
// column-major D = alpha op(A) op(B) + beta C (+ bias), C being D itself
// unless the call names another matrix, GemmRunner keeps the
// descriptors and the chosen algorithm per distinct call shape and scalars, so
// a call like one seen before costs one cublasLtMatmul. Internal to the
// libraries: include only from code built with the CUDA toolkit. A Context owns
// one runner for its stream (ContextGemmRunner in runtime/cuda_context.h); ops
// that split work across streams make their own.
#ifndef LOSSRT_RUNTIME_CUDA_GEMM_H_
#define LOSSRT_RUNTIME_CUDA_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/dtype.h"

namespace lossrt {

// CUDA_R_16BF, CUDA_R_16F or CUDA_R_32F for the floating dtypes (f32 for the
// others).
cudaDataType CudaType(DType dtype);

// The largest power of two (<= 256) dividing the address: what cuBLASLt may
// assume.
int64_t AlignmentOf(const void* pointer);

// A column-major operand as cuBLASLt stores it (before `op`).
struct GemmOperand {
  const void* data = nullptr;
  cudaDataType type = CUDA_R_32F;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  cublasOperation_t op = CUBLAS_OP_N;
};

// A GELU (tanh approximation) in the epilogue. kGeluAux: D = gelu(AB (+ bias))
// with the GELU's input written to `aux`; kDGelu: D = AB * gelu'(aux), the
// gradient through a GELU whose input `aux` the forward saved.
enum class GemmEpilogue { kNone, kGeluAux, kDGelu };

// D[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C (+ bias[m] broadcast
// over columns), where C is `c` when set (D's type and layout: a residual
// added in the epilogue) and D itself otherwise.
struct GemmCall {
  GemmOperand a;
  GemmOperand b;
  void* d = nullptr;
  cudaDataType d_type = CUDA_R_32F;
  int64_t m = 0;
  int64_t n = 0;
  int64_t ld_d = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* c = nullptr;     // [m, n], ld_d; nullptr: D
  const void* bias = nullptr;  // [m], D's type
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  // [m, n] in D's type, leading dimension ld_aux (a multiple of 8): written
  // by kGeluAux, read by kDGelu.
  void* aux = nullptr;
  int64_t ld_aux = 0;
};

// The algorithms that timing chose, per call shape, exact alpha and beta,
// compute type and workspace size: shared by the runners of one context, so
// that a shape is timed once per context. Not thread-safe (nor are the
// runners).
//
// Why: cuBLASLt's first heuristic choice is not always its fastest
// candidate (e.g. the linear cross-entropy's d_weight GEMM, accumulating over
// token chunks, runs markedly faster with a later candidate on the H200).
//
// Bits: a tuned call must write what the heuristic's first choice writes,
// so that results never depend on whether or when a shape was tuned (a
// context's first calls, calls inside a CUDA graph capture and contexts with
// tuning off run that first choice). A candidate is kept only where it wrote
// the first choice's bits on the tuning call, for the exact (alpha, beta)
// that the choice then serves: for a beta = 0 call with C = D, both
// D = alpha AB and the in-place accumulation D = alpha AB + D of the same
// alpha (what the callers chain after it); for any other repeatable call,
// that call's own scalars. Equal bits on one call's data stand for equal
// arithmetic only where the data round somewhere in every summation order:
// an all-zero product tunes nothing (the shape stays untuned), and
// matrix-vector products (m or n = 1), whose short or narrow sums are often
// exact in any order, are never tuned.
class GemmTuning {
 public:
  using Key = std::array<int64_t, 28>;
  // Off: runners take the heuristic's first choice for shapes they have not
  // seen (what they chose before stays).
  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }
  const cublasLtMatmulAlgo_t* Find(const Key& key) const;
  // Keeps the first choice made for a key.
  void Add(const Key& key, const cublasLtMatmulAlgo_t& algo);
  int64_t size() const { return static_cast<int64_t>(chosen_.size()); }

 private:
  bool enabled_ = true;
  std::vector<std::pair<Key, cublasLtMatmulAlgo_t>> chosen_;
};

// How many of the heuristic's candidates a tuned shape times (and how many
// every shape asks the heuristic for, tuned or not: the first choice is the
// answer to the same question either way).
inline constexpr int kGemmTuningCandidates = 8;

// Whether the environment variable LOSSRT_INITCHECK_GEMM_OUTPUTS is "1": runs
// under `compute-sanitizer --tool initcheck` (tools/run_gpu_tests.sh sets it),
// where the outputs of the vendor libraries' Hopper kernels, whose TMA stores
// the tool does not see, are zeroed before those kernels run (GemmRunner
// below, the cuDNN attention in graph/ops/attention_cudnn.cc). Read by each
// caller once, when it is made.
bool InitcheckZeroingRequested();

// cuBLASLt descriptors and the chosen algorithm, cached per call shape
// (types, sizes, leading dimensions, transposes, alignments, bias, epilogue)
// and the exact bits of alpha and beta.
class GemmRunner {
 public:
  // `tuning` (may be null: the heuristic's first choice, untimed) must outlive
  // the runner. Tuning needs at least 8 bytes of workspace.
  //
  // With the environment variable LOSSRT_INITCHECK_GEMM_OUTPUTS=1
  // (InitcheckZeroingRequested, read once, here) every call that does not read
  // its output (beta = 0, or C a buffer apart from D) zeroes D (and a GELU
  // epilogue's aux output) on the stream first. That is for runs under
  // `compute-sanitizer --tool initcheck` only (tools/ run_gpu_tests.sh sets
  // it): the tool does not see the stores of cuBLASLt's Hopper kernels (TMA),
  // so every later read of a GEMM's output would be reported as uninitialized;
  // the zeroed bytes are then overwritten by the GEMM, and reads beyond its
  // output are still caught.
  GemmRunner(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes,
             cublasComputeType_t compute_type, GemmTuning* tuning = nullptr);
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Unimplemented (cached, so asking again is cheap) when cuBLASLt has no
  // algorithm for the call: callers with another way can fall back to it.
  // The first call of a shape (and scalars) may synchronize the stream
  // (tuning), never inside a CUDA graph capture.
  absl::Status Run(const GemmCall& call, cudaStream_t stream);

  // How many candidates the heuristic offered for `call`'s shape and scalars
  // (those a tuning times); 0 before a call of it ran, where tuning was off
  // when it first ran, and for matrix-vector shapes. For tests.
  int64_t CandidatesOf(const GemmCall& call) const;

 private:
  using Key = std::array<int64_t, 25>;
  struct Entry {
    Key key;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr;
    cublasLtMatrixLayout_t b = nullptr;
    cublasLtMatrixLayout_t d = nullptr;
    cublasLtMatmulAlgo_t algo;  // the heuristic's first choice until tuned
    std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, in order
    bool found = false;  // the heuristic gave an algorithm
    bool tuned = false;  // `algo` is final
    // Tunings whose data could not tell the candidates apart (an all-zero
    // product).
    int uninformative_tunings = 0;
    ~Entry();
  };
  static Key KeyOf(const GemmCall& call);
  GemmTuning::Key TuningKeyOf(const Entry& entry) const;
  absl::StatusOr<Entry*> Find(const GemmCall& call);
  absl::Status ZeroOutputsFirst(const GemmCall& call, cudaStream_t stream);
  absl::Status Launch(const Entry& entry, const cublasLtMatmulAlgo_t& algo,
                      const GemmCall& call, cudaStream_t stream);
  // Times the candidates on the call itself (it must be safe to repeat) and
  // keeps the fastest whose output matches the first candidate's (the
  // heuristic's first choice) bit for bit, at the call's alpha and beta and,
  // for a beta = 0 call with C = D, also after two in-place accumulations
  // D = alpha AB + D; leaves the call's result in D.
  absl::Status Tune(Entry& entry, const GemmCall& call, cudaStream_t stream);

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  cublasComputeType_t compute_type_;
  GemmTuning* tuning_;
  bool zero_outputs_first_;  // InitcheckZeroingRequested()
  std::vector<std::unique_ptr<Entry>> cache_;
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_CUDA_GEMM_H_
