// The dtype rules shared by the graph's ops.
#include "graph/ops/op_checks.h"

#include "runtime/status.h"

namespace lossrt {
namespace ops {

absl::Status CheckActivationDType(const Context& context, DType dtype,
                                  absl::string_view name) {
  const bool cpu = context.device().is_cpu();
  const bool ok = cpu ? (dtype == DType::kF32 || dtype == DType::kF64)
                      : (dtype == DType::kF32 || dtype == DType::kBF16);
  if (ok) return absl::OkStatus();
  return InvalidArgument(
      name, ": dtype ", DTypeName(dtype), " is not an activation dtype on ",
      context.device().ToString(), cpu ? " (f32, f64)" : " (f32, bf16)");
}

}  // namespace ops
}  // namespace lossrt
