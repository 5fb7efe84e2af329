// CUDA kernels of the embedding: an id range check, the gather (+ position
// add), and the backward: the token table's scatter-add, made deterministic by
// sorting the ids (CUB's radix sort) so that each id's gradient row has one
// writer that adds its rows in row order, and the per-position sums over the
// batch (deterministic too). Each thread handles eight consecutive elements,
// moved as whole 16-byte vectors when the width is a multiple of eight and the
// tensors are 16-byte aligned.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "graph/ops/cuda_chunks.h"
#include "graph/ops/embedding_cuda.h"
#include "runtime/device_convert.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace ops {
namespace cuda {
namespace {

using cuda_chunks::Aligned16;
using cuda_chunks::ChunkBlocks;
using cuda_chunks::kChunk;
using cuda_chunks::LoadChunk;
using cuda_chunks::StoreChunk;
using device_convert::FromFloat;
using device_convert::ToFloat;

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The first element of the calling thread's chunk.
__device__ __forceinline__ int64_t ThreadChunk() {
  return (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kChunk;
}

// Integer atomics commute exactly, so the count is deterministic.
__global__ void __launch_bounds__(kThreads)
    CountInvalidKernel(const int32_t* __restrict__ ids, int64_t rows,
                       int64_t vocab, int32_t* __restrict__ invalid) {
  int32_t count = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < rows; i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int32_t id = ids[i];
    count += (id < 0 || id >= vocab) ? 1 : 0;
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    count += __shfl_xor_sync(kFullMask, count, offset);
  }
  if (threadIdx.x % kWarpSize == 0 && count != 0) atomicAdd(invalid, count);
}

// `vec`: cols % kChunk == 0 and every table 16-byte aligned, so a chunk lies in
// one row and is whole vectors in the tables too.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const int32_t* __restrict__ ids,
                  const T* __restrict__ token_table,
                  const T* __restrict__ position_table, int64_t rows,
                  int64_t cols, int64_t seq, T* __restrict__ out, bool vec) {
  const int64_t n = rows * cols;
  const int64_t i = ThreadChunk();
  if (i >= n) return;
  float v[kChunk];
  if (vec) {
    const int64_t row = i / cols;
    const int64_t c = i - row * cols;
    LoadChunk(token_table + ids[row] * cols + c, 0, kChunk, true, v);
    if (position_table != nullptr) {
      float p[kChunk];
      LoadChunk(position_table + (row % seq) * cols + c, 0, kChunk, true, p);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[k] += p[k];
    }
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      const int64_t j = i + k;
      v[k] = 0.0f;
      if (j < n) {
        const int64_t row = j / cols;
        const int64_t c = j - row * cols;
        v[k] = ToFloat(token_table[ids[row] * cols + c]);
        if (position_table != nullptr) {
          v[k] += ToFloat(position_table[(row % seq) * cols + c]);
        }
      }
    }
  }
  StoreChunk(out, i, n, vec, v);
}

// The token gradient's deterministic scatter (see embedding.h for why): the
// ids are sorted stably with their rows (CUB's radix sort), so each id's rows
// lie together in increasing row order; then every id has exactly one writer
// of its gradient row, which adds its rows in that order and the sum into the
// row once. The sorted order is cut into tiles of kTile tokens, one block
// each (threads over the columns, kChunk each): a run of equal ids inside a
// tile is summed there and added to the table by TileRunSumsKernel; a run that
// crosses tile boundaries (a frequent id: hundreds of tokens) leaves one
// partial sum per tile in the workspace, and SpanningRunSumsKernel adds those
// in a fixed order, by the run's first tile. A long run is thus parallel over
// tiles and columns, and every sum's order depends only on the ids.
constexpr int kTile = 32;
// Rows loaded before they are added, to keep loads in flight.
constexpr int kRunUnroll = 8;
// Threads of a run-sum block (multiples of a warp): kChunk columns each.
constexpr int kMaxColumnThreads = 128;
// Column slices beyond this loop inside the blocks (the grid's y limit).
constexpr int64_t kMaxColumnSlices = 65535;

// CUB's temporaries and ours, each aligned for 16-byte vectors.
constexpr size_t kWorkspaceAlignment = 256;

// The ids [0, vocab) fit in this many low bits; the sort looks at no others.
int KeyBits(int64_t vocab) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

