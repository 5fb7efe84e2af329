// The double-precision AdamW reference of the optimizer tests, written from
// the textbook formulas (bias-corrected m-hat and v-hat, decoupled decay
// lr * wd * p, PyTorch's clip scale), and a sum of squares accurate far beyond
// the double sums under test: what tests/graph/optim checks AdamW and its
// sharded pieces against.
//
//   lossrt::test::AdamWReference ref{params, m, v};
//   const double norm = ReferenceStep(ref, grads, options, lr, step, decay);
#ifndef LOSSRT_TESTS_GRAPH_OPTIM_ADAMW_REFERENCE_H_
#define LOSSRT_TESTS_GRAPH_OPTIM_ADAMW_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "graph/optim/adamw.h"

namespace lossrt {
namespace test {

struct AdamWReference {
  std::vector<double> params, m, v;
};

// Compensated (Kahan) summation of the squares in long double: accurate far
// beyond the double sums under test, whatever their order.
inline double ReferenceSumOfSquares(const std::vector<double>& grads) {
  long double sum = 0.0L, compensation = 0.0L;
  for (double g : grads) {
    const long double term =
        static_cast<long double>(g) * static_cast<long double>(g) -
        compensation;
    const long double next = sum + term;
    compensation = (next - sum) - term;
    sum = next;
  }
  return static_cast<double>(sum);
}

inline double ReferenceNorm(const std::vector<double>& grads) {
  return std::sqrt(ReferenceSumOfSquares(grads));
}

// One AdamW step in double whose clip scale comes from `norm`.
inline void ReferenceUpdate(AdamWReference& state,
                            const std::vector<double>& grads,
                            const optim::AdamWOptions& options, double lr,
                            int64_t step, int64_t decay_count, double norm) {
  const double max_norm = options.max_grad_norm;
  const double scale =
      max_norm > 0.0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
  const double beta1 = options.beta1, beta2 = options.beta2;
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  for (size_t i = 0; i < grads.size(); ++i) {
    const double g = grads[i] * scale;
    state.m[i] = beta1 * state.m[i] + (1.0 - beta1) * g;
    state.v[i] = beta2 * state.v[i] + (1.0 - beta2) * g * g;
    const double m_hat = state.m[i] / bias1;
    const double v_hat = state.v[i] / bias2;
    double& p = state.params[i];
    if (static_cast<int64_t>(i) < decay_count) {
      p -= lr * options.weight_decay * p;
    }
    p -= lr * m_hat / (std::sqrt(v_hat) + options.eps);
  }
}

// One AdamW step in double clipped with the norm of `grads`; returns that
// norm (before clipping).
inline double ReferenceStep(AdamWReference& state,
                            const std::vector<double>& grads,
                            const optim::AdamWOptions& options, double lr,
                            int64_t step, int64_t decay_count) {
  const double norm = ReferenceNorm(grads);
  ReferenceUpdate(state, grads, options, lr, step, decay_count, norm);
  return norm;
}

}  // namespace test
}  // namespace lossrt

#endif  // LOSSRT_TESTS_GRAPH_OPTIM_ADAMW_REFERENCE_H_
