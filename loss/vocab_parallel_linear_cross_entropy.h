// Vocabulary-parallel linear cross-entropy: the linear cross-entropy of
// loss/linear_cross_entropy.h with the head's weight split by vocabulary rows
// over the ranks of a Communicator. Rank r holds rows [vocab_offset_r,
// vocab_offset_r + V_r) of the [V, H] weight (and the same slice of the bias
// and of the class weights); hidden and targets are the same on every rank.
// Each rank computes its own logits a token chunk at a time and the ranks
// combine only per-token statistics (the row max, then the sums of
// exponentials, the target's logit from the rank that owns it, the smoothing
// and entropy sums) with all-reduces; d_weight and d_bias stay local and the
// d_hidden partial sums are all-reduced.
//
// clang-format off
//   // Rank r of P, weight_r = rows [r * V / P, (r + 1) * V / P) of the head.
//   lossrt::VocabShard shard{&communicator, /*vocab_offset=*/r * V / P, V};
//   RETURN_IF_ERROR(lossrt::VocabParallelLinearCrossEntropyForwardBackward(
//       *context, shard, {hidden, weight_r, std::nullopt, targets}, options,
//       loss, /*lse=*/nullptr, {d_hidden, d_weight_r, std::nullopt}));
// clang-format on
//
// Results: the loss, lse and d_hidden of every rank, and the concatenation of
// the ranks' d_weight and d_bias, equal those of
// LinearCrossEntropyForwardBackward on the full weight to fp32 rounding (the
// sums over the vocabulary are taken in another order). Bitwise the same run
// to run for the same shapes, split, options and communicator backend.
//
// Tensors: as loss/linear_cross_entropy.h, with V_r in place of V for weight,
// bias, class_weights, d_weight and d_bias. The ranks' slices must be
// contiguous in rank order (rank 0 at offset 0, rank r + 1 starting where rank
// r ends, the last ending at shard.vocab), each of at least one row. The
// split, N, H, V, the cross-entropy options (whether class weights are given,
// not their values) and the targets (a hash) are checked across the ranks at
// every call.
//
// Options: every CrossEntropyOptions field works (ignore_index, reductions,
// label_smoothing, z_loss, softcap, entropy_weight, class_weights,
// validate_targets), with the single-device op's restrictions
// (entropy_weight != 0 is refused by the split backward). The schedule is
// always token chunks (kTwoPass and kVocabSlices are refused); chunks of tokens
// are as large as max_workspace_bytes allows on the rank with the largest
// slice. A 16-bit d_weight or d_bias is always summed over the chunks in an
// fp32 accumulator (fp32_gradient_accumulation = false is not offered: it is
// refused), and neither is operand_dtype_logits. The extras
// (CrossEntropyExtras) are not offered.
//
// Errors: InvalidArgument with nothing written. Every rank takes part in one
// exchange of a validity flag (an all-gather) before anything is written, so a
// rank whose input is bad does not leave the others waiting in a collective:
// that rank gets its own message, the others an InvalidArgument naming it.
// A null communicator is refused before any collective (only that rank can
// know). Communicator failures (a rank that never arrives) come back as the
// communicator's error.
//
// Devices: the CPU (Eigen, every collective on the CPU communicator) and CUDA
// (the chunk's logits and the gradient GEMMs through the context's cuBLASLt
// runner and workspace, which the budget does not count; the row statistics
// and dlogits by kernels of this op; every collective queued on the context's
// stream, e.g. NcclCommunicator). On CUDA the targets and class weights are
// checked on the device and the verdict travels with the validity record,
// whose all-gather is read back to the host: one wait for the stream per
// call, none per chunk. The rest of the call is stream-ordered and allocates
// only from the context's allocator cache.
#ifndef LOSSRT_LOSS_VOCAB_PARALLEL_LINEAR_CROSS_ENTROPY_H_
#define LOSSRT_LOSS_VOCAB_PARALLEL_LINEAR_CROSS_ENTROPY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "loss/linear_cross_entropy.h"
#include "loss/vocab_parallel_cross_entropy.h"  // VocabShard
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {

// Loss only, and the per-token lse (of the whole vocabulary) when given.
absl::Status VocabParallelLinearCrossEntropyForward(
    Context& context, const VocabShard& shard,
    const LinearCrossEntropyInputs& inputs,
    const LinearCrossEntropyOptions& options, const Tensor& loss,
    const Tensor* lse = nullptr);

// Loss (and lse if given) and the gradients: d_hidden [N, H] on every rank,
// this rank's d_weight [V_r, H] and d_bias [V_r].
absl::Status VocabParallelLinearCrossEntropyForwardBackward(
    Context& context, const VocabShard& shard,
    const LinearCrossEntropyInputs& inputs,
    const LinearCrossEntropyOptions& options, const Tensor& loss,
    const Tensor* lse, const LinearCrossEntropyGradients& gradients,
    const Tensor* grad_loss = nullptr);

// The split backward from the lse saved by the forward (the same on every
// rank) and the incoming gradient of the loss.
absl::Status VocabParallelLinearCrossEntropyBackward(
    Context& context, const VocabShard& shard,
    const LinearCrossEntropyInputs& inputs, const Tensor& lse,
    const Tensor& grad_loss, const LinearCrossEntropyOptions& options,
    const LinearCrossEntropyGradients& gradients);

}  // namespace lossrt

#endif  // LOSSRT_LOSS_VOCAB_PARALLEL_LINEAR_CROSS_ENTROPY_H_
