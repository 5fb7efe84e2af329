// CUDA launchers of the linear layer's own kernels (the GEMMs are cuBLASLt's).
#ifndef LOSSRT_GRAPH_OPS_LINEAR_CUDA_H_
#define LOSSRT_GRAPH_OPS_LINEAR_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace lossrt {
namespace ops {

// Row chunks of the column sums: partial sums of each chunk go to scratch
// [ColumnSumChunks(rows), cols] f32 before a second pass adds them up.
int64_t ColumnSumChunks(int64_t rows);

// sums[c] += sum over r of values[r, c] for values [rows, cols] (bf16 when
// `bf16`, else f32), summed in fp32 in a fixed order (deterministic).
cudaError_t LaunchAddColumnSums(const void* values, bool bf16, int64_t rows,
                                int64_t cols, float* scratch, float* sums,
                                cudaStream_t stream);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_LINEAR_CUDA_H_
