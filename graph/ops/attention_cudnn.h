// The cuDNN backend of the causal attention op (graph/ops/attention.h,
// AttentionKernel::kCudnn): cuDNN's fused scaled-dot-product attention through
// the cuDNN frontend's graphs. Internal to graph/ops. The interface holds no
// CUDA or cuDNN types, so that attention_cudnn.cc is the only file that
// includes the frontend (whose headers are slow to compile).
//
// Device tensors in the op's layout (b batch, C = heads * head_dim), bf16 but
// for lse:
//   qkv [b * seq, 3C], each row [q | k | v], each [heads, head_dim];
//   out, d_out [b * seq, C] (rows [heads, head_dim]); lse [b, heads, seq] f32;
//   d_qkv like qkv.
// cuDNN reads and writes them in place as strided [b, heads, seq, head_dim]
// views. lse is cuDNN's softmax Stats: the natural-log log-sum-exp of each
// query's scaled, causally masked scores, as the other kernels save it, so a
// forward and a backward of different kernels combine.
//
// The context's cuDNN handle and each shape's graphs (built on the shape's
// first call, kept for the later ones) live in a ContextResource of the
// context. A shape seen before a CUDA graph capture runs inside it with no
// allocation; a shape first seen inside one is built with the thread's capture
// mode relaxed (cuDNN allocates and compiles as it builds). Callers check the
// arguments and make the context's device current.
#ifndef LOSSRT_GRAPH_OPS_ATTENTION_CUDNN_H_
#define LOSSRT_GRAPH_OPS_ATTENTION_CUDNN_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/context.h"

namespace lossrt {
namespace ops {
namespace attention_cudnn {

// OK where this build has the backend: cuDNN and its frontend were found at
// build time (third_party/repositories.bzl). Otherwise Unimplemented, saying
// so, which every call below then returns too.
absl::Status CheckBuiltWithCudnn();

// One attention problem: bf16, head_dim % 8 == 0 and <= 128 (the op checks).
struct Shape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  // The backward's algorithm: cuDNN's deterministic one, or its atomic dQ
  // (CausalAttentionOptions::deterministic).
  bool deterministic = true;
};

// Bytes of device workspace (256-byte aligned) that Forward / Backward take for
// `shape`. Builds the shape's graph on the context when it has none yet.
absl::StatusOr<int64_t> ForwardWorkspaceBytes(Context& context,
                                              const Shape& shape);
absl::StatusOr<int64_t> BackwardWorkspaceBytes(Context& context,
                                               const Shape& shape);

// out and lse from qkv on the context's stream.
absl::Status Forward(Context& context, const Shape& shape, const void* qkv,
                     void* out, float* lse, void* workspace);

// d_qkv (written, never added to) from qkv, out, lse and d_out on the
// context's stream. With shape.deterministic (cuDNN's deterministic
// algorithm) the same inputs give the same bits on every run.
absl::Status Backward(Context& context, const Shape& shape, const void* qkv,
                      const void* out, const float* lse, const void* d_out,
                      void* d_qkv, void* workspace);

}  // namespace attention_cudnn
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ATTENTION_CUDNN_H_
