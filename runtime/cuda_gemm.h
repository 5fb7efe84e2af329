// GEMMs through cuBLASLt with cached plans: GemmCall describes one
// column-major D = alpha op(A) op(B) + beta C (+ bias), C being D itself
// unless the call names another matrix, GemmRunner keeps the
// descriptors and the heuristic's algorithm per distinct call shape, so a shape
// seen before costs one cublasLtMatmul. Internal to the libraries: include only
// from code built with the CUDA toolkit. A Context owns one runner for its
// stream (ContextGemmRunner in runtime/cuda_context.h); ops that split work
// across streams make their own.
#ifndef LOSSRT_RUNTIME_CUDA_GEMM_H_
#define LOSSRT_RUNTIME_CUDA_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
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

// cuBLASLt descriptors and the heuristic's algorithm, cached per call shape
// (types, sizes, leading dimensions, transposes, alignments, bias, beta != 0).
class GemmRunner {
 public:
  GemmRunner(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes,
             cublasComputeType_t compute_type)
      : handle_(handle),
        workspace_(workspace),
        workspace_bytes_(workspace_bytes),
        compute_type_(compute_type) {}
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Unimplemented (cached, so asking again is cheap) when cuBLASLt has no
  // algorithm for the call: callers with another way can fall back to it.
  absl::Status Run(const GemmCall& call, cudaStream_t stream);

 private:
  using Key = std::array<int64_t, 24>;
  struct Entry {
    Key key;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr;
    cublasLtMatrixLayout_t b = nullptr;
    cublasLtMatrixLayout_t d = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool found = false;  // the heuristic gave an algorithm
    ~Entry();
  };
  static Key KeyOf(const GemmCall& call);
  absl::StatusOr<Entry*> Find(const GemmCall& call);

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  cublasComputeType_t compute_type_;
  std::vector<std::unique_ptr<Entry>> cache_;
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_CUDA_GEMM_H_
