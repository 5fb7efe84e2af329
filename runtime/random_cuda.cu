// CUDA fill kernel for runtime/random.h: one thread per element, grid-stride.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/dtype.h"
#include "runtime/random_cuda.h"

namespace lossrt {
namespace {

template <typename T>
__device__ __forceinline__ T FromDouble(double value);
template <>
__device__ __forceinline__ float FromDouble<float>(double value) {
  return static_cast<float>(value);
}
template <>
__device__ __forceinline__ double FromDouble<double>(double value) {
  return value;
}
template <>
__device__ __forceinline__ __nv_bfloat16
FromDouble<__nv_bfloat16>(double value) {
  return __float2bfloat16_rn(static_cast<float>(value));
}
template <>
__device__ __forceinline__ __half FromDouble<__half>(double value) {
  return __float2half_rn(static_cast<float>(value));
}
template <>
__device__ __forceinline__ int32_t FromDouble<int32_t>(double value) {
  return static_cast<int32_t>(value);
}
template <>
__device__ __forceinline__ int64_t FromDouble<int64_t>(double value) {
  return static_cast<int64_t>(value);
}

template <typename T>
__device__ __forceinline__ double ToDouble(T value) {
  return static_cast<double>(value);
}
template <>
__device__ __forceinline__ double ToDouble<__nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
__device__ __forceinline__ double ToDouble<__half>(__half value) {
  return __half2float(value);
}

template <typename T>
__global__ void FillRandomKernel(T* data, int64_t count, RandomParams params) {
  const bool uniform = params.kind == RandomKind::kUniform;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T value = FromDouble<T>(RandomValue(params, static_cast<uint64_t>(i)));
    // Keep uniform draws below b after rounding to T, as the host fill does.
    if (uniform && ToDouble(value) >= params.b)
      value = FromDouble<T>(params.below_b);
    data[i] = value;
  }
}

template <typename T>
cudaError_t Launch(void* data, int64_t count, RandomParams params,
                   cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = (count + threads - 1) / threads;
  FillRandomKernel<T>
      <<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), threads, 0,
         stream>>>(static_cast<T*>(data), count, params);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFillRandom(void* data, int dtype, int64_t count,
                             RandomParams params, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (static_cast<DType>(dtype)) {
    case DType::kF32:
      return Launch<float>(data, count, params, stream);
    case DType::kF64:
      return Launch<double>(data, count, params, stream);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(data, count, params, stream);
    case DType::kF16:
      return Launch<__half>(data, count, params, stream);
    case DType::kI32:
      return Launch<int32_t>(data, count, params, stream);
    case DType::kI64:
      return Launch<int64_t>(data, count, params, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace lossrt
