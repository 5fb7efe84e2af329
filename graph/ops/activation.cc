// GELU and SwiGLU: argument checks, the CPU loops (float and double) and the
// dispatch to the CUDA kernels (graph/ops/activation_cuda.h).
#include "graph/ops/activation.h"

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "graph/ops/op_checks.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor_checks.h"

#ifdef LOSSRT_WITH_CUDA
#include "graph/ops/activation_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace ops {
namespace {

// An output may be the input itself (element i of the output depends on
// element i of the inputs only, and is written after they are read), but not
// a shifted view of it.
absl::Status CheckSameOrDisjoint(const Tensor& out, const Tensor& in,
                                 absl::string_view out_name,
                                 absl::string_view in_name) {
  if (Overlaps(out, in) && out.data != in.data) {
    return InvalidArgument(out_name, " overlaps ", in_name,
                           " without being the same tensor");
  }
  return absl::OkStatus();
}

// An element-wise operand of any rank: placed (op_checks.h) and of an
// activation dtype.
absl::Status CheckOperand(const Context& context, const Tensor& tensor,
                          absl::string_view name) {
  RETURN_IF_ERROR(CheckPlacement(context, tensor, name));
  return CheckActivationDType(context, tensor.dtype, name);
}

// x [rows, 2F] of SwiGLU: returns F.
absl::StatusOr<int64_t> CheckSwiGluInput(const Context& context,
                                         const Tensor& x) {
  RETURN_IF_ERROR(CheckActivationDType(context, x.dtype, "x"));
  RETURN_IF_ERROR(CheckTensor(context, x, {-1, -1}, {x.dtype}, "x"));
  if (x.dim(1) % 2 != 0) {
    return InvalidArgument("x: SwiGLU needs [rows, 2F] ([gate | up]), got ",
                           x.ShapeString(), " with an odd width");
  }
  return x.dim(1) / 2;
}

absl::Status NoCuda(const char* op) {
  return absl::UnavailableError(
      absl::StrCat(op, " on a CUDA device: built without CUDA"));
}

template <typename T>
constexpr T kSqrt2OverPi = static_cast<T>(0.79788456080286535587989211986876);
template <typename T>
constexpr T kGeluCoeff = static_cast<T>(0.044715);

// sigmoid(z) and 1 - sigmoid(z) without cancellation (see the CUDA twin).
template <typename T>
void SigmoidPair(T z, T& s, T& rest) {
  const T e = std::exp(-std::abs(z));
  const T inv = T(1) / (T(1) + e);
  s = z >= T(0) ? inv : e * inv;
  rest = z >= T(0) ? e * inv : inv;
}

// gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2 u): the sigmoid form keeps the
// relative accuracy of the negative tail, where 1 + tanh(u) cancels.
template <typename T>
void GeluForwardCpu(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T u = kSqrt2OverPi<T> * (v + kGeluCoeff<T> * v * v * v);
    T s, rest;
    SigmoidPair(T(2) * u, s, rest);
    y[i] = v * s;
  }
}

// gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 c x^2) with t =
// tanh(u), computed as s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 c x^2), s =
// sigmoid(2 u).
template <typename T>
void GeluBackwardCpu(const T* x, const T* dy, T* dx, int64_t n,
                     bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T v2 = v * v;
    const T u = kSqrt2OverPi<T> * (v + kGeluCoeff<T> * v * v2);
    T s, rest;
    SigmoidPair(T(2) * u, s, rest);
    const T grad = s + T(2) * v * s * rest * kSqrt2OverPi<T> *
                           (T(1) + T(3) * kGeluCoeff<T> * v2);
    const T value = dy[i] * grad;
    dx[i] = accumulate ? dx[i] + value : value;
  }
}

// 1 / (1 + exp(-g)): exp overflows to inf for very negative g, giving 0.
template <typename T>
T Sigmoid(T g) {
  return T(1) / (T(1) + std::exp(-g));
}

template <typename T>
void SwiGluForwardCpu(const T* x, T* y, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * 2 * width;  // [width], then up [width]
    const T* up = gate + width;
    T* out = y + r * width;
    for (int64_t f = 0; f < width; ++f) {
      out[f] = gate[f] * Sigmoid(gate[f]) * up[f];
    }
  }
}

// d gate = dy up s (1 + g (1 - s)), d up = dy g s, with s = sigmoid(g). Both
// inputs of an element are read before its two gradients are written (dx may
// be x).
template <typename T>
void SwiGluBackwardCpu(const T* x, const T* dy, T* dx, int64_t rows,
                       int64_t width, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * 2 * width;
    const T* up = gate + width;
    const T* grad = dy + r * width;
    T* d_gate = dx + r * 2 * width;
    T* d_up = d_gate + width;
    for (int64_t f = 0; f < width; ++f) {
      const T g = gate[f];
      const T u = up[f];
      const T s = Sigmoid(g);
      const T dg = grad[f] * u * s * (T(1) + g * (T(1) - s));
      const T du = grad[f] * g * s;
      d_gate[f] = accumulate ? d_gate[f] + dg : dg;
      d_up[f] = accumulate ? d_up[f] + du : du;
    }
  }
}

}  // namespace

