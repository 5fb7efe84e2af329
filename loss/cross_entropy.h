// Cross-entropy over logits [tokens, vocab] against integer targets: the loss,
// the per-token log-sum-exp, and the gradient with respect to the logits, on
// the CPU (Eigen) or a CUDA GPU.
//
// clang-format off
//   lossrt::CrossEntropyOptions options;  // mean over non-ignored tokens
//   options.label_smoothing = 0.1f;
//   RETURN_IF_ERROR(lossrt::CrossEntropyForwardBackward(
//       *context, logits, targets, options, loss, &lse, grad_logits));
//
// Definitions (PyTorch's, with PaLM's z-loss and Gemma's soft-capping added):
//   z_j    = softcap > 0 ? softcap * tanh(x_j / softcap) : x_j
//   lse    = log sum_j exp(z_j)
//   loss_i = (1 - s) * w[t] * (lse - z_t) + s / V * sum_j w[j] * (lse - z_j)
//            + z_loss * lse^2
// clang-format on
// with s = label_smoothing, w = class weights (all 1 without), t the target and
// V the vocab. Tokens whose target is ignore_index add nothing and count
// nothing. Mean reduction divides the cross-entropy part by the sum of w[t]
// over counted tokens (their number without weights) and the z-loss part by the
// number of counted tokens; with no counted token the loss and every gradient
// are 0.
//
// Extras (CrossEntropyExtras, all optional, computed in the same pass):
// clang-format off
//   predicted_i = argmax_j z_ij (ties: the lowest j), for every token
//   accuracy    = sum_i w[t_i] [predicted_i == t_i] / sum_i w[t_i] over counted
//                 tokens (0 when none is counted)
//   entropy_i   = H_i = -sum_j p_ij log p_ij = lse_i - sum_j p_ij z_ij
//                 (0 for ignored tokens)
//   target_logprob_i = z_t - lse_i (0 for ignored tokens), whatever the
//                 reduction
// clang-format on
// With entropy_weight = e != 0 every counted token's loss gains -e * H_i (the
// mean divides it by the number of counted tokens, as the z-loss part), and
// the gradient gains e * p_j * (z_j - (lse - H)) (times the soft cap's chain
// rule). CrossEntropyBackward from a saved lse needs H too when entropy_weight
// != 0: pass the forward's entropy (CrossEntropyExtras::entropy) as the saved
// entropy, or it recomputes H with one more read of the logits (a forward
// statistics pass). NaN
// logits make the extras of their row unspecified. Cost: on the GPU the extras
// run their own instantiations of the row kernels, over the same single read
// of the logits: an entropy FFMA a logit, and the argmax found once the row's
// max is known (the forward rereads the tile where a lane's max rose; the
// fused pass marks the max's indices as it goes), carried by the row's one
// reduction; a call without extras and entropy_weight = 0 runs the same
// kernels as one before the extras existed. entropy_weight also
// adds a logarithm a logit to the fused pass's gradient (a second exponential
// a logit with the soft cap).
//
// Tensors: logits f32, bf16 or f16 [tokens, vocab] with row stride >= vocab;
// targets i64 or i32 [tokens]; loss f32 [] (mean, sum) or [tokens] (none); lse
// f32 [tokens]; grad_logits [tokens, vocab] in the logits' dtype (it may be the
// logits tensor itself: in place); grad_loss f32 [] or [tokens]. All on the
// context's device. Nothing is written when a call returns an error. Results
// are bitwise reproducible run to run.
//
// Optional tensors (the same convention in loss/linear_cross_entropy.h): an
// optional argument of a call, input or output, is a `const Tensor*`, nullptr
// when not given (the call only borrows it); an optional member of a struct
// (options, inputs, gradients) is a `std::optional<Tensor>`, std::nullopt when
// not given (structs hold their views by value, as callers copy and keep them,
// e.g. a graph node its options). Outputs are written through their views'
// data, so they are passed as `const Tensor&` or `const Tensor*`.
//
// CUDA graphs: the calls may be captured by themselves. Inside a capture of
// the context's stream (cudaStreamIsCapturing) a call checks everything it can
// on the host (shapes, dtypes, devices, options, overlaps) but does not wait
// for the stream: the target scan's verdict is not read back. The captured
// work adds the number of bad values the call would have rejected (targets
// outside [0, vocab) when validate_targets is on, negative or NaN class
// weights) to the context's deferred error count; read it after running the
// graph with Context::TakeDeferredErrorCount. Out-of-range targets then give
// NaN losses (the reduced loss is NaN too), negative class weights are used as
// given, and such a call's gradients mean nothing. A call inside a capture
// fails (FailedPrecondition) rather than grow the context's workspace: reserve
// CrossEntropyWorkspaceBytes before capturing.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_H_
#define LOSSRT_LOSS_CROSS_ENTROPY_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {

