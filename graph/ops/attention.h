// Causal multi-head self-attention (GPT-2's, nanoGPT layout): forward and
// backward on the CPU (Eigen, float and double) and on CUDA (f32 and bf16).
//
// qkv [rows, 3C], rows = batch * seq, C = heads * head_dim, each row laid out
// as [q | k | v], each [heads, head_dim] (nanoGPT's c_attn order). Query t of
// a sequence attends to keys 0..t with scale 1/sqrt(head_dim):
//   out[b, t, h] = sum_{s <= t} softmax_s(q_t . k_s / sqrt(head_dim)) v_s.
// The forward also saves lse [batch, heads, seq] (the accumulator dtype: f64
// for f64 activations, f32 otherwise): the log-sum-exp of each query's scaled,
// masked scores, from which the backward recomputes the probabilities.
//
// Head dims: any >= 1 on the CPU; on a GPU head_dim % 8 == 0 and <= 128.
//
// GPU kernels (CausalAttentionOptions::kernel):
//   - kFlash (bf16 only, 16-byte aligned tensors): fused flash-attention
//     kernels (mma.sync, online softmax), no [seq, seq] matrix in memory; the
//     backward takes batch * heads * seq floats of workspace.
//   - kCublas (f32 and bf16): the reference path. cuBLAS strided-batched GEMMs
//     for the scores and products plus softmax kernels, over chunks of
//     (batch, head) pairs whose [seq, seq] score matrices fit
//     `cublas_chunk_bytes` of workspace (at least one pair per chunk).
//   - kAuto (default): kFlash where it applies, else kCublas.
//
//   RETURN_IF_ERROR(context.ReserveWorkspace(CausalAttentionWorkspaceBytes(
//       context.device(), DType::kBF16, batch, seq, heads, head_dim)));
//   RETURN_IF_ERROR(CausalAttentionForward(context, qkv, batch, seq, heads,
//                                          out, lse));
#ifndef LOSSRT_GRAPH_OPS_ATTENTION_H_
#define LOSSRT_GRAPH_OPS_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace ops {

enum class AttentionKernel { kAuto, kCublas, kFlash };

struct CausalAttentionOptions {
  // Which GPU implementation runs (ignored on the CPU). kFlash where it does
  // not apply (f32, misaligned tensors) is an InvalidArgument.
  AttentionKernel kernel = AttentionKernel::kAuto;
  // Workspace budget of the cuBLAS path's score chunks (bytes; >= 1).
  int64_t cublas_chunk_bytes = int64_t{1} << 30;
};

// qkv [rows, 3C] with rows = batch * seq and C = heads * head_dim, laid out per
// row as [q | k | v], each [heads, head_dim] (nanoGPT's c_attn order). out
// [rows, C] (per row [heads, head_dim]). lse [batch, heads, seq] (accumulator
// dtype): log-sum-exp of each query's scaled, causally masked scores, saved by
// the forward for the backward. Scale 1/sqrt(head_dim). Query t attends to keys
// 0..t.
absl::Status CausalAttentionForward(Context& context, const Tensor& qkv,
                                    int64_t batch, int64_t seq, int64_t heads,
                                    const Tensor& out, const Tensor& lse);
absl::Status CausalAttentionForward(Context& context, const Tensor& qkv,
                                    int64_t batch, int64_t seq, int64_t heads,
                                    const Tensor& out, const Tensor& lse,
                                    const CausalAttentionOptions& options);

// d_qkv [rows, 3C] (activation dtype): written (accumulate false) or added to
// (true). out and lse are the forward's outputs for this qkv; d_out [rows, C].
absl::Status CausalAttentionBackward(Context& context, const Tensor& qkv,
                                     const Tensor& out, const Tensor& lse,
                                     const Tensor& d_out, int64_t batch,
                                     int64_t seq, int64_t heads,
                                     const Tensor& d_qkv, bool accumulate);
absl::Status CausalAttentionBackward(Context& context, const Tensor& qkv,
                                     const Tensor& out, const Tensor& lse,
                                     const Tensor& d_out, int64_t batch,
                                     int64_t seq, int64_t heads,
                                     const Tensor& d_qkv, bool accumulate,
                                     const CausalAttentionOptions& options);

// Scratch bytes the forward and backward take from context.Workspace (the
// larger of the two), so the caller can reserve it before the hot path. For
// kAuto it assumes 16-byte aligned tensors (as the Allocator gives). 0 for
// nonsensical arguments.
int64_t CausalAttentionWorkspaceBytes(const Device& device, DType dtype,
                                      int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim);
int64_t CausalAttentionWorkspaceBytes(const Device& device, DType dtype,
                                      int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim,
                                      const CausalAttentionOptions& options);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ATTENTION_H_
