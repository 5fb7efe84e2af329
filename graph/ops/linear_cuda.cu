// The bias gradient of the linear layer: column sums of dy.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "graph/ops/cuda_chunks.h"
#include "graph/ops/linear_cuda.h"
#include "runtime/device_convert.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace ops {
namespace {

constexpr int kColumnsPerBlock = 32;
constexpr int kRowLanes = 16;
constexpr int kRowsPerChunk = 256;
constexpr int kMaxChunks = 128;

using device_convert::ToFloat;

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

// The same sums with 16-byte loads, for rows of whole vectors: thread (c,
// lane) of block (x, y) sums the V = 16 / sizeof(T) consecutive columns that
// start at (32 x + c) V over rows lane, lane + 8, ... of chunk y, with several
// loads in flight; then the 8 lanes of each column are added in a fixed order.
// dy of a [16384, 768] layer is read at about the copy rate this way, where the
// scalar kernel (two bytes a thread a row) is latency-bound.
constexpr int kVecRowLanes = 8;

template <typename T>
__global__ void __launch_bounds__(32 * kVecRowLanes)
    ColumnSumChunksVecKernel(const T* __restrict__ values, int rows, int cols,
                             int rows_per_chunk, float* __restrict__ scratch) {
  constexpr int V = 16 / sizeof(T);
  // [V][lanes][32]: the writes below, one column of the V at a time, hit
  // consecutive banks.
  __shared__ float partial[V][kVecRowLanes][kColumnsPerBlock];
  const int col = (blockIdx.x * kColumnsPerBlock + threadIdx.x) * V;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(rows, row_begin + rows_per_chunk);
  float sum[V];
#pragma unroll
  for (int k = 0; k < V; ++k) sum[k] = 0.0f;
  if (col < cols) {
#pragma unroll 4
    for (int row = row_begin + threadIdx.y; row < row_end;
         row += kVecRowLanes) {
      float v[V];
      cuda_chunks::LoadVectorAsFloats(
          values + static_cast<int64_t>(row) * cols + col, v);
#pragma unroll
      for (int k = 0; k < V; ++k) sum[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) partial[k][threadIdx.y][threadIdx.x] = sum[k];
  __syncthreads();
  // Thread t of the block totals the block's column t (of 32 V).
  const int t = threadIdx.y * kColumnsPerBlock + threadIdx.x;
  if (t >= kColumnsPerBlock * V) return;
  const int c = t / V, k = t % V;
  const int out_col = (blockIdx.x * kColumnsPerBlock + c) * V + k;
  if (out_col >= cols) return;
  float total = 0.0f;
  for (int lane = 0; lane < kVecRowLanes; ++lane) total += partial[k][lane][c];
  scratch[static_cast<int64_t>(blockIdx.y) * cols + out_col] = total;
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
      std::max<int64_t>(kRowsPerChunk, CeilDiv<int64_t>(rows, kMaxChunks));
  return static_cast<int>(per_chunk);
}

// The first pass: 16-byte loads when whole rows are vectors, else scalars.
template <typename T>
void LaunchColumnSumChunks(const T* values, int rows, int cols, int per_chunk,
                           int chunks, float* scratch, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (cols % kVec == 0 && reinterpret_cast<uintptr_t>(values) % 16 == 0) {
    const dim3 grid(
        static_cast<unsigned>(CeilDiv(cols / kVec, kColumnsPerBlock)),
        static_cast<unsigned>(chunks));
    ColumnSumChunksVecKernel<<<grid, dim3(kColumnsPerBlock, kVecRowLanes), 0,
                               stream>>>(values, rows, cols, per_chunk,
                                         scratch);
  } else {
    const dim3 grid(static_cast<unsigned>(CeilDiv(cols, kColumnsPerBlock)),
                    static_cast<unsigned>(chunks));
    ColumnSumChunksKernel<<<grid, dim3(kColumnsPerBlock, kRowLanes), 0,
                            stream>>>(values, rows, cols, per_chunk, scratch);
  }
}

}  // namespace

int64_t ColumnSumChunks(int64_t rows) {
  const int per_chunk = RowsPerChunk(rows);
  return std::max<int64_t>(1, CeilDiv<int64_t>(rows, per_chunk));
}

cudaError_t LaunchAddColumnSums(const void* values, bool bf16, int64_t rows,
                                int64_t cols, float* scratch, float* sums,
                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const int per_chunk = RowsPerChunk(rows);
  const int chunks = static_cast<int>(ColumnSumChunks(rows));
  if (bf16) {
    LaunchColumnSumChunks(static_cast<const __nv_bfloat16*>(values),
                          static_cast<int>(rows), static_cast<int>(cols),
                          per_chunk, chunks, scratch, stream);
  } else {
    LaunchColumnSumChunks(static_cast<const float*>(values),
                          static_cast<int>(rows), static_cast<int>(cols),
                          per_chunk, chunks, scratch, stream);
  }
  const int threads = 256;
  AddChunkSumsKernel<<<static_cast<unsigned>(CeilDiv<int64_t>(cols, threads)),
                       threads, 0, stream>>>(scratch, chunks,
                                             static_cast<int>(cols), sums);
  return cudaGetLastError();
}

}  // namespace ops
}  // namespace lossrt
