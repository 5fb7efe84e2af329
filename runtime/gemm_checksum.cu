// The CUDA kernel of runtime/gemm_checksum.h: each block sums whole columns,
// one atomic add per warp.
#include "runtime/gemm_checksum.h"

namespace lossrt {
namespace {

// Odd (so that (position * kPositionWeight) | 1 only sets bit 0 of even
// products).
constexpr unsigned long long kPositionWeight = 0x9E3779B97F4A7C15ull;

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
               ((position * kPositionWeight) | 1ull);
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

unsigned long long GemmChecksumOfZeros(int64_t column_bytes, int64_t columns) {
  if (columns <= 0 || column_bytes <= 0) return 0;
  // The zero words sit at positions q = 0 .. count - 1, each adding
  // (q * weight) | 1 = q * weight + [q even] (the weight is odd), mod 2^64.
  const unsigned long long count =
      static_cast<unsigned long long>(columns) *
      static_cast<unsigned long long>(column_bytes / 2);
  const unsigned long long position_sum =
      count % 2 == 0 ? (count / 2) * (count - 1) : count * ((count - 1) / 2);
  return kPositionWeight * position_sum + (count + 1) / 2;
}

}  // namespace lossrt
