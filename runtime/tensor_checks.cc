// Argument checks for functions that take tensor views on a context.
#include "runtime/tensor_checks.h"

#include "absl/types/span.h"
#include "runtime/status.h"

namespace lossrt {

absl::Status CheckPlacement(const Context& context, const Tensor& tensor,
                            absl::string_view name) {
  if (tensor.device != context.device()) {
    return InvalidArgument(name, " is on ", tensor.device.ToString(),
                           ", the context on ", context.device().ToString());
  }
  for (int64_t d : tensor.shape) {
    if (d < 0) return InvalidArgument(name, " has a negative dimension");
  }
  if (!tensor.is_contiguous()) {
    return InvalidArgument(name, " must be contiguous: ", tensor.ShapeString());
  }
  if (tensor.numel() > kMaxKernelElements) {
    return InvalidArgument(name, " has ", tensor.numel(),
                           " elements, more than the ops' limit of ",
                           kMaxKernelElements);
  }
  if (tensor.numel() > 0 && tensor.data == nullptr) {
    return InvalidArgument(name, " has no data");
  }
  return absl::OkStatus();
}

absl::Status CheckTensor(const Context& context, const Tensor& tensor,
                         std::initializer_list<int64_t> expected,
                         std::initializer_list<DType> allowed,
                         absl::string_view name) {
  RETURN_IF_ERROR(CheckShape(tensor, expected, name));
  RETURN_IF_ERROR(CheckDType(tensor, allowed, name));
  return CheckPlacement(context, tensor, name);
}

absl::Status CheckLike(const Context& context, const Tensor& tensor,
                       const Tensor& like, absl::string_view name,
                       absl::string_view like_name) {
  RETURN_IF_ERROR(CheckPlacement(context, tensor, name));
  RETURN_IF_ERROR(CheckShape(tensor, absl::MakeConstSpan(like.shape), name));
  if (tensor.dtype != like.dtype) {
    return InvalidArgument(name, ": dtype ", DTypeName(tensor.dtype),
                           " differs from ", like_name, "'s ",
                           DTypeName(like.dtype));
  }
  return absl::OkStatus();
}

absl::Status CheckDisjoint(const Named& out,
                           std::initializer_list<Named> others) {
  for (const Named& other : others) {
    if (other.tensor != nullptr && Overlaps(*out.tensor, *other.tensor)) {
      return InvalidArgument(out.name, " overlaps ", other.name);
    }
  }
  return absl::OkStatus();
}

}  // namespace lossrt
