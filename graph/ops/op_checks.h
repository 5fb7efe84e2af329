// The dtype rules shared by the graph's ops (graph/ops/*.h); the tensor checks
// they run are runtime/tensor_checks.h's. Internal to //graph/ops.
//
// The dtype rules of every op:
//   - activations (and the compute copies of parameters that ops read) are f32
//     or f64 on the CPU, f32 or bf16 on a GPU;
//   - gradients of parameters, and saved statistics (norm means, attention
//     log-sum-exps), are f64 when the activations are f64, f32 otherwise;
//   - gradients of activations have the activations' dtype.
#ifndef LOSSRT_GRAPH_OPS_OP_CHECKS_H_
#define LOSSRT_GRAPH_OPS_OP_CHECKS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/context.h"
#include "runtime/dtype.h"
#include "runtime/tensor_checks.h"

namespace lossrt {
namespace ops {

// f64 for f64 activations, f32 otherwise (see above).
inline DType AccumulatorDType(DType activation) {
  return activation == DType::kF64 ? DType::kF64 : DType::kF32;
}

// OK when `dtype` is an activation dtype of the context's device.
absl::Status CheckActivationDType(const Context& context, DType dtype,
                                  absl::string_view name);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_OP_CHECKS_H_
