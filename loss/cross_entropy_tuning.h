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
  // Fused: the register/cluster kernel without the next-row variant.
  kCluster = 1,
};

// Every field's 0 means "the automatic choice".
struct LaunchTuning {
  KernelChoice kernel = KernelChoice::kAuto;
  int blocks_per_sm = 0;  // cap on resident blocks a SM (forward)
  int warps_per_row = 0;  // warps sharing a row: 1, 2, 4 or 8 (forward)
  int fast_sum =
      0;  // the forward's fast exponential sum: 1 off (fp32 only), 2 on
  int l2_prefetch = 0;  // fused: L2 prefetch of the next row, -1 off, 1 on
  // 1: a grid of one row a CTA (or cluster, or warp group), not a persistent
  // grid of what fits on the device at once; -1: the persistent grid where
  // one row (or chunk) a CTA is the default (backward).
  int one_row_per_group = 0;
  // Fused rows split over a cluster: 0 or 1 the mbarrier exchange of the
  // CTAs' partials, -1 a cluster barrier a row.
  int exchange = 0;
};

// LaunchRows and LaunchBackward with overrides.
cudaError_t LaunchRowsTuned(const RowArgs& args, const LaunchTuning& tuning,
                            int num_sms, cudaStream_t stream);
cudaError_t LaunchBackwardTuned(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream);

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_TUNING_H_
