// Argument checks for functions that take tensor views on a context (the
// graph's ops, the optimizer): placement on the context's device, contiguity,
// shape and dtype, the 32-bit element limit of the kernels, and overlaps. Each
// returns OK or an InvalidArgument that names the bad tensor.
//
//   RETURN_IF_ERROR(CheckTensor(context, x, {rows, -1}, {DType::kF32}, "x"));
//   RETURN_IF_ERROR(CheckDisjoint({&y, "y"}, {{&x, "x"}, {&w, "w"}}));
#ifndef LOSSRT_RUNTIME_TENSOR_CHECKS_H_
#define LOSSRT_RUNTIME_TENSOR_CHECKS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/context.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {

// Elements a checked tensor may hold: the kernels index with 32-bit integers.
inline constexpr int64_t kMaxKernelElements = (int64_t{1} << 31) - 1;

// OK when `tensor`, of any shape, is on the context's device, contiguous, with
// no negative dimension, at most kMaxKernelElements elements and data (unless
// it is empty); otherwise an InvalidArgument naming `name`.
absl::Status CheckPlacement(const Context& context, const Tensor& tensor,
                            absl::string_view name);

// CheckPlacement, and the `expected` shape (-1 matches any size) and one of the
// `allowed` dtypes.
absl::Status CheckTensor(const Context& context, const Tensor& tensor,
                         std::initializer_list<int64_t> expected,
                         std::initializer_list<DType> allowed,
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

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_TENSOR_CHECKS_H_
