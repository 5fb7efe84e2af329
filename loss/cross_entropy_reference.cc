// The double-precision cross-entropy reference: the definitions of
// loss/cross_entropy.h written out as loops.
#include "loss/cross_entropy_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lossrt {
namespace reference {

ReferenceResult CrossEntropyReference(const std::vector<double>& logits,
                                      const std::vector<int64_t>& targets,
                                      int64_t vocab,
                                      const ReferenceOptions& options,
                                      const std::vector<double>& grad_loss,
                                      bool with_grad,
                                      const std::vector<double>& saved_lse) {
  const int64_t tokens = static_cast<int64_t>(targets.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const double s = options.label_smoothing;
  const double cap = options.softcap;
  const bool weighted = !options.class_weights.empty();
  auto weight = [&](int64_t j) {
    return weighted ? options.class_weights[j] : 1.0;
  };
  auto is_counted = [&](int64_t t) {
    return t != options.ignore_index && t >= 0 && t < vocab;
  };

  ReferenceResult result;
  for (int64_t j = 0; j < vocab; ++j) result.weight_total += weight(j);
  for (int64_t i = 0; i < tokens; ++i) {
    if (!is_counted(targets[i])) continue;
    result.ce_denominator += weight(targets[i]);
    result.z_denominator += 1.0;
  }
  double ce_scale = 1.0, z_scale = 1.0;
  if (options.reduction == ReferenceReduction::kMean) {
    ce_scale = result.ce_denominator > 0 ? 1.0 / result.ce_denominator : 0.0;
    z_scale = result.z_denominator > 0 ? 1.0 / result.z_denominator : 0.0;
  }

  result.token_loss.assign(tokens, 0.0);
  result.lse.assign(tokens, 0.0);
  result.max_logit.assign(tokens, 0.0);
  result.scaled_loss.assign(tokens, 0.0);
  result.predicted.assign(tokens, 0);
  result.entropy.assign(tokens, 0.0);
  result.target_logprob.assign(tokens, 0.0);
  double hits = 0.0;
  if (with_grad) {
    result.grad.assign(tokens * vocab, 0.0);
    result.grad_softmax_part.assign(tokens * vocab, 0.0);
  }
  std::vector<double> z(vocab);  // [vocab] soft-capped logits of one row
  for (int64_t i = 0; i < tokens; ++i) {
    const double* x = logits.data() + i * vocab;  // [vocab]
    for (int64_t j = 0; j < vocab; ++j)
      z[j] = cap > 0 ? cap * std::tanh(x[j] / cap) : x[j];
    double max = -inf;
    for (int64_t j = 0; j < vocab; ++j)
      max = std::fmax(max, z[j]);  // NaN reaches the sum
    double sum = 0.0;
    // sum_j e_j (z_j - max), e_j = exp(z_j - max): H = log S - that / S, a
    // difference of two terms >= 0.
    double centered = 0.0;
    if (max != -inf) {
      for (int64_t j = 0; j < vocab; ++j) {
        const double e = std::exp(z[j] - max);
        sum += e;
        if (e > 0) centered += e * (z[j] - max);
      }
    }
    const double log_sum = std::log(sum);
    const double lse = max + log_sum;
    const double entropy = log_sum - centered / sum;
    result.lse[i] = lse;
    result.max_logit[i] = max;
    result.predicted[i] = std::find(z.begin(), z.end(), max) - z.begin();
    if (result.predicted[i] == vocab) result.predicted[i] = 0;  // NaN row

    const int64_t t = targets[i];
    if (t == options.ignore_index) continue;
    if (!is_counted(t)) {
      result.entropy[i] = result.target_logprob[i] = nan;
      result.token_loss[i] = result.scaled_loss[i] = nan;
      if (with_grad) {
        std::fill_n(result.grad.begin() + i * vocab, vocab, nan);
        std::fill_n(result.grad_softmax_part.begin() + i * vocab, vocab, nan);
      }
      continue;
    }
    // lse - z_t, written so that a near-certain token's loss keeps its digits.
    const double nll = (max - z[t]) + log_sum;
    result.entropy[i] = entropy;
    result.target_logprob[i] = -nll;
    if (result.predicted[i] == t) hits += weight(t);
    double ce = (1.0 - s) * weight(t) * nll;
    if (s > 0) {
      double smooth = 0.0;
      for (int64_t j = 0; j < vocab; ++j)
        smooth += weight(j) * ((max - z[j]) + log_sum);
      ce += s / vocab * smooth;
    }
    double zl = options.z_loss > 0 ? options.z_loss * lse * lse : 0.0;
    // The entropy term is scaled as the z-loss part (by the count).
    zl -= options.entropy_weight * entropy;
    result.token_loss[i] = ce + zl;
    result.scaled_loss[i] = ce * ce_scale + zl * z_scale;
    const double g = grad_loss.empty()       ? 1.0
                     : grad_loss.size() == 1 ? grad_loss[0]
                                             : grad_loss[i];
    result.objective += g * result.scaled_loss[i];

    if (!with_grad) continue;
    // p_j = exp(z_j - lse), as exp((z_j - max) - log_sum): with lse = 1e30 +
    // log 2 the log 2 would be lost in lse itself. From a saved lse, exactly
    // what Backward gets.
    const bool saved = !saved_lse.empty();
    const double shift = saved ? saved_lse[i] : max;
    const double log_part = saved ? 0.0 : log_sum;
    const double lse_g = saved ? saved_lse[i] : lse;
    // d(z_loss * lse^2) / d lse
    const double zl_g = options.z_loss > 0 ? 2.0 * options.z_loss * lse_g : 0.0;
    double* grad = result.grad.data() + i * vocab;  // [vocab]
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp((z[j] - shift) - log_part);
      // d loss / d z_j = (1 - s) w_t (p_j - [j == t]) + s / V (W p_j - w_j) + 2
      // z_loss lse p_j
      const double p_minus_onehot =
          j == t ? std::expm1((z[j] - shift) - log_part) : p;
      // d(-e H) / d z_j = e p_j (z_j - (lse - H)), with the lse the gradient
      // is built from.
      const double ent_g =
          options.entropy_weight != 0 && p > 0
              ? options.entropy_weight * ((z[j] - shift) - log_part + entropy)
              : 0.0;
      double dz =
          ce_scale * ((1.0 - s) * weight(t) * p_minus_onehot +
                      s / vocab * (result.weight_total * p - weight(j))) +
          z_scale * (zl_g + ent_g) * p;
      double dz_softmax =
          (ce_scale *
               ((1.0 - s) * weight(t) + s / vocab * result.weight_total) +
           z_scale *
               (zl_g + std::fabs(ent_g) + std::fabs(options.entropy_weight))) *
          p;
      if (cap > 0) {
        const double th = std::tanh(x[j] / cap);
        dz *= 1.0 - th * th;  // d(cap tanh(x / cap)) / dx
        dz_softmax *= 1.0 - th * th;
      }
      grad[j] = g * dz;
      result.grad_softmax_part[i * vocab + j] = g * dz_softmax;
    }
  }
  for (int64_t i = 0; i < tokens; ++i) result.loss += result.scaled_loss[i];
  result.accuracy =
      result.ce_denominator > 0 ? hits / result.ce_denominator : 0.0;
  return result;
}

}  // namespace reference
}  // namespace lossrt
