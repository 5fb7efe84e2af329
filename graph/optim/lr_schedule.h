// The learning-rate schedule of the trainer: linear warmup, then cosine decay
// to a floor.
//
//   lossrt::optim::LrSchedule schedule{6e-4f, 6e-5f, /*warmup_steps=*/700,
//                                      /*total_steps=*/19073};
//   RETURN_IF_ERROR(lossrt::optim::ValidateLrSchedule(schedule));
//   const float lr = lossrt::optim::LearningRate(schedule, step);  // 1-based
//
// For a 1-based step t, with W = warmup_steps and T = total_steps:
//   t <= W:      max_lr * t / W            (max_lr / W at step 1, max_lr at W)
//   W < t <= T:  min_lr + (max_lr - min_lr) * (1 + cos(pi * (t - W) / (T - W)))
//   / 2 t > T:       min_lr
// Steps before 1 are taken as step 1. W = 0 means no warmup.
#ifndef LOSSRT_GRAPH_OPTIM_LR_SCHEDULE_H_
#define LOSSRT_GRAPH_OPTIM_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace lossrt {
namespace optim {

struct LrSchedule {
  float max_lr = 0.0f;       // finite, > 0
  float min_lr = 0.0f;       // finite, in [0, max_lr]
  int64_t warmup_steps = 0;  // in [0, total_steps]
  int64_t total_steps = 0;   // >= 1
};

// The learning rate at 1-based `step` (see above). Computed in double.
float LearningRate(const LrSchedule& schedule, int64_t step);

// OK when the schedule's fields are in the ranges above, else an
// InvalidArgument naming the field.
absl::Status ValidateLrSchedule(const LrSchedule& schedule);

}  // namespace optim
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPTIM_LR_SCHEDULE_H_
