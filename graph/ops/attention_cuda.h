// CUDA launchers of the causal attention op (graph/ops/attention.h): the
// softmax kernels of the cuBLAS path (graph/ops/attention_cuda.cu) and the
// fused flash-attention kernels (graph/ops/attention_flash.cu). Internal.
//
// Pointers are device memory; `bf16` picks __nv_bfloat16 over float for the
// activation-typed arguments. Statistics (lse, delta, scores) are float.
// Layouts (b batch, t query, s key, h head, D head_dim, C = heads * D):
//   qkv [b * seq, 3C], out / d_out [b * seq, C], lse / delta [b, heads, seq].
#ifndef LOSSRT_GRAPH_OPS_ATTENTION_CUDA_H_
#define LOSSRT_GRAPH_OPS_ATTENTION_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace lossrt {
namespace ops {
namespace attention {

// The largest head dim the GPU kernels take (they need head_dim % 8 == 0).
inline constexpr int64_t kMaxGpuHeadDim = 128;

// delta[b, h, t] = sum_d d_out[b * seq + t, h * D + d] * out[...] (float).
cudaError_t LaunchDelta(const void* out, const void* d_out, bool bf16,
                        int64_t batch, int64_t seq, int64_t heads,
                        int64_t head_dim, float* delta, cudaStream_t stream);

// cuBLAS path, forward. scores [groups, seq, ld] (float, already scaled) of
// `groups` consecutive (batch, head) pairs: writes probs [groups, seq, ld]
// (activation dtype; exactly 0 above the diagonal) and lse [groups, seq].
// Columns >= seq of a row are neither read nor written.
cudaError_t LaunchCausalSoftmax(const float* scores, int64_t ld, void* probs,
                                bool bf16, float* lse, int64_t groups,
                                int64_t seq, cudaStream_t stream);

// cuBLAS path, backward. From scores and dprobs = d_out V^T (float, [groups,
// seq, ld]) with lse and delta [groups, seq]: probs = exp(scores - lse) masked
// causally and dscores = probs * (dprobs - delta), both [groups, seq, ld] in
// the activation dtype.
cudaError_t LaunchSoftmaxBackward(const float* scores, const float* dprobs,
                                  int64_t ld, const float* lse,
                                  const float* delta, void* probs,
                                  void* dscores, bool bf16, int64_t groups,
                                  int64_t seq, cudaStream_t stream);

// Flash kernels: bf16 only, head_dim % 8 == 0 and <= kMaxGpuHeadDim, every
// pointer 16-byte aligned. batch * heads * ceil(seq / 64) must fit an int.
struct FlashArgs {
  const void* qkv = nullptr;     // [batch * seq, 3C] bf16
  void* out = nullptr;           // [batch * seq, C] bf16 (forward output)
  const void* d_out = nullptr;   // [batch * seq, C] bf16 (backward)
  void* d_qkv = nullptr;         // [batch * seq, 3C] bf16 (backward output)
  float* lse = nullptr;          // [batch, heads, seq]: forward out, bwd in
  const float* delta = nullptr;  // [batch, heads, seq] (backward)
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  bool accumulate = false;  // backward: add to d_qkv instead of writing
  // Backward: FlashBackwardScratchBytes of device memory, 256-byte aligned
  // (the kernels zero what they need).
  void* scratch = nullptr;
};

// Scratch the backward needs: for head dims up to 64, when it comes to at most
// 256 MiB, dS in bf16 (a 64 x 64 tile per block pair of the causal triangle of
// every (batch, head)), so that dQ need not recompute it; 0 otherwise.
int64_t FlashBackwardScratchBytes(int64_t batch, int64_t seq, int64_t heads,
                                  int64_t head_dim);

// out and lse from qkv.
cudaError_t LaunchFlashForward(const FlashArgs& args, cudaStream_t stream);
// d_qkv (written or added to) from qkv, d_out, lse and delta (LaunchDelta).
cudaError_t LaunchFlashBackward(const FlashArgs& args, cudaStream_t stream);

}  // namespace attention
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ATTENTION_CUDA_H_
