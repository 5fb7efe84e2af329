// The bias gradient of the linear layer: column sums of dy.
#include <cuda_bf16.h>

#include <algorithm>

#include "graph/ops/linear_cuda.h"

namespace lossrt {
namespace ops {
namespace {

constexpr int kColumnsPerBlock = 32;
constexpr int kRowLanes = 16;
constexpr int kRowsPerChunk = 256;
constexpr int kMaxChunks = 128;

__device__ __forceinline__ float ToFloat(float value) { return value; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 value) {
  return __bfloat162float(value);
}

// Block (x, y) sums columns [32 x, 32 x + 32) over the rows of chunk y:
// thread (c, lane) takes rows lane, lane + 16, ... of the chunk (consecutive c
// read consecutive addresses), then the 16 lanes of a column are added in a
// fixed order. Chunks spread a tall, narrow dy over all SMs.
template <typename T>
__global__ void ColumnSumChunksKernel(const T* __restrict__ values, int rows,
                                      int cols, int rows_per_chunk,
                                      float* __restrict__ scratch) {
  __shared__ float partial[kRowLanes][kColumnsPerBlock];
  const int col = blockIdx.x * kColumnsPerBlock + threadIdx.x;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(rows, row_begin + rows_per_chunk);
  float sum = 0.0f;
  if (col < cols) {
    for (int row = row_begin + threadIdx.y; row < row_end; row += kRowLanes) {
      sum += ToFloat(values[static_cast<int64_t>(row) * cols + col]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) {
      total += partial[lane][threadIdx.x];
    }
    scratch[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
  }
}

// sums[c] += the chunks' partial sums of column c, in chunk order.
__global__ void AddChunkSumsKernel(const float* __restrict__ scratch,
                                   int chunks, int cols,
                                   float* __restrict__ sums) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    total += scratch[static_cast<int64_t>(chunk) * cols + col];
  }
  sums[col] += total;
}

int RowsPerChunk(int64_t rows) {
  const int64_t per_chunk =
      std::max<int64_t>(kRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  return static_cast<int>(per_chunk);
}

}  // namespace

int64_t ColumnSumChunks(int64_t rows) {
  const int per_chunk = RowsPerChunk(rows);
  return std::max<int64_t>(1, (rows + per_chunk - 1) / per_chunk);
}

cudaError_t LaunchAddColumnSums(const void* values, bool bf16, int64_t rows,
                                int64_t cols, float* scratch, float* sums,
                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const int per_chunk = RowsPerChunk(rows);
  const int chunks = static_cast<int>(ColumnSumChunks(rows));
  const dim3 block(kColumnsPerBlock, kRowLanes);
  const dim3 grid(
      static_cast<unsigned>((cols + kColumnsPerBlock - 1) / kColumnsPerBlock),
      static_cast<unsigned>(chunks));
  if (bf16) {
    ColumnSumChunksKernel<<<grid, block, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(values), static_cast<int>(rows),
        static_cast<int>(cols), per_chunk, scratch);
  } else {
    ColumnSumChunksKernel<<<grid, block, 0, stream>>>(
        static_cast<const float*>(values), static_cast<int>(rows),
        static_cast<int>(cols), per_chunk, scratch);
  }
  const int threads = 256;
  AddChunkSumsKernel<<<static_cast<unsigned>((cols + threads - 1) / threads),
                       threads, 0, stream>>>(scratch, chunks,
                                             static_cast<int>(cols), sums);
  return cudaGetLastError();
}

}  // namespace ops
}  // namespace lossrt