// Where the backward's arrays lie in its workspace.
struct BackwardLayout {
  size_t sorted_ids = 0;  // i32 [rows]: the ids in ascending order
  size_t row_order = 0;   // i32 [rows]: 0, 1, ..., rows - 1 (the sort's values)
  size_t sorted_rows = 0;  // i32 [rows]: the d_out row of each sorted id
  size_t first_partials =
      0;  // f32 [tiles, cols]: a tile's run continued from before
  size_t last_partials =
      0;  // f32 [tiles, cols]: a tile's run that starts a spanning run
  size_t sort_temp = 0;  // CUB's temporary storage
  size_t sort_temp_bytes = 0;
  size_t total = 0;
};

cudaError_t PlanBackward(int64_t rows, int64_t cols, int64_t vocab,
                         BackwardLayout* layout) {
  BackwardLayout l;
  size_t offset = 0;
  auto take = [&](size_t bytes) {
    const size_t at = offset;
    offset += RoundUp(bytes, kWorkspaceAlignment);
    return at;
  };
  const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  const size_t partial_bytes =
      static_cast<size_t>(CeilDiv<int64_t>(rows, kTile)) *
      static_cast<size_t>(cols) * sizeof(float);
  l.sorted_ids = take(id_bytes);
  l.row_order = take(id_bytes);
  l.sorted_rows = take(id_bytes);
  l.first_partials = take(partial_bytes);
  l.last_partials = take(partial_bytes);
  // A size query: no work, no stream.
  const cudaError_t error = cub::DeviceRadixSort::SortPairs(
      nullptr, l.sort_temp_bytes, static_cast<const uint32_t*>(nullptr),
      static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int>(rows), 0,
      KeyBits(vocab));
  if (error != cudaSuccess) return error;
  l.sort_temp = take(l.sort_temp_bytes);
  l.total = offset;
  *layout = l;
  return cudaSuccess;
}

__global__ void __launch_bounds__(kThreads)
    RowOrderKernel(int32_t rows, int32_t* __restrict__ row_order) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (r < rows) row_order[r] = static_cast<int32_t>(r);
}

// The threads of a run-sum block for `cols` columns: whole warps, kChunk
// columns each, at most kMaxColumnThreads.
int ColumnThreads(int64_t cols) {
  const int64_t chunks = CeilDiv<int64_t>(cols, kChunk);
  return static_cast<int>(std::min<int64_t>(RoundUp<int64_t>(chunks, kWarpSize),
                                            kMaxColumnThreads));
}

// d_token_table row `row`, columns [c, c + kChunk) += sum, as atomic adds
// that return nothing: each element of the row gets exactly this one add in
// the whole backward (one writer per id), so the result, old + sum, does not
// depend on any order; the atomics only spare the thread the wait for the
// row's old value (a read of a random row). On sm_90 a vector atomic adds
// four floats at once.
__device__ __forceinline__ void AddToRow(float* __restrict__ row, int64_t c,
                                         int64_t cols, bool vec,
                                         const float (&sum)[kChunk]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (vec) {
    atomicAdd(reinterpret_cast<float4*>(row + c),
              make_float4(sum[0], sum[1], sum[2], sum[3]));
    atomicAdd(reinterpret_cast<float4*>(row + c + 4),
              make_float4(sum[4], sum[5], sum[6], sum[7]));
    return;
  }
#endif
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    if (c + k < cols) atomicAdd(row + c + k, sum[k]);
  }
}