enum class Reduction { kMean, kSum, kNone };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  float label_smoothing = 0.0f;  // in [0, 1)
  float z_loss = 0.0f;   // scale of lse^2 (Liger's lse_square_scale); >= 0
  float softcap = 0.0f;  // 0 = off; > 0 caps logits at +-softcap through tanh
  // Entropy regularization: adds -entropy_weight * H to each counted token's
  // loss (finite; 0 = off).
  float entropy_weight = 0.0f;
  std::optional<Tensor> class_weights;  // f32 [vocab], >= 0
  // Check that every target is in [0, vocab) or ignore_index (on the GPU: a
  // flag read back once per call, which waits for the stream; inside a CUDA
  // graph capture, a count added to the context's deferred error count). Off:
  // out-of-range targets give NaN losses.
  bool validate_targets = true;
};

// Optional outputs of the forward passes, each written when given: predicted
// i32 or i64 [tokens], accuracy f32 [] (or [1]), entropy and target_logprob f32
// [tokens]. On the context's device; none may overlap an input or another
// output.
struct CrossEntropyExtras {
  std::optional<Tensor> predicted;       // [tokens] i32 or i64
  std::optional<Tensor> accuracy;        // [] f32
  std::optional<Tensor> entropy;         // [tokens] f32
  std::optional<Tensor> target_logprob;  // [tokens] f32
};

// Loss (and, if `lse` is given, the per-token log-sum-exp to save for the
// backward pass). Reads the logits once; on the GPU, a row where one logit
// holds more than half of the probability is read a second time (mostly from
// L2) for its exact log-sum-exp.
absl::Status CrossEntropyForward(Context& context, const Tensor& logits,
                                 const Tensor& targets,
                                 const CrossEntropyOptions& options,
                                 const Tensor& loss,
                                 const Tensor* lse = nullptr,
                                 const CrossEntropyExtras* extras = nullptr);

// grad_logits from the logits, the targets, the saved lse and the incoming
// gradient of the loss (f32 [] for mean/sum, [tokens] for none). One read of
// the logits, one write. With entropy_weight != 0 the gradient needs each
// row's entropy: `saved_entropy` (optional, f32 [tokens]) is the forward's
// CrossEntropyExtras::entropy of the same logits and options; without it the
// call recomputes the entropy with a second read of the logits. Unused when
// entropy_weight == 0.
absl::Status CrossEntropyBackward(Context& context, const Tensor& logits,
                                  const Tensor& targets, const Tensor& lse,
                                  const Tensor& grad_loss,
                                  const CrossEntropyOptions& options,
                                  const Tensor& grad_logits,
                                  const Tensor* saved_entropy = nullptr);

// Loss, lse (optional) and grad_logits in one pass over the logits. `grad_loss`
// (optional) scales the gradient as in CrossEntropyBackward; without it the
// gradient is that of the loss itself.
absl::Status CrossEntropyForwardBackward(
    Context& context, const Tensor& logits, const Tensor& targets,
    const CrossEntropyOptions& options, const Tensor& loss, const Tensor* lse,
    const Tensor& grad_logits, const Tensor* grad_loss = nullptr,
    const CrossEntropyExtras* extras = nullptr);

// Scratch bytes the calls take from the context's workspace for this shape
// (reserve them with Context::ReserveWorkspace to keep allocation out of the
// hot path).
int64_t CrossEntropyWorkspaceBytes(int64_t tokens, int64_t vocab);

}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_H_
