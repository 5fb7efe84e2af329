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
//   - kCudnn (bf16 only, 16-byte aligned tensors, lse included, seq >= 2):
//     cuDNN's fused attention (cuDNN frontend SDPA graphs; deterministic
//     backward), reading and writing the op's tensors in place; its workspace
//     is cuDNN's (the deterministic backward keeps dP for the causal square)
//     plus, for the accumulating backward, a [rows, 3C] bf16 gradient. The
//     context keeps the cuDNN handle and each shape's graphs, built on the
//     shape's first call (a shape seen before a CUDA graph capture runs inside
//     one without allocating). Its lse is the same log-sum-exp as the other
//     kernels': a forward and a backward of different kernels combine.
//     Unimplemented in builds without cuDNN and its frontend headers (see
//     third_party/repositories.bzl).
//   - kAuto (default): kCudnn where it applies (built with cuDNN, lse 16-byte
//     aligned, seq >= 2), else kFlash where it applies, else kCublas.
//
//   RETURN_IF_ERROR(context.ReserveWorkspace(CausalAttentionWorkspaceBytes(
//       context.device(), DType::kBF16, batch, seq, heads, head_dim)));
//   RETURN_IF_ERROR(CausalAttentionForward(context, qkv, batch, seq, heads,
//                                          out, lse));
#ifndef LOSSRT_GRAPH_OPS_ATTENTION_H_
#define LOSSRT_GRAPH_OPS_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace ops {

enum class AttentionKernel { kAuto, kCublas, kFlash, kCudnn };

// "auto", "cublas", "flash", "cudnn" (flags and tables).
const char* AttentionKernelName(AttentionKernel kernel);
// The kernel of that name (AttentionKernelName's inverse); InvalidArgument
// listing the names for any other text.
absl::StatusOr<AttentionKernel> ParseAttentionKernel(absl::string_view name);

// OK where this build has `kernel`: the GPU kernels need CUDA, kCudnn also
// cuDNN 9 and the cuDNN frontend headers at build time (kAuto is always there:
// it picks among the others). Otherwise Unimplemented, saying what was missing.
absl::Status AttentionKernelBuilt(AttentionKernel kernel);

struct CausalAttentionOptions {
  // Which GPU implementation runs (ignored on the CPU). kFlash or kCudnn where
  // it does not apply (f32, misaligned tensors) is an InvalidArgument.
  AttentionKernel kernel = AttentionKernel::kAuto;
  // Workspace budget of the cuBLAS path's score chunks (bytes; >= 1).
  int64_t cublas_chunk_bytes = int64_t{1} << 30;
  // kCudnn's backward: true asks cuDNN for its deterministic algorithm (dQ's
  // partial sums added in a fixed order, through a dP buffer of the causal
  // square: the same bits on every run); false lets cuDNN add them with
  // atomics (no dP buffer and no separate dQ pass, so a smaller workspace;
  // bits that vary run to run; PyTorch's default). The cuBLAS and flash
  // kernels are deterministic either way.
  bool deterministic = true;
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
// nonsensical arguments. For kCudnn, whose workspace only cuDNN can tell, the
// Device overloads give an estimate that covers cuDNN 9 on sm_90 (checked by
// the GPU tests); the Context overload below gives the exact figure.
int64_t CausalAttentionWorkspaceBytes(const Device& device, DType dtype,
                                      int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim);
int64_t CausalAttentionWorkspaceBytes(const Device& device, DType dtype,
                                      int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim,
                                      const CausalAttentionOptions& options);
// The same, exact for kCudnn (and for kAuto should it pick kCudnn): builds the
// shape's cuDNN graphs on `context`, as the shape's first call would (the calls
// then reuse them), and asks cuDNN for their workspace. Errors are those of
// building the graphs (cuDNN not built in: Unimplemented).
absl::StatusOr<int64_t> CausalAttentionWorkspaceBytes(
    Context& context, DType dtype, int64_t batch, int64_t seq, int64_t heads,
    int64_t head_dim,
    const CausalAttentionOptions& options = CausalAttentionOptions());

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ATTENTION_H_
