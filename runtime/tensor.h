// Tensor: a non-owning view of device or host memory (data pointer, dtype,
// shape, row stride, device), shape checks that name both shapes, and copies
// between host and device. OwnedTensor pairs a view with the Buffer that holds
// its memory.
//
// clang-format off
//   lossrt::Tensor logits = lossrt::Tensor::Of(ptr, lossrt::DType::kF32, {tokens, vocab},
//                                              lossrt::Device::Cuda(0));  // [tokens, vocab]
//   RETURN_IF_ERROR(lossrt::CheckShape(logits, {tokens, vocab}, "logits"));
// clang-format on
#ifndef LOSSRT_RUNTIME_TENSOR_H_
#define LOSSRT_RUNTIME_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace lossrt {

class Context;

using Shape = absl::InlinedVector<int64_t, 4>;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  // Elements between the starts of consecutive rows (along dim 0) when the
  // tensor has at least two dims; 0 means contiguous. Only the leading dim may
  // be strided.
  int64_t row_stride = 0;
  Device device;

  // `shape`: a braced list ({rows, cols}, {} for a scalar), a Shape or any
  // contiguous int64_t sequence.
  static Tensor Of(void* data, DType dtype, absl::Span<const int64_t> shape,
                   Device device, int64_t row_stride = 0) {
    Tensor tensor;
    tensor.data = data;
    tensor.dtype = dtype;
    // Element by element: moving or copying a whole Shape copies its inline
    // storage, uninitialized past size(), which GCC flags as
    // -Wmaybe-uninitialized wherever the call is inlined.
    tensor.shape.assign(shape.begin(), shape.end());
    tensor.device = device;
    tensor.row_stride = row_stride;
    return tensor;
  }

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t dim(int64_t i) const { return shape[i]; }
  int64_t numel() const;
  // Elements of one row (product of all dims but the first); numel() for rank
  // <= 1.
  int64_t row_elements() const;
  // The row stride in effect: row_stride, or row_elements() when contiguous.
  int64_t effective_row_stride() const {
    return row_stride != 0 ? row_stride : row_elements();
  }
  bool is_contiguous() const {
    return row_stride == 0 || row_stride == row_elements();
  }
  // Bytes the view spans from data to its last element (strides included).
  int64_t span_bytes() const;
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
  std::string ShapeString() const;  // "[16384, 4096] f32 cuda:0"
};

// Whether the bytes two views span intersect (false when either has no data).
bool Overlaps(const Tensor& a, const Tensor& b);

// InvalidArgument naming `name`, the expected and the actual shape when they
// differ (-1 in `expected` matches any size).
absl::Status CheckShape(const Tensor& tensor,
                        absl::Span<const int64_t> expected,
                        absl::string_view name);
absl::Status CheckShape(const Tensor& tensor,
                        std::initializer_list<int64_t> expected,
                        absl::string_view name);
absl::Status CheckDType(const Tensor& tensor,
                        std::initializer_list<DType> allowed,
                        absl::string_view name);

// A tensor and the memory it lives in.
struct OwnedTensor {
  Buffer buffer;
  Tensor view;
};

// A contiguous tensor from `allocator` (contents undefined).
absl::StatusOr<OwnedTensor> EmptyTensor(Allocator& allocator, DType dtype,
                                        absl::Span<const int64_t> shape);

// Copies src into dst (same dtype and shape; either may be on host or device;
// strided rows allowed). Device copies are queued on the context's stream;
// copies to the host wait for it.
absl::Status CopyTensor(const Tensor& src, const Tensor& dst, Context& context);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_TENSOR_H_
