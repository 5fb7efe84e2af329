// The CPU backend of the cross-entropy kernels (Eigen, fp32 arithmetic as on
// the GPU). Same contracts as the CUDA launchers in cross_entropy_cuda.h, on
// host memory. Internal.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_CPU_H_
#define LOSSRT_LOSS_CROSS_ENTROPY_CPU_H_

#include <cstdint>

#include "loss/cross_entropy_kernels.h"

namespace lossrt {
namespace ce {

TargetStats ScanTargetsCpu(const void* targets, bool targets_i64, int64_t rows,
                           int64_t vocab, int64_t ignore_index,
                           const float* class_weights);

// Forward (args.grad == null) or fused forward+backward; args.stats is host
// memory.
void RowsCpu(const RowArgs& args);

// Backward from a saved lse (args.lse is an input; row_loss is not written).
// With entropy_weight != 0 the rows' entropy comes from args.entropy (an input
// here) when given, else from the rows themselves.
void BackwardCpu(const RowArgs& args);

// Sum of row_loss in double, in order.
double SumRowsCpu(const float* row_loss, int64_t rows);

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_CPU_H_
