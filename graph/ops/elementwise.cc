// The element-wise ops: argument checks, the CPU loops and the dispatch to the
// CUDA kernels (graph/ops/elementwise_cuda.h).
#include "graph/ops/elementwise.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "graph/ops/op_checks.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor_checks.h"

#ifdef LOSSRT_WITH_CUDA
#include "graph/ops/elementwise_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace ops {
namespace {

// Calls f with a value of the host storage type of `dtype` (f32, f64, or the
// bits of a bf16).
template <typename F>
void WithStorage(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float{});
      break;
    case DType::kF64:
      f(double{});
      break;
    case DType::kBF16:
      f(uint16_t{});
      break;
    default:
      break;
  }
}

template <typename A>
A Widen(float value) {
  return value;
}
template <typename A>
A Widen(double value) {
  return static_cast<A>(value);
}
template <typename A>
A Widen(uint16_t bf16_bits) {
  return Bf16BitsToFloat(bf16_bits);
}

template <typename A>
void Narrow(A value, float* out) {
  *out = static_cast<float>(value);
}
template <typename A>
void Narrow(A value, double* out) {
  *out = static_cast<double>(value);
}
template <typename A>
void Narrow(A value, uint16_t* out) {
  *out = FloatToBf16Bits(static_cast<float>(value));
}

template <typename T>
void AddCpu(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <typename S, typename D>
void AccumulateCpu(const S* src, D* dst, int64_t n, bool accumulate) {
  // The sum is formed in f64 when either side is f64, else in f32 (as on the
  // GPU), and rounded once.
  using A =
      std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>,
                         double, float>;
  for (int64_t i = 0; i < n; ++i) {
    A value = Widen<A>(src[i]);
    if (accumulate) value = Widen<A>(dst[i]) + value;
    Narrow(value, &dst[i]);
  }
}

absl::Status NoCuda(const char* op) {
  return absl::UnavailableError(
      absl::StrCat(op, " on a CUDA device: built without CUDA"));
}

}  // namespace

absl::Status Add(Context& context, const Tensor& a, const Tensor& b,
                 const Tensor& y) {
  RETURN_IF_ERROR(CheckPlacement(context, a, "a"));
  RETURN_IF_ERROR(CheckActivationDType(context, a.dtype, "a"));
  RETURN_IF_ERROR(CheckLike(context, b, a, "b", "a"));
  RETURN_IF_ERROR(CheckLike(context, y, a, "y", "a"));
  // Element i of y depends on element i of a and b only, so y may be a or b;
  // a shifted overlap would read elements already overwritten.
  if (Overlaps(y, a) && y.data != a.data) {
    return InvalidArgument("y overlaps a without being the same tensor");
  }
  if (Overlaps(y, b) && y.data != b.data) {
    return InvalidArgument("y overlaps b without being the same tensor");
  }
  const int64_t n = a.numel();
  if (n == 0) return absl::OkStatus();
  if (context.device().is_cpu()) {
    if (a.dtype == DType::kF64) {
      AddCpu(a.data_as<const double>(), b.data_as<const double>(),
             y.data_as<double>(), n);
    } else {
      AddCpu(a.data_as<const float>(), b.data_as<const float>(),
             y.data_as<float>(), n);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(cuda::LaunchAdd(a.data, b.data, y.data, n,
                                       a.dtype == DType::kBF16, stream));
  return absl::OkStatus();
#else
  return NoCuda("Add");
#endif
}

absl::Status AccumulateInto(Context& context, const Tensor& src,
                            const Tensor& dst, bool accumulate) {
  RETURN_IF_ERROR(CheckPlacement(context, src, "src"));
  RETURN_IF_ERROR(CheckPlacement(context, dst, "dst"));
  RETURN_IF_ERROR(
      CheckDType(src, {DType::kF32, DType::kBF16, DType::kF64}, "src"));
  RETURN_IF_ERROR(
      CheckDType(dst, {DType::kF32, DType::kBF16, DType::kF64}, "dst"));
  if (src.numel() != dst.numel()) {
    return InvalidArgument("AccumulateInto: src ", src.ShapeString(), " has ",
                           src.numel(), " elements, dst ", dst.ShapeString(),
                           " has ", dst.numel());
  }
  if (Overlaps(src, dst) && (src.data != dst.data || src.dtype != dst.dtype)) {
    return InvalidArgument(
        "AccumulateInto: dst overlaps src without being the same tensor");
  }
  const int64_t n = src.numel();
  if (n == 0) return absl::OkStatus();
  if (context.device().is_cpu()) {
    WithStorage(src.dtype, [&](auto s) {
      WithStorage(dst.dtype, [&](auto d) {
        using S = decltype(s);
        using D = decltype(d);
        AccumulateCpu(src.data_as<const S>(), dst.data_as<D>(), n, accumulate);
      });
    });
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(cuda::LaunchAccumulate(
      src.data, src.dtype, dst.data, dst.dtype, n, accumulate, stream));
  return absl::OkStatus();
#else
  return NoCuda("AccumulateInto");
#endif
}

absl::Status Zero(Context& context, const Tensor& dst) {
  RETURN_IF_ERROR(CheckPlacement(context, dst, "dst"));
  const int64_t bytes = dst.numel() * DTypeSize(dst.dtype);
  if (bytes == 0) return absl::OkStatus();
  // All-zero bits are 0 (+0.0) in every dtype.
  if (context.device().is_cpu()) {
    std::memset(dst.data, 0, bytes);
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst.data, 0, bytes, stream));
  return absl::OkStatus();
#else
  return NoCuda("Zero");
#endif
}

}  // namespace ops
}  // namespace lossrt
