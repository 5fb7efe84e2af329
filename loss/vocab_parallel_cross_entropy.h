// Vocabulary-parallel cross-entropy: the cross-entropy of
// loss/cross_entropy.h over logits sharded by vocabulary columns across the
// ranks of a Communicator. Rank r holds columns [vocab_offset_r,
// vocab_offset_r + V_r) of the full [N, V] logits (and the same slice of the
// class weights); the targets (global indices) are the same on every rank.
// The ranks combine only per-token statistics (the row max, then the sums of
// exponentials, the target's logit from the rank that owns it, the smoothing
// and entropy sums) with all-reduces; grad_logits stays local.
//
// clang-format off
//   // Rank r of P, logits_r = columns [r * V / P, (r + 1) * V / P).
//   lossrt::VocabShard shard{&communicator, /*vocab_offset=*/r * V / P, V};
//   RETURN_IF_ERROR(lossrt::VocabParallelCrossEntropyForwardBackward(
//       *context, shard, logits_r, targets, options, loss, &lse,
//       grad_logits_r));
// clang-format on
//
// Results: the loss and lse of every rank, and the concatenation of the ranks'
// grad_logits, equal those of CrossEntropyForwardBackward on the full logits
// to fp32 rounding (the sums over the vocabulary are taken in another order).
// The ranks' loss and lse are the same bytes; every result is the same bytes
// run to run for the same shapes, split, options and communicator backend.
//
// Tensors: as loss/cross_entropy.h with V_r in place of V for logits,
// grad_logits and class_weights: logits f32, bf16 or f16 [N, V_r] (row stride
// >= V_r), N >= 1; targets i64 or i32 [N] in [0, V) or ignore_index; loss f32
// [] (mean, sum) or [N] (none); lse f32 [N]; grad_logits [N, V_r] in the
// logits' dtype, which may be the logits tensor itself (in place); grad_loss
// f32 [] or [N]. The ranks' slices must be contiguous in rank order (rank 0 at
// offset 0, rank r + 1 starting where rank r ends, the last ending at
// shard.vocab), each of at least one column. The split, N, V, the options
// (whether class weights are given, not their values) and the targets (a
// hash) are checked across the ranks at every call.
//
// Options: every CrossEntropyOptions field works (ignore_index, reductions,
// label_smoothing, z_loss, softcap, entropy_weight, class_weights,
// validate_targets). With entropy_weight != 0, the Backward recomputes the
// row statistics (lse and entropy) from the logits, as the single-device op
// recomputes the entropy: one more pass and two more all-reduces; the saved
// lse is then only checked, not read. The extras (CrossEntropyExtras) are not
// offered.
//
// Errors: InvalidArgument with nothing written. Every rank takes part in one
// exchange of a validity record (an all-gather) before anything is written, so
// a rank whose input is bad does not leave the others waiting in a collective:
// that rank gets its own message, the others an InvalidArgument naming it. A
// null communicator is refused before any collective (only that rank can
// know). Communicator failures come back as the communicator's error.
//
// Devices: the CPU (Eigen, every collective on the CPU communicator) and CUDA
// (the row kernels shared with the vocabulary-parallel linear cross-entropy,
// every collective queued on the context's stream, e.g. NcclCommunicator). A
// token chunk at a time (at most kVocabParallelChunkBytes of fp32 logits per
// rank, the same number of rows on every rank), the logits are widened to
// fp32 in a scratch buffer from the context's allocator, the statistics
// exchanged, and the gradient written from the scratch copy (so in place
// works). On CUDA the targets and class weights are checked on the device
// and the verdict travels with the validity record, whose all-gather is read
// back to the host: one wait for the stream per call. Not for CUDA graph
// capture.
#ifndef LOSSRT_LOSS_VOCAB_PARALLEL_CROSS_ENTROPY_H_
#define LOSSRT_LOSS_VOCAB_PARALLEL_CROSS_ENTROPY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "loss/cross_entropy.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {

// This rank's part of the vocabulary.
struct VocabShard {
  Communicator* communicator = nullptr;  // not owned
  int64_t vocab_offset = 0;  // the first vocabulary index this rank holds
  int64_t vocab = 0;         // V, the whole vocabulary
};

// The most bytes of fp32 logits a rank widens at a time (a token chunk).
inline constexpr int64_t kVocabParallelChunkBytes = int64_t{32} << 20;

// Loss, and the per-token lse (of the whole vocabulary) when given.
absl::Status VocabParallelCrossEntropyForward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const CrossEntropyOptions& options,
    const Tensor& loss, const Tensor* lse = nullptr);

// grad_logits [N, V_r] from the logits, the targets, the lse saved by the
// forward (the same on every rank) and the incoming gradient of the loss.
absl::Status VocabParallelCrossEntropyBackward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const Tensor& lse, const Tensor& grad_loss,
    const CrossEntropyOptions& options, const Tensor& grad_logits);

// Loss, lse (optional) and grad_logits in one pass over the logits.
// `grad_loss` (optional) scales the gradient as in the Backward.
absl::Status VocabParallelCrossEntropyForwardBackward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const CrossEntropyOptions& options,
    const Tensor& loss, const Tensor* lse, const Tensor& grad_logits,
    const Tensor* grad_loss = nullptr);

}  // namespace lossrt

#endif  // LOSSRT_LOSS_VOCAB_PARALLEL_CROSS_ENTROPY_H_
