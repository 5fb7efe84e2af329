// CUDA launchers of the LayerNorm/RMSNorm kernels (graph/ops/norm_cuda.cu).
// Internal to //graph/ops:norm. Activations x, y, dx, dy [rows, cols] and
// gamma, beta [cols] are f32 (bf16 false) or bf16 (bf16 true) device memory;
// statistics and parameter gradients are f32. rows * cols <= 2^31 - 1
// (checked by the caller). Each launcher queues its kernels on `stream` and
// returns the first launch error.
#ifndef LOSSRT_GRAPH_OPS_NORM_CUDA_H_
#define LOSSRT_GRAPH_OPS_NORM_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace lossrt {
namespace ops {
namespace cuda {

struct NormForwardArgs {
  const void* x = nullptr;      // [rows, cols]
  const void* gamma = nullptr;  // [cols]
  const void* beta = nullptr;   // [cols] or null
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 0.0f;
  bool rms = false;  // RMSNorm (no mean, no beta) instead of LayerNorm
  bool bf16 = false;
  void* y = nullptr;      // [rows, cols]
  float* mean = nullptr;  // [rows] (LayerNorm only)
  float* rstd = nullptr;  // [rows]
};

struct NormBackwardArgs {
  const void* x = nullptr;      // [rows, cols]
  const void* gamma = nullptr;  // [cols]
  const float* mean = nullptr;  // [rows] (LayerNorm only)
  const float* rstd = nullptr;  // [rows]
  const void* dy = nullptr;     // [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
  bool rms = false;
  bool bf16 = false;
  void* dx = nullptr;  // [rows, cols]
  bool accumulate_dx = false;
  float* d_gamma = nullptr;  // [cols], +=
  float* d_beta = nullptr;   // [cols], += (LayerNorm, optional)
  // Blocks of the first stage (from NormBackwardBlocks): each writes one
  // partial row of d_gamma to `partials` [blocks, cols], and of d_beta to the
  // [blocks, cols] after it.
  int blocks = 1;
  float* partials = nullptr;
};

cudaError_t LaunchNormForward(const NormForwardArgs& args, cudaStream_t stream);

// The backward's first-stage grid for `args` (shapes, flags and pointers set;
// blocks and partials not needed) on the current device with `num_sms` SMs:
// one full wave at the chosen kernel's occupancy, at most `max_blocks`, at
// least 1. At most 16 * num_sms (the occupancy of 128-thread blocks is <= 16).
cudaError_t NormBackwardBlocks(const NormBackwardArgs& args, int num_sms,
                               int max_blocks, int* blocks);
cudaError_t LaunchNormBackward(const NormBackwardArgs& args,
                               cudaStream_t stream);

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_NORM_CUDA_H_