// Tile blockIdx.x of the sorted ids: sorted tokens [tile * kTile, + count).
// Each maximal group of equal ids in the tile (a sub-run) is summed over its
// d_out rows in sorted (= row) order. A sub-run that is a whole run is added
// to its table row; the tile's first sub-run when its run began in an earlier
// tile goes to first_partials [tile], the last when its run began here and
// goes on past the tile to last_partials [tile]. `vec`: cols % kChunk == 0 and
// d_out and the table 16-byte aligned (the partials always are). Ids outside
// [0, vocab) (only possible when the caller skipped the check) are skipped.
template <typename T>
__global__ void __launch_bounds__(kMaxColumnThreads)
    TileRunSumsKernel(const int32_t* __restrict__ sorted_ids,
                      const int32_t* __restrict__ sorted_rows,
                      const T* __restrict__ d_out, int64_t rows, int64_t cols,
                      int64_t vocab, float* __restrict__ d_token_table,
                      float* __restrict__ first_partials,
                      float* __restrict__ last_partials, bool vec) {
  // ids[1 + k] is sorted token start + k; ids[0] and ids[count + 1] its
  // neighbours outside the tile (-1 past either end).
  __shared__ int32_t ids[kTile + 2];
  __shared__ int32_t source_rows[kTile];
  const int64_t tile = blockIdx.x;
  const int64_t start = tile * kTile;
  const int count =
      static_cast<int>(rows - start < kTile ? rows - start : kTile);
  for (int k = threadIdx.x; k < count; k += blockDim.x) {
    ids[k + 1] = sorted_ids[start + k];
    source_rows[k] = sorted_rows[start + k];
  }
  if (threadIdx.x == 0) {
    ids[0] = start > 0 ? sorted_ids[start - 1] : -1;
    ids[count + 1] = start + count < rows ? sorted_ids[start + count] : -1;
  }
  __syncthreads();
  float* first = first_partials + tile * cols;
  float* last = last_partials + tile * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x * kChunk;
  for (int64_t c =
           (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) *
           kChunk;
       c < cols; c += stride) {
    float sum[kChunk] = {};
    int begin = 0;  // the current sub-run's first token in the tile
    for (int base = 0; base < count; base += kRunUnroll) {
      float v[kRunUnroll][kChunk];
#pragma unroll
      for (int u = 0; u < kRunUnroll; ++u) {
        if (base + u < count) {
          LoadChunk(d_out + static_cast<int64_t>(source_rows[base + u]) * cols,
                    c, cols, vec, v[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kRunUnroll; ++u) {
        const int k = base + u;
        if (k >= count) break;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) sum[j] += v[u][j];
        const int32_t id = ids[k + 1];
        if (k + 1 < count && ids[k + 2] == id) continue;  // the sub-run goes on
        if (id >= 0 && id < vocab) {
          if (begin == 0 && ids[0] == id) {
            StoreChunk(first, c, cols, vec, sum);
          } else if (k + 1 == count && ids[count + 1] == id) {
            StoreChunk(last, c, cols, vec, sum);
          } else {
            AddToRow(d_token_table + static_cast<int64_t>(id) * cols, c, cols,
                     vec, sum);
          }
        }
#pragma unroll
        for (int j = 0; j < kChunk; ++j) sum[j] = 0.0f;
        begin = k + 1;
      }
    }
  }
}

// The runs that cross tile ends, each by its first tile (blockIdx.x): the
// run's last_partials [tile] plus first_partials [u] for the tiles u it goes
// on into, in a fixed order, added to its table row once. Other blocks return
// after reading three ids. threadIdx.x: columns (whole warps, kChunk columns
// each); threadIdx.y: kSpanGroups groups, group g summing tiles tile + 1 + g,
// + kSpanGroups, ... in increasing order, so that a run of thousands of
// tokens is a short chain per thread; the group sums are then added in group
// order.
constexpr int kSpanGroups = 8;
__global__ void __launch_bounds__(kMaxColumnThreads* kSpanGroups)
    SpanningRunSumsKernel(const int32_t* __restrict__ sorted_ids, int64_t rows,
                          int64_t cols, int64_t vocab,
                          const float* __restrict__ first_partials,
                          const float* __restrict__ last_partials,
                          float* __restrict__ d_token_table, bool vec) {
  __shared__ float group_sums[kSpanGroups - 1][kMaxColumnThreads][kChunk];
  const int64_t tile = blockIdx.x;
  const int64_t start = tile * kTile;
  const int64_t end = start + kTile < rows ? start + kTile : rows;
  if (end >= rows) return;
  const int32_t id = sorted_ids[end - 1];
  if (sorted_ids[end] != id) return;  // no run crosses this tile's end
  // The whole tile continues a run from before: an earlier tile owns it.
  if (start > 0 && sorted_ids[start] == id && sorted_ids[start - 1] == id) {
    return;
  }
  if (id < 0 || id >= vocab) return;
  // The run's last tile: the first tile after this one whose end it does not
  // cross. Ids are sorted, so tile u is crossed iff the first id after it is
  // still `id`; each warp probes 32 tiles at once.
  const int lane = threadIdx.x % kWarpSize;
  int64_t last_tile = tile + 1;
  for (;;) {
    const int64_t after = (last_tile + lane + 1) * kTile;
    const bool crossed = after < rows && sorted_ids[after] == id;
    const unsigned crossed_mask = __ballot_sync(kFullMask, crossed);
    if (crossed_mask != kFullMask) {
      last_tile += __ffs(~crossed_mask) - 1;
      break;
    }
    last_tile += kWarpSize;
  }
  const int group = threadIdx.y;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x * kChunk;
  for (int64_t c0 = static_cast<int64_t>(blockIdx.y) * blockDim.x * kChunk;
       c0 < cols; c0 += stride) {
    const int64_t c = c0 + static_cast<int64_t>(threadIdx.x) * kChunk;
    float sum[kChunk] = {};
    if (c < cols) {
      constexpr int kUnroll = 4;
      for (int64_t u = tile + 1 + group; u <= last_tile;
           u += kUnroll * kSpanGroups) {
        float v[kUnroll][kChunk];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          if (u + k * kSpanGroups <= last_tile) {
            LoadChunk(first_partials + (u + k * kSpanGroups) * cols, c, cols,
                      vec, v[k]);
          }
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          if (u + k * kSpanGroups > last_tile) break;
#pragma unroll
          for (int j = 0; j < kChunk; ++j) sum[j] += v[k][j];
        }
      }
    }
    if (group > 0) {
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        group_sums[group - 1][threadIdx.x][j] = sum[j];
      }
    }
    __syncthreads();
    if (group == 0 && c < cols) {
      float total[kChunk];
      LoadChunk(last_partials + tile * cols, c, cols, vec, total);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) total[j] += sum[j];
      for (int g = 0; g < kSpanGroups - 1; ++g) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          total[j] += group_sums[g][threadIdx.x][j];
        }
      }
      AddToRow(d_token_table + static_cast<int64_t>(id) * cols, c, cols, vec,
               total);
    }
    __syncthreads();  // group_sums is reused by the next column slice
  }
}

