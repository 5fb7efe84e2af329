// A plain double-precision reference of the cross-entropy op
// (loss/cross_entropy.h), for tests: simple loops, no vectorization, no
// cleverness beyond expm1 for p_t - 1. It takes the logits as doubles (already
// rounded to the dtype under test) and returns the per-token loss and lse, the
// reduced loss, the gradient of the (grad_loss-weighted) loss, and the extras
// (predicted token, accuracy, entropy, target log-probability).
//
//   lossrt::reference::ReferenceOptions options;
//   options.label_smoothing = 0.1;
//   lossrt::reference::ReferenceResult ref =
//       lossrt::reference::CrossEntropyReference(logits, targets, vocab,
//       options);
//   // ref.loss, ref.lse[i], ref.grad[i * vocab + j]
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_REFERENCE_H_
#define LOSSRT_LOSS_CROSS_ENTROPY_REFERENCE_H_

#include <cstdint>
#include <vector>

namespace lossrt {
namespace reference {

enum class ReferenceReduction { kMean, kSum, kNone };

struct ReferenceOptions {
  int64_t ignore_index = -100;
  ReferenceReduction reduction = ReferenceReduction::kMean;
  double label_smoothing = 0.0;
  double z_loss = 0.0;
  double softcap = 0.0;               // 0 = off
  double entropy_weight = 0.0;        // -entropy_weight * H in the loss
  std::vector<double> class_weights;  // [vocab], or empty for none
};

struct ReferenceResult {
  // Per token: the unscaled loss (0 when ignored, NaN for a target out of
  // range) and the log-sum-exp of the (soft-capped) logits, for every token.
  std::vector<double> token_loss;  // [tokens]
  std::vector<double> lse;         // [tokens]
  // [tokens] max_j z_j (lse = max_logit + log sum_j exp(z_j - max_logit)).
  std::vector<double> max_logit;
  // Token i's share of the reduced loss (token_loss divided by the mean's
  // denominators for kMean); `loss` is their sum (for kNone: the plain sum of
  // token_loss).
  std::vector<double> scaled_loss;  // [tokens]
  double loss = 0.0;
  // sum_i g_i * scaled_loss[i]: the function whose gradient `grad` is (g =
  // grad_loss).
  double objective = 0.0;
  double ce_denominator = 0.0;  // sum of w[t] over counted tokens
  double z_denominator = 0.0;   // number of counted tokens
  double weight_total = 0.0;    // sum_j w[j] (vocab without weights)
  // The extras: argmax_j z_ij (lowest index of the max, every token), the
  // entropy H_i and z_t - lse (0 for ignored tokens, NaN for a target out of
  // range), and the weighted accuracy over counted tokens (0 without any).
  std::vector<int64_t> predicted;      // [tokens]
  std::vector<double> entropy;         // [tokens]
  std::vector<double> target_logprob;  // [tokens]
  double accuracy = 0.0;
  // d objective / d logits, when asked for: 0 on ignored rows, NaN on rows
  // whose target is out of range.
  std::vector<double> grad;  // [tokens, vocab]
  // The part of grad proportional to p_ij = softmax(z_i)_j (the rest is the
  // one-hot and smoothing constants): an error e in z_ij moves grad[i, j] by
  // about e times this.
  std::vector<double> grad_softmax_part;  // [tokens, vocab]
};

// logits: [tokens, vocab] row-major; targets: [tokens]. grad_loss: empty (1),
// one value, or one per token. saved_lse: empty, or [tokens] lse values to
// build the gradient from instead of the exact ones (as CrossEntropyBackward
// does from the saved f32 lse).
ReferenceResult CrossEntropyReference(
    const std::vector<double>& logits, const std::vector<int64_t>& targets,
    int64_t vocab, const ReferenceOptions& options,
    const std::vector<double>& grad_loss = {}, bool with_grad = true,
    const std::vector<double>& saved_lse = {});

}  // namespace reference
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_REFERENCE_H_
