// Launch overrides of the cross-entropy kernels, for the benchmark's sweep of
// launch variants only: production code calls LaunchRows and LaunchBackward
// (loss/cross_entropy_cuda.h), which choose everything themselves. Internal to
// //loss and //bench.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_TUNING_H_
#define LOSSRT_LOSS_CROSS_ENTROPY_TUNING_H_

#include <cuda_runtime.h>

#include "loss/cross_entropy_kernels.h"

namespace lossrt {
namespace ce {

// Which row kernel runs.
enum class KernelChoice : int {
  kAuto = 0,
  // Fused: the register/cluster kernel without the next-row variant;
  // backward: the streaming kernel.
  kCluster = 1,
  kPipelined = 2,  // backward: the cp.async pipelined kernel
};

// Every field's 0 means "the automatic choice".
struct LaunchTuning {
  KernelChoice kernel = KernelChoice::kAuto;
  int stages = 0;         // rows in shared memory a block (pipelined backward)
  int blocks_per_sm = 0;  // cap on resident blocks a SM (forward)
  int warps_per_row = 0;  // warps sharing a row: 1, 2, 4 or 8 (forward)
  int fast_sum = 0;       // the forward's fast exponential sum: 1 off, 2 on
  int l2_prefetch = 0;    // fused: L2 prefetch of the next row, -1 off, 1 on
};

// LaunchRows and LaunchBackward with overrides.
cudaError_t LaunchRowsTuned(const RowArgs& args, const LaunchTuning& tuning,
                            int num_sms, cudaStream_t stream);
cudaError_t LaunchBackwardTuned(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream);

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_TUNING_H_
