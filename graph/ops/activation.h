// Activation functions of the MLP blocks, forward and backward: GELU (the tanh
// approximation, GPT-2's) and SwiGLU (LLaMA's gated SiLU). CPU (f32, f64) and
// CUDA (f32, bf16; fp32 arithmetic inside, vectorized 16-byte accesses).
//
//   // h, a, da, dh: [rows, F]
//   RETURN_IF_ERROR(lossrt::ops::GeluForward(*context, h, a));
//   RETURN_IF_ERROR(lossrt::ops::GeluBackward(*context, h, da, dh,
//                                             /*accumulate=*/false));
//
// Tensors share one activation dtype (f32/f64 on the CPU, f32/bf16 on a GPU)
// and the context's device. Every call checks all of its arguments before it
// writes anything. Results are bitwise reproducible.
#ifndef LOSSRT_GRAPH_OPS_ACTIVATION_H_
#define LOSSRT_GRAPH_OPS_ACTIVATION_H_

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace ops {

// GELU, tanh approximation (GPT-2's):
//   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// x and y have one shape (any rank, usually [rows, C]); y may be x (in place),
// any other overlap is an error.
absl::Status GeluForward(Context& context, const Tensor& x, const Tensor& y);

// dx = dy * gelu'(x) (accumulate false) or dx += dy * gelu'(x) (true). x, dy,
// dx have one shape; dx may be x or dy itself, any other overlap is an error.
absl::Status GeluBackward(Context& context, const Tensor& x, const Tensor& dy,
                          const Tensor& dx, bool accumulate);

// SwiGLU: x [rows, 2F] = [gate | up] (each row: F gate values, then F up
// values); y [rows, F] = silu(gate) * up with silu(g) = g / (1 + exp(-g)).
// y must not overlap x.
absl::Status SwiGluForward(Context& context, const Tensor& x, const Tensor& y);

// dx [rows, 2F] = [dy * up * silu'(gate) | dy * silu(gate)] from x [rows, 2F]
// and dy [rows, F], overwritten (accumulate false) or added to (true). dx may
// be x itself (each element pair is read before it is written); it must not
// overlap dy, nor x otherwise.
absl::Status SwiGluBackward(Context& context, const Tensor& x, const Tensor& dy,
                            const Tensor& dx, bool accumulate);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ACTIVATION_H_
