// Linear layer: y = x w^T + b, the PyTorch nn.Linear convention, through
// cuBLASLt on a GPU (the bias added in the GEMM's epilogue, plans cached in the
// context; the GELU MLP's first GEMM also through cuDNN) and Eigen on the CPU.
//
//   // x [rows, in], weight [out, in], bias [out], y [rows, out]
//   RETURN_IF_ERROR(lossrt::ops::LinearForward(context, x, weight, &bias, y));
//   RETURN_IF_ERROR(lossrt::ops::LinearBackward(context, x, weight, dy, &dx,
//                                               /*accumulate_dx=*/false,
//                                               d_weight, &d_bias));
//
// Dtypes follow graph/ops/op_checks.h: x, weight, bias, y, dy and dx share the
// activation dtype; d_weight and d_bias are in the accumulator dtype and are
// accumulated (+=). On a GPU the products accumulate in fp32.
#ifndef LOSSRT_GRAPH_OPS_LINEAR_H_
#define LOSSRT_GRAPH_OPS_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace ops {

// y [rows, out] = x [rows, in] @ weight [out, in]^T (+ bias [out]).
absl::Status LinearForward(Context& context, const Tensor& x,
                           const Tensor& weight, const Tensor* bias,
                           const Tensor& y);

// y [rows, out] = x [rows, in] @ weight [out, in]^T (+ bias [out]) +
// residual [rows, out]: a residual connection, added on a GPU by the GEMM's
// epilogue (cuBLASLt's C operand) rather than by a pass of its own. y may be
// residual itself (in place) but must not overlap it otherwise, nor x,
// weight or bias. The residual's gradient is y's, unchanged.
absl::Status LinearResidualForward(Context& context, const Tensor& x,
                                   const Tensor& weight, const Tensor* bias,
                                   const Tensor& residual, const Tensor& y);

// dx [rows, in] = (or +=) dy @ weight (skipped when dx is null);
// d_weight [out, in] += dy^T @ x; d_bias [out] += column sums of dy.
absl::Status LinearBackward(Context& context, const Tensor& x,
                            const Tensor& weight, const Tensor& dy,
                            const Tensor* dx, bool accumulate_dx,
                            const Tensor& d_weight, const Tensor* d_bias);

// The GELU MLP's two GEMMs with the GELU (tanh approximation, as in
// graph/ops/activation.h) fused into them: on a GPU, the forward as one cuDNN
// graph (bf16) or with cuBLASLt's GELU_AUX epilogue, the backward with
// cuBLASLt's DGELU epilogue (the ops composed where neither library has an
// algorithm, and on the CPU).
//
// Which library runs the forward's fused GEMM on a GPU. kAuto: cuDNN's graph
// where it has a plan without workspace for the shape (bf16, built with
// cuDNN), else cuBLASLt's epilogue, else the ops composed. kCudnn: cuDNN or
// Unimplemented (nothing written). kCublasLt: never cuDNN. The CPU ignores it.
// Each engine gives the same bits on every run; the engines differ from each
// other by rounding.
enum class GeluGemmEngine { kAuto, kCublasLt, kCudnn };

// OK where this build has `engine` (kCudnn: cuDNN and its frontend were found
// at build time); otherwise Unimplemented, saying why.
absl::Status GeluGemmEngineBuilt(GeluGemmEngine engine);

// h [rows, out] = x [rows, in] @ weight [out, in]^T (+ bias [out]), the GELU's
// input, saved for the backward, and a [rows, out] = gelu(h). a and h must not
// overlap each other or the inputs.
absl::Status LinearGeluForward(Context& context, const Tensor& x,
                               const Tensor& weight, const Tensor* bias,
                               const Tensor& a, const Tensor& h,
                               GeluGemmEngine engine = GeluGemmEngine::kAuto);

// The gradient of h through a = gelu(h) and the linear layer y = a weight^T
// that follows: d_h [rows, in] = (dy [rows, out] @ weight [out, in]) *
// gelu'(h [rows, in]), written (not added). d_h must not overlap the inputs.
absl::Status LinearGeluBackwardInput(Context& context, const Tensor& weight,
                                     const Tensor& dy, const Tensor& h,
                                     const Tensor& d_h);

// Scratch LinearBackward takes from context.Workspace (the bias gradient's
// partial sums on a GPU).
int64_t LinearBackwardWorkspaceBytes(const Device& device, int64_t rows,
                                     int64_t out_features);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_LINEAR_H_
