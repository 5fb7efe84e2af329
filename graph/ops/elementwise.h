// Element-wise ops of the graph: y = a + b (the residual stream), copying or
// accumulating one tensor into another across dtypes (gradients into their
// accumulators), and zero fills. CPU (f32, f64) and CUDA (f32, bf16).
//
//   RETURN_IF_ERROR(lossrt::ops::Add(*context, residual, branch, residual));
//   RETURN_IF_ERROR(lossrt::ops::AccumulateInto(*context, grad_bf16, grad_f32,
//                                               /*accumulate=*/true));
//
// Every call checks all of its arguments before it writes anything; an error
// leaves the outputs as they were. Results are bitwise reproducible.
#ifndef LOSSRT_GRAPH_OPS_ELEMENTWISE_H_
#define LOSSRT_GRAPH_OPS_ELEMENTWISE_H_

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace ops {

// y = a + b, element by element, computed in f32 (f64 for f64 tensors) and
// rounded once. a, b and y have one shape (any rank) and one activation dtype
// (f32/f64 on the CPU, f32/bf16 on a GPU). y may be a or b itself (in place);
// any other overlap is an error.
absl::Status Add(Context& context, const Tensor& a, const Tensor& b,
                 const Tensor& y);

// dst = src (accumulate false) or dst += src (accumulate true). src and dst
// hold the same number of elements (shapes may differ) of f32, bf16 or f64,
// not necessarily the same: the sum is formed in f64 when either is f64, else
// in f32, and rounded once to dst's dtype (f64 -> bf16 rounds through f32).
// dst may be src itself (same data and dtype); any other overlap is an error.
absl::Status AccumulateInto(Context& context, const Tensor& src,
                            const Tensor& dst, bool accumulate);

// Every element of dst (any dtype) set to zero (all bits 0).
absl::Status Zero(Context& context, const Tensor& dst);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ELEMENTWISE_H_
