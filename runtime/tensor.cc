// Tensor views: sizes, shape checks and copies.
#include "runtime/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/context.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#endif

namespace lossrt {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Tensor::row_elements() const {
  if (shape.size() <= 1) return numel();
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t Tensor::span_bytes() const {
  const int64_t n = numel();
  if (n == 0) return 0;
  if (shape.size() <= 1 || is_contiguous()) return n * DTypeSize(dtype);
  return ((shape[0] - 1) * row_stride + row_elements()) * DTypeSize(dtype);
}

bool Overlaps(const Tensor& a, const Tensor& b) {
  if (a.data == nullptr || b.data == nullptr) return false;
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.span_bytes() && b0 < a0 + a.span_bytes();
}

std::string Tensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "] ", DTypeName(dtype),
                      " ", device.ToString(),
                      row_stride != 0 && !is_contiguous()
                          ? absl::StrCat(" row_stride=", row_stride)
                          : "");
}

absl::Status CheckShape(const Tensor& tensor,
                        absl::Span<const int64_t> expected,
                        absl::string_view name) {
  bool match = tensor.shape.size() == expected.size();
  for (size_t i = 0; match && i < expected.size(); ++i) {
    match = expected[i] < 0 || expected[i] == tensor.shape[i];
  }
  if (match) return absl::OkStatus();
  return InvalidArgument(name, ": expected shape [",
                         absl::StrJoin(expected, ", "), "], got [",
                         absl::StrJoin(tensor.shape, ", "), "]");
}

absl::Status CheckShape(const Tensor& tensor,
                        std::initializer_list<int64_t> expected,
                        absl::string_view name) {
  return CheckShape(
      tensor, absl::MakeConstSpan(expected.begin(), expected.size()), name);
}

absl::Status CheckDType(const Tensor& tensor,
                        std::initializer_list<DType> allowed,
                        absl::string_view name) {
  for (DType dtype : allowed) {
    if (tensor.dtype == dtype) return absl::OkStatus();
  }
  std::string names;
  for (DType dtype : allowed)
    absl::StrAppend(&names, names.empty() ? "" : " or ", DTypeName(dtype));
  return InvalidArgument(name, ": dtype must be ", names, ", got ",
                         DTypeName(tensor.dtype));
}

absl::StatusOr<OwnedTensor> EmptyTensor(Allocator& allocator, DType dtype,
                                        absl::Span<const int64_t> shape) {
  for (int64_t d : shape) {
    if (d < 0)
      return InvalidArgument("EmptyTensor: negative dimension in [",
                             absl::StrJoin(shape, ", "), "]");
  }
  OwnedTensor owned;
  owned.view = Tensor::Of(nullptr, dtype, shape, allocator.device());
  ASSIGN_OR_RETURN(owned.buffer,
                   allocator.Allocate(owned.view.numel() * DTypeSize(dtype)));
  owned.view.data = owned.buffer.data();
  return owned;
}

absl::Status CopyTensor(const Tensor& src, const Tensor& dst,
                        Context& context) {
  if (src.dtype != dst.dtype) {
    return InvalidArgument("CopyTensor: dtype ", DTypeName(src.dtype), " to ",
                           DTypeName(dst.dtype));
  }
  RETURN_IF_ERROR(CheckShape(dst, absl::MakeConstSpan(src.shape),
                             "CopyTensor destination"));
  const int64_t n = src.numel();
  if (n == 0) return absl::OkStatus();
  if (src.data == nullptr || dst.data == nullptr)
    return InvalidArgument("CopyTensor: null data");
  const int64_t element = DTypeSize(src.dtype);
  const int64_t rows = src.shape.size() <= 1 ? 1 : src.shape[0];
  const int64_t row_bytes =
      (src.shape.size() <= 1 ? n : src.row_elements()) * element;
  const int64_t src_pitch = src.effective_row_stride() * element;
  const int64_t dst_pitch = dst.effective_row_stride() * element;
  if (src.device.is_cpu() && dst.device.is_cpu()) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst.data) + r * dst_pitch,
                  static_cast<const char*>(src.data) + r * src_pitch,
                  row_bytes);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  for (const Tensor* t : {&src, &dst}) {
    if (t->device.is_cuda() && t->device != context.device()) {
      return InvalidArgument("CopyTensor: tensor on ", t->device.ToString(),
                             " but context on ", context.device().ToString());
    }
  }
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst.data, dst_pitch, src.data,
                                         src_pitch, row_bytes, rows,
                                         cudaMemcpyDefault, stream));
  if (dst.device.is_cpu()) CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError("CopyTensor: device tensors need CUDA");
#endif
}

}  // namespace lossrt
