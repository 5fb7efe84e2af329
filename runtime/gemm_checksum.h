// A bitwise checksum of a GEMM output, with which GemmRunner's tuning checks
// that a candidate algorithm writes exactly what the heuristic's first choice
// writes. Internal.
#ifndef LOSSRT_RUNTIME_GEMM_CHECKSUM_H_
#define LOSSRT_RUNTIME_GEMM_CHECKSUM_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace lossrt {

// *sum = a position-weighted sum (mod 2^64) of the 16-bit words of `columns`
// columns of `column_bytes` bytes each (even), `ld_bytes` apart, starting at
// `data`. Integer atomics only: the same bits always give the same sum.
cudaError_t LaunchGemmChecksum(const void* data, int64_t column_bytes,
                               int64_t columns, int64_t ld_bytes,
                               unsigned long long* sum, cudaStream_t stream);

// The sum LaunchGemmChecksum gives for `columns` columns of `column_bytes`
// zero bytes each (computed on the host): an output that says nothing about
// the order of its sums.
unsigned long long GemmChecksumOfZeros(int64_t column_bytes, int64_t columns);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_GEMM_CHECKSUM_H_
