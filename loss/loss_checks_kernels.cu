// The loss checks' one kernel: a target scan's deferred verdict added to the
// context's count (loss_checks_cuda.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "loss/cross_entropy_kernels.h"
#include "loss/loss_checks_cuda.h"

namespace lossrt {
namespace ce {
namespace {

// One thread: kernels on one stream run in order, so the read-modify-write of
// `count` needs no atomic.
__global__ void AddDeferredErrorsKernel(const TargetStats* stats,
                                        bool count_invalid,
                                        bool count_negative_weights,
                                        int64_t* count) {
  int64_t bad = 0;
  if (count_invalid) bad += stats->invalid;
  if (count_negative_weights) bad += stats->negative_weights;
  if (bad != 0) *count += bad;
}

}  // namespace

cudaError_t LaunchAddDeferredErrors(const TargetStats* stats,
                                    bool count_invalid,
                                    bool count_negative_weights, int64_t* count,
                                    cudaStream_t stream) {
  AddDeferredErrorsKernel<<<1, 1, 0, stream>>>(stats, count_invalid,
                                               count_negative_weights, count);
  return cudaGetLastError();
}

}  // namespace ce
}  // namespace lossrt
