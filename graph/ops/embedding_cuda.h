// CUDA launchers of the embedding kernels (graph/ops/embedding_cuda.cu).
// Internal to //graph/ops:embedding. Pointers are device memory; tables and
// activations are f32 (bf16 false) or bf16 (bf16 true), table gradients f32;
// every tensor holds at most 2^31 - 1 elements (checked by the caller). Each
// launcher queues its work on `stream` and returns the first launch error.
#ifndef LOSSRT_GRAPH_OPS_EMBEDDING_CUDA_H_
#define LOSSRT_GRAPH_OPS_EMBEDDING_CUDA_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lossrt {
namespace ops {
namespace cuda {

// *invalid (device memory) = the number of ids [rows] outside [0, vocab).
cudaError_t LaunchCountInvalidIds(const int32_t* ids, int64_t rows,
                                  int64_t vocab, int32_t* invalid,
                                  cudaStream_t stream);

// out [rows, cols] = token_table[ids[r]] + position_table[r % seq] (no
// position term when position_table is null). Ids must be valid.
cudaError_t LaunchEmbeddingForward(const int32_t* ids, const void* token_table,
                                   const void* position_table, int64_t rows,
                                   int64_t cols, int64_t seq, bool bf16,
                                   void* out, cudaStream_t stream);

// Bytes of device scratch LaunchEmbeddingBackward needs for ids [rows] into a
// token table [vocab, cols]: the sorted ids and rows (12 * rows), the partial
// sums of runs that cross tiles (8 * cols * ceil(rows / 32)) and CUB's sort
// temporaries. Asks CUB (for the current device), which queues no work.
cudaError_t EmbeddingBackwardWorkspaceBytes(int64_t rows, int64_t cols,
                                            int64_t vocab, size_t* bytes);

// d_token_table [vocab, cols] += d_out rows at their ids, deterministically
// (the ids sorted, one writer per id adding its rows in row order);
// d_position_table [>= seq, cols] (if not null) row p += sum over b of d_out
// row b * seq + p, in b order. `workspace` holds at least
// EmbeddingBackwardWorkspaceBytes (cudaErrorInvalidValue otherwise). Ids must
// be valid. Allocates nothing and never waits: capturable in a CUDA graph.
cudaError_t LaunchEmbeddingBackward(const int32_t* ids, const void* d_out,
                                    int64_t rows, int64_t cols, int64_t seq,
                                    int64_t vocab, bool bf16,
                                    float* d_token_table,
                                    float* d_position_table, void* workspace,
                                    size_t workspace_bytes,
                                    cudaStream_t stream);

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_EMBEDDING_CUDA_H_
