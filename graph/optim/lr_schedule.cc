// Linear warmup and cosine decay of the learning rate.
#include "graph/optim/lr_schedule.h"

#include <cmath>

#include "runtime/status.h"

namespace lossrt {
namespace optim {

float LearningRate(const LrSchedule& schedule, int64_t step) {
  const double max_lr = schedule.max_lr, min_lr = schedule.min_lr;
  const int64_t t = step < 1 ? 1 : step;
  if (t <= schedule.warmup_steps) {
    return static_cast<float>(max_lr * static_cast<double>(t) /
                              static_cast<double>(schedule.warmup_steps));
  }
  if (t > schedule.total_steps) return schedule.min_lr;
  const double progress =
      static_cast<double>(t - schedule.warmup_steps) /
      static_cast<double>(schedule.total_steps - schedule.warmup_steps);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(min_lr + (max_lr - min_lr) * cosine);
}

absl::Status ValidateLrSchedule(const LrSchedule& schedule) {
  if (!(schedule.max_lr > 0.0f) || !std::isfinite(schedule.max_lr)) {
    return InvalidArgument("LrSchedule: max_lr must be finite and > 0, got ",
                           schedule.max_lr);
  }
  if (!(schedule.min_lr >= 0.0f && schedule.min_lr <= schedule.max_lr)) {
    return InvalidArgument("LrSchedule: min_lr must be in [0, max_lr = ",
                           schedule.max_lr, "], got ", schedule.min_lr);
  }
  if (schedule.total_steps < 1) {
    return InvalidArgument("LrSchedule: total_steps must be >= 1, got ",
                           schedule.total_steps);
  }
  if (schedule.warmup_steps < 0 ||
      schedule.warmup_steps > schedule.total_steps) {
    return InvalidArgument("LrSchedule: warmup_steps must be in [0, ",
                           "total_steps = ", schedule.total_steps, "], got ",
                           schedule.warmup_steps);
  }
  return absl::OkStatus();
}

}  // namespace optim
}  // namespace lossrt
