// Integer rounding shared by the host code and the CUDA kernels: CeilDiv (how
// many blocks of `b` cover `a`) and RoundUp (the next multiple). constexpr, and
// __host__ __device__ under nvcc, so that launch sizes, workspace layouts and
// kernels compute them the same way.
//
//   const int64_t blocks = lossrt::CeilDiv(n, int64_t{kThreads});
//   const int64_t bytes = lossrt::RoundUp(count * 4, int64_t{256});
#ifndef LOSSRT_RUNTIME_INT_MATH_H_
#define LOSSRT_RUNTIME_INT_MATH_H_

#include <type_traits>

#ifdef __CUDACC__
#define LOSSRT_HOST_DEVICE __host__ __device__
#else
#define LOSSRT_HOST_DEVICE
#endif

namespace lossrt {

// ceil(a / b) for a >= 0 and b > 0. Both operands have one type: mixing
// int and int64_t must be spelled out at the call, where the range is known.
template <typename T>
LOSSRT_HOST_DEVICE constexpr T CeilDiv(T a, T b) {
  static_assert(std::is_integral_v<T>, "CeilDiv takes integers");
  return (a + b - 1) / b;
}

// The smallest multiple of `multiple` (> 0) that is >= value (>= 0).
template <typename T>
LOSSRT_HOST_DEVICE constexpr T RoundUp(T value, T multiple) {
  static_assert(std::is_integral_v<T>, "RoundUp takes integers");
  return CeilDiv(value, multiple) * multiple;
}

}  // namespace lossrt

#undef LOSSRT_HOST_DEVICE

#endif  // LOSSRT_RUNTIME_INT_MATH_H_
