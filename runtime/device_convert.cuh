// Device value conversions between the element types of tensors (f64, f32,
// bf16, f16 and the integers), for the CUDA kernels of the runtime, the ops and
// the optimizer. The 16-bit types go through f32 both ways and round to nearest
// even, as the host conversions of runtime/dtype.h do. Internal; included by
// .cu files only (list //runtime:device_convert.cuh in the cu_hdrs).
//
//   using device_convert::FromFloat;
//   using device_convert::ToFloat;
//   y[i] = FromFloat<T>(ToFloat(x[i]) * scale);  // T: float or __nv_bfloat16
#ifndef LOSSRT_RUNTIME_DEVICE_CONVERT_CUH_
#define LOSSRT_RUNTIME_DEVICE_CONVERT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace lossrt {
namespace device_convert {

// `value` as a To: the 16-bit types widen to f32 first, and anything narrows
// to them from f32 (so f64 -> bf16 rounds twice, as on the host); every other
// pair is a static_cast.
template <typename To, typename From>
__device__ __forceinline__ To Convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return Convert<To>(__bfloat162float(value));
  } else if constexpr (std::is_same_v<From, __half>) {
    return Convert<To>(__half2float(value));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

template <typename T>
__device__ __forceinline__ float ToFloat(T value) {
  return Convert<float>(value);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float value) {
  return Convert<T>(value);
}

}  // namespace device_convert
}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_DEVICE_CONVERT_CUH_
