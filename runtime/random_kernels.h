// Element formulas shared by the CPU and CUDA random fills. Internal.
#ifndef LOSSRT_RUNTIME_RANDOM_KERNELS_H_
#define LOSSRT_RUNTIME_RANDOM_KERNELS_H_

#include <cmath>
#include <cstdint>

#include "runtime/philox.h"

namespace lossrt {

enum class RandomKind { kUniform, kNormal, kInt };

struct RandomParams {
  RandomKind kind;
  uint64_t seed;
  double a;  // uniform: low;  normal: mean;   int: low
  double b;  // uniform: high; normal: stddev; int: high
  // Uniform only: the largest value of the tensor's dtype below b. A draw that
  // rounds to b or above in the dtype (near b, rounding to float or a 16-bit
  // type may go up) becomes it.
  double below_b = 0.0;
};

// The value of element `index`, in double: ints are exact, floats are rounded
// by the caller.
LOSSRT_HOST_DEVICE double RandomValue(const RandomParams& params,
                                      uint64_t index) {
  const Philox4 r = Philox4x32(index, params.seed);
  switch (params.kind) {
    case RandomKind::kUniform:
      return params.a + (params.b - params.a) * UniformFromBits(r.v[0]);
    case RandomKind::kNormal: {
      const double u1 = UniformFromBits(r.v[0]);
      const double u2 = UniformFromBits(r.v[1]);
      return params.a +
             params.b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    }
    case RandomKind::kInt:
      return static_cast<double>(
          static_cast<int64_t>(params.a) +
          IntFromBits(r.v[0], static_cast<uint64_t>(params.b - params.a)));
  }
  return 0.0;
}

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_RANDOM_KERNELS_H_
