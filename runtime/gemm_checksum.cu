// The CUDA kernel of runtime/gemm_checksum.h: each block sums whole columns,
// one atomic add per warp.
#include "runtime/gemm_checksum.h"

namespace lossrt {
namespace {

__global__ void GemmChecksumKernel(const unsigned char* data,
                                   int64_t column_words, int64_t columns,
                                   int64_t ld_bytes, unsigned long long* sum) {
  unsigned long long local = 0;
  for (int64_t column = blockIdx.x; column < columns; column += gridDim.x) {
    const unsigned short* words =
        reinterpret_cast<const unsigned short*>(data + column * ld_bytes);
    for (int64_t i = threadIdx.x; i < column_words; i += blockDim.x) {
      // Odd multipliers from the position: a changed or moved word changes
      // the sum.
      const unsigned long long position =
          static_cast<unsigned long long>(column * column_words + i);
      local += (static_cast<unsigned long long>(words[i]) + 1) *
               ((position * 0x9E3779B97F4A7C15ull) | 1ull);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    local += __shfl_down_sync(0xffffffffu, local, offset);
  }
  if (threadIdx.x % 32 == 0 && local != 0) atomicAdd(sum, local);
}

}  // namespace

cudaError_t LaunchGemmChecksum(const void* data, int64_t column_bytes,
                               int64_t columns, int64_t ld_bytes,
                               unsigned long long* sum, cudaStream_t stream) {
  const cudaError_t zero =
      cudaMemsetAsync(sum, 0, sizeof(unsigned long long), stream);
  if (zero != cudaSuccess || columns <= 0 || column_bytes <= 0) return zero;
  const int64_t blocks = columns < 4096 ? columns : 4096;
  GemmChecksumKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<const unsigned char*>(data), column_bytes / 2, columns,
      ld_bytes, sum);
  return cudaGetLastError();
}

}  // namespace lossrt
