// CUDA launchers of the AdamW step (graph/optim/adamw_cuda.cu): the two-stage
// deterministic gradient norm and the fused update. Internal to
// //graph/optim:adamw, which checks every argument before calling them.
#ifndef LOSSRT_GRAPH_OPTIM_ADAMW_CUDA_H_
#define LOSSRT_GRAPH_OPTIM_ADAMW_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/dtype.h"

namespace lossrt {
namespace optim {

// norm[0] = sqrt(sum of grads[i]^2) as f32. Stage one: `num_partials` blocks
// (a grid fixed by the caller from n alone) each sum a grid-stride share of the
// squares in double into partials[block]; stage two: one block sums the
// partials in a fixed tree order. Bitwise reproducible. n == 0 (num_partials 0)
// writes 0. `partials` holds num_partials doubles of device memory.
cudaError_t LaunchGradNorm(const float* grads, int64_t n, double* partials,
                           int num_partials, float* norm, cudaStream_t stream);

// The same first and second stages, writing the sum of the squares in double
// to sum_squares[0] (device memory) instead of its square root.
cudaError_t LaunchGradSumOfSquares(const float* grads, int64_t n,
                                   double* partials, int num_partials,
                                   double* sum_squares, cudaStream_t stream);

// norm[0] = sqrt(sum_squares[0]) as f32 (one thread).
cudaError_t LaunchNormFromSumOfSquares(const double* sum_squares, float* norm,
                                       cudaStream_t stream);

// Arguments of the fused update; the constants are computed on the host in
// double and rounded to float once (the CPU backend uses the same values).
struct AdamWKernelArgs {
  float* params = nullptr;         // [n]
  const float* grads = nullptr;    // [n]
  float* m = nullptr;              // [n]
  float* v = nullptr;              // [n]
  void* compute_copy = nullptr;    // [n] of copy_dtype, or null for none
  DType copy_dtype = DType::kF32;  // f32 or bf16
  const float* norm = nullptr;     // [1] device memory, from LaunchGradNorm
  int64_t n = 0;
  int64_t decay_count = 0;     // params [0, decay_count) are decayed
  float max_grad_norm = 0.0f;  // <= 0: no clipping
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float one_minus_beta1 = 0.0f;
  float one_minus_beta2 = 0.0f;
  float step_size = 0.0f;       // lr / (1 - beta1^t)
  float inv_sqrt_bias2 = 0.0f;  // 1 / sqrt(1 - beta2^t)
  float eps = 0.0f;
  float decay_factor = 1.0f;  // 1 - lr * weight_decay
};

// One pass over the n elements: clip scale from *norm, moments, decay, update,
// compute copy. 16-byte vector accesses when every pointer allows them.
cudaError_t LaunchAdamW(const AdamWKernelArgs& args, cudaStream_t stream);

}  // namespace optim
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPTIM_ADAMW_CUDA_H_
