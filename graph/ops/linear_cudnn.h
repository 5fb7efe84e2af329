// The cuDNN backend of the GELU MLP's first GEMM (graph/ops/linear.h,
// LinearGeluForward with GeluGemmEngine::kCudnn or kAuto): one cuDNN frontend
// graph, matmul + bias + GELU (tanh) with the pre-activation saved, in place of
// cuBLASLt's GELU_AUX epilogue. Internal to graph/ops. The interface holds no
// CUDA or cuDNN types, so that linear.cc does not include the frontend.
//
// Device tensors, bf16, row-major and dense: x [rows, in], weight [out, in]
// (nn.Linear's layout), bias [out] or none, h and a [rows, out].
//
// Plans: each shape's graph is built on its first call with every plan that
// cuDNN's heuristics offer and that needs no workspace (so a call never
// allocates). Until a shape is tuned, calls run the first such plan. The
// first call outside a CUDA graph capture, where the context's GEMM tuning is
// on (runtime/cuda_gemm.h), times every plan on the call itself and keeps the
// fastest whose h and a are bitwise those of the first plan (the same
// checksum as the GEMM tuning), so that results never depend on whether or
// when a shape was tuned. Built graphs and the choice live in a
// ContextResource; a shape first seen inside a capture is built with the
// thread's capture mode relaxed (cuDNN allocates as it builds). Callers check
// the arguments and make the context's device current.
#ifndef LOSSRT_GRAPH_OPS_LINEAR_CUDNN_H_
#define LOSSRT_GRAPH_OPS_LINEAR_CUDNN_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/context.h"

namespace lossrt {
namespace ops {
namespace linear_cudnn {

// OK where this build has the backend (cuDNN and its frontend were found at
// build time); otherwise Unimplemented, saying so, as every call below.
absl::Status CheckBuiltWithCudnn();

struct GeluForwardShape {
  int64_t rows = 0;
  int64_t in = 0;
  int64_t out = 0;
  bool bias = false;
};

// h = x weight^T (+ bias), fp32 accumulation, rounded to bf16 and saved; a =
// gelu_tanh(h) from the fp32 value; on the context's stream. Unimplemented
// where cuDNN has no plan without workspace for the shape (the caller falls
// back to cuBLASLt).
absl::Status GeluForward(Context& context, const GeluForwardShape& shape,
                         const void* x, const void* weight, const void* bias,
                         void* a, void* h);

}  // namespace linear_cudnn
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_LINEAR_CUDNN_H_