absl::Status GeluForward(Context& context, const Tensor& x, const Tensor& y) {
  RETURN_IF_ERROR(CheckOperand(context, x, "x"));
  RETURN_IF_ERROR(CheckLike(context, y, x, "y", "x"));
  RETURN_IF_ERROR(CheckSameOrDisjoint(y, x, "y", "x"));
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  if (context.device().is_cpu()) {
    if (x.dtype == DType::kF64) {
      GeluForwardCpu(x.data_as<const double>(), y.data_as<double>(), n);
    } else {
      GeluForwardCpu(x.data_as<const float>(), y.data_as<float>(), n);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(cuda::LaunchGeluForward(
      x.data, y.data, n, x.dtype == DType::kBF16, stream));
  return absl::OkStatus();
#else
  return NoCuda("GeluForward");
#endif
}

absl::Status GeluBackward(Context& context, const Tensor& x, const Tensor& dy,
                          const Tensor& dx, bool accumulate) {
  RETURN_IF_ERROR(CheckOperand(context, x, "x"));
  RETURN_IF_ERROR(CheckLike(context, dy, x, "dy", "x"));
  RETURN_IF_ERROR(CheckLike(context, dx, x, "dx", "x"));
  RETURN_IF_ERROR(CheckSameOrDisjoint(dx, x, "dx", "x"));
  RETURN_IF_ERROR(CheckSameOrDisjoint(dx, dy, "dx", "dy"));
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  if (context.device().is_cpu()) {
    if (x.dtype == DType::kF64) {
      GeluBackwardCpu(x.data_as<const double>(), dy.data_as<const double>(),
                      dx.data_as<double>(), n, accumulate);
    } else {
      GeluBackwardCpu(x.data_as<const float>(), dy.data_as<const float>(),
                      dx.data_as<float>(), n, accumulate);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(
      cuda::LaunchGeluBackward(x.data, dy.data, dx.data, n, accumulate,
                               x.dtype == DType::kBF16, stream));
  return absl::OkStatus();
#else
  return NoCuda("GeluBackward");
#endif
}

absl::Status SwiGluForward(Context& context, const Tensor& x, const Tensor& y) {
  ASSIGN_OR_RETURN(const int64_t width, CheckSwiGluInput(context, x));
  const int64_t rows = x.dim(0);
  RETURN_IF_ERROR(CheckTensor(context, y, {rows, width}, {x.dtype}, "y"));
  if (Overlaps(y, x)) return InvalidArgument("y overlaps x");
  if (rows * width == 0) return absl::OkStatus();
  if (context.device().is_cpu()) {
    if (x.dtype == DType::kF64) {
      SwiGluForwardCpu(x.data_as<const double>(), y.data_as<double>(), rows,
                       width);
    } else {
      SwiGluForwardCpu(x.data_as<const float>(), y.data_as<float>(), rows,
                       width);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(cuda::LaunchSwiGluForward(
      x.data, y.data, rows, width, x.dtype == DType::kBF16, stream));
  return absl::OkStatus();
#else
  return NoCuda("SwiGluForward");
#endif
}

absl::Status SwiGluBackward(Context& context, const Tensor& x, const Tensor& dy,
                            const Tensor& dx, bool accumulate) {
  ASSIGN_OR_RETURN(const int64_t width, CheckSwiGluInput(context, x));
  const int64_t rows = x.dim(0);
  RETURN_IF_ERROR(CheckTensor(context, dy, {rows, width}, {x.dtype}, "dy"));
  RETURN_IF_ERROR(CheckTensor(context, dx, {rows, 2 * width}, {x.dtype}, "dx"));
  if (Overlaps(dx, dy)) return InvalidArgument("dx overlaps dy");
  RETURN_IF_ERROR(CheckSameOrDisjoint(dx, x, "dx", "x"));
  if (rows * width == 0) return absl::OkStatus();
  if (context.device().is_cpu()) {
    if (x.dtype == DType::kF64) {
      SwiGluBackwardCpu(x.data_as<const double>(), dy.data_as<const double>(),
                        dx.data_as<double>(), rows, width, accumulate);
    } else {
      SwiGluBackwardCpu(x.data_as<const float>(), dy.data_as<const float>(),
                        dx.data_as<float>(), rows, width, accumulate);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(
      cuda::LaunchSwiGluBackward(x.data, dy.data, dx.data, rows, width,
                                 accumulate, x.dtype == DType::kBF16, stream));
  return absl::OkStatus();
#else
  return NoCuda("SwiGluBackward");
#endif
}

}  // namespace ops
}  // namespace lossrt
