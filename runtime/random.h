// Filling tensors with counter-based random numbers (Philox4x32-10): element i
// of a tensor filled with seed s is the same on the CPU and the GPU (uniform
// and integer draws bitwise; normal draws to within the device's rounding of
// log and cos). For test data and weights.
//
//   RETURN_IF_ERROR(lossrt::FillNormal(weights, /*seed=*/42, 0.0f, 0.02f,
//   *context));
#ifndef LOSSRT_RUNTIME_RANDOM_H_
#define LOSSRT_RUNTIME_RANDOM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {

// Uniform in [low, high) for f32/bf16/f16/f64 tensors.
absl::Status FillUniform(const Tensor& tensor, uint64_t seed, float low,
                         float high, Context& context);
// Normal(mean, stddev) (Box-Muller) for floating tensors.
absl::Status FillNormal(const Tensor& tensor, uint64_t seed, float mean,
                        float stddev, Context& context);
// Integers uniform in [low, high) for i32/i64 tensors.
absl::Status FillRandomInt(const Tensor& tensor, uint64_t seed, int64_t low,
                           int64_t high, Context& context);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_RANDOM_H_