// d_out [batch, seq * cols] summed over the batch, in order, then added to
// d_position_table [seq * cols, ...]: element i of a sequence's slab is
// position i / cols, column i % cols. `vec`: seq * cols % kChunk == 0 and both
// tensors 16-byte aligned.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    PositionGradKernel(const T* __restrict__ d_out, int64_t batch, int64_t slab,
                       float* __restrict__ d_position_table, bool vec) {
  const int64_t i = ThreadChunk();
  if (i >= slab) return;
  float sum[kChunk] = {};
#pragma unroll 4
  for (int64_t b = 0; b < batch; ++b) {
    float v[kChunk];
    LoadChunk(d_out + b * slab, i, slab, vec, v);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) sum[k] += v[k];
  }
  float old[kChunk];
  LoadChunk(d_position_table, i, slab, vec, old);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) old[k] += sum[k];
  StoreChunk(d_position_table, i, slab, vec, old);
}

template <typename T>
cudaError_t Forward(const int32_t* ids, const void* token_table,
                    const void* position_table, int64_t rows, int64_t cols,
                    int64_t seq, void* out, cudaStream_t stream) {
  const bool vec = cols % kChunk == 0 && Aligned16(token_table) &&
                   (position_table == nullptr || Aligned16(position_table)) &&
                   Aligned16(out);
  ForwardKernel<<<ChunkBlocks(rows * cols, kThreads), kThreads, 0, stream>>>(
      ids, static_cast<const T*>(token_table),
      static_cast<const T*>(position_table), rows, cols, seq,
      static_cast<T*>(out), vec);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Backward(const int32_t* ids, const void* d_out, int64_t rows,
                     int64_t cols, int64_t seq, int64_t vocab,
                     float* d_token_table, float* d_position_table,
                     void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  BackwardLayout layout;
  cudaError_t error = PlanBackward(rows, cols, vocab, &layout);
  if (error != cudaSuccess) return error;
  if (workspace_bytes < layout.total) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(workspace);
  int32_t* sorted_ids = reinterpret_cast<int32_t*>(base + layout.sorted_ids);
  int32_t* row_order = reinterpret_cast<int32_t*>(base + layout.row_order);
  int32_t* sorted_rows = reinterpret_cast<int32_t*>(base + layout.sorted_rows);
  float* first_partials =
      reinterpret_cast<float*>(base + layout.first_partials);
  float* last_partials = reinterpret_cast<float*>(base + layout.last_partials);

  RowOrderKernel<<<static_cast<unsigned>(CeilDiv<int64_t>(rows, kThreads)),
                   kThreads, 0, stream>>>(static_cast<int32_t>(rows),
                                          row_order);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  // Stable: equal ids keep their rows in increasing order. Valid ids are
  // non-negative, so as unsigned keys their order is the same.
  size_t sort_temp_bytes = layout.sort_temp_bytes;
  error = cub::DeviceRadixSort::SortPairs(
      base + layout.sort_temp, sort_temp_bytes,
      reinterpret_cast<const uint32_t*>(ids),
      reinterpret_cast<uint32_t*>(sorted_ids), row_order, sorted_rows,
      static_cast<int>(rows), 0, KeyBits(vocab), stream);
  if (error != cudaSuccess) return error;

  const T* grad = static_cast<const T*>(d_out);
  const bool vec =
      cols % kChunk == 0 && Aligned16(d_out) && Aligned16(d_token_table);
  const int threads = ColumnThreads(cols);
  const dim3 grid(static_cast<unsigned>(CeilDiv<int64_t>(rows, kTile)),
                  static_cast<unsigned>(std::min<int64_t>(
                      CeilDiv<int64_t>(CeilDiv<int64_t>(cols, kChunk), threads),
                      kMaxColumnSlices)));
  TileRunSumsKernel<<<grid, threads, 0, stream>>>(
      sorted_ids, sorted_rows, grad, rows, cols, vocab, d_token_table,
      first_partials, last_partials, vec);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  SpanningRunSumsKernel<<<grid, dim3(threads, kSpanGroups), 0, stream>>>(
      sorted_ids, rows, cols, vocab, first_partials, last_partials,
      d_token_table, vec);
  error = cudaGetLastError();
  if (error != cudaSuccess || d_position_table == nullptr) return error;

  const int64_t slab = seq * cols;
  const bool slab_vec =
      slab % kChunk == 0 && Aligned16(d_out) && Aligned16(d_position_table);
  PositionGradKernel<<<ChunkBlocks(slab, kThreads), kThreads, 0, stream>>>(
      grad, rows / seq, slab, d_position_table, slab_vec);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCountInvalidIds(const int32_t* ids, int64_t rows,
                                  int64_t vocab, int32_t* invalid,
                                  cudaStream_t stream) {
  cudaError_t error = cudaMemsetAsync(invalid, 0, sizeof(int32_t), stream);
  if (error != cudaSuccess || rows == 0) return error;
  // A grid-stride loop: a few hundred blocks read any number of ids.
  const int64_t blocks =
      std::min<int64_t>(CeilDiv<int64_t>(rows, kThreads), 512);
  CountInvalidKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      ids, rows, vocab, invalid);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(const int32_t* ids, const void* token_table,
                                   const void* position_table, int64_t rows,
                                   int64_t cols, int64_t seq, bool bf16,
                                   void* out, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  return bf16 ? Forward<__nv_bfloat16>(ids, token_table, position_table, rows,
                                       cols, seq, out, stream)
              : Forward<float>(ids, token_table, position_table, rows, cols,
                               seq, out, stream);
}

cudaError_t EmbeddingBackwardWorkspaceBytes(int64_t rows, int64_t cols,
                                            int64_t vocab, size_t* bytes) {
  *bytes = 0;
  if (rows * cols == 0) return cudaSuccess;
  BackwardLayout layout;
  const cudaError_t error = PlanBackward(rows, cols, vocab, &layout);
  if (error == cudaSuccess) *bytes = layout.total;
  return error;
}

cudaError_t LaunchEmbeddingBackward(const int32_t* ids, const void* d_out,
                                    int64_t rows, int64_t cols, int64_t seq,
                                    int64_t vocab, bool bf16,
                                    float* d_token_table,
                                    float* d_position_table, void* workspace,
                                    size_t workspace_bytes,
                                    cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  return bf16 ? Backward<__nv_bfloat16>(ids, d_out, rows, cols, seq, vocab,
                                        d_token_table, d_position_table,
                                        workspace, workspace_bytes, stream)
              : Backward<float>(ids, d_out, rows, cols, seq, vocab,
                                d_token_table, d_position_table, workspace,
                                workspace_bytes, stream);
}

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt
