// Argument checks and dtype rules shared by the graph's ops (graph/ops/*.h).
//
// The dtype rules of every op:
//   - activations (and the compute copies of parameters that ops read) are f32
//     or f64 on the CPU, f32 or bf16 on a GPU;
//   - gradients of parameters, and saved statistics (norm means, attention
//     log-sum-exps), are f64 when the activations are f64, f32 otherwise;
//   - gradients of activations have the activations' dtype.
#ifndef LOSSRT_GRAPH_OPS_OP_CHECKS_H_
#define LOSSRT_GRAPH_OPS_OP_CHECKS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/context.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace ops {

// Elements a tensor of an op may hold: kernels index with 32-bit integers.
inline constexpr int64_t kMaxElements = (int64_t{1} << 31) - 1;

// f64 for f64 activations, f32 otherwise (see above).
inline DType AccumulatorDType(DType activation) {
  return activation == DType::kF64 ? DType::kF64 : DType::kF32;
}

// OK when `dtype` is an activation dtype of the context's device.
absl::Status CheckActivationDType(const Context& context, DType dtype,
                                  absl::string_view name);

// OK when `tensor` is on the context's device, contiguous, has the `expected`
// shape (-1 matches any size) and one of the `allowed` dtypes, holds at most
// kMaxElements elements and has data (unless it is empty); otherwise an
// InvalidArgument naming `name`.
absl::Status CheckTensor(const Context& context, const Tensor& tensor,
                         std::initializer_list<int64_t> expected,
                         std::initializer_list<DType> allowed,
                         absl::string_view name);

// OK when `tensor`, of any shape, is on the context's device, contiguous, with
// no negative dimension, at most kMaxElements elements and data (unless it is
// empty); otherwise an InvalidArgument naming `name`.
absl::Status CheckPlacement(const Context& context, const Tensor& tensor,
                            absl::string_view name);

// CheckPlacement, and the shape and dtype of `like` (named `like_name` in the
// message).
absl::Status CheckLike(const Context& context, const Tensor& tensor,
                       const Tensor& like, absl::string_view name,
                       absl::string_view like_name);

// A tensor and the name an error message gives it; a null tensor is absent.
struct Named {
  const Tensor* tensor;
  const char* name;
};

// InvalidArgument ("<out> overlaps <other>") when `out` overlaps any of
// `others`.
absl::Status CheckDisjoint(const Named& out,
                           std::initializer_list<Named> others);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_OP_CHECKS_H_
