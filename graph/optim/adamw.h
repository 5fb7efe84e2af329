// AdamW over all parameters of a model at once: the global gradient norm, the
// clip scale taken from it, and one fused pass of decoupled weight decay, Adam
// moments with bias correction, the update of the fp32 master weights and the
// rewrite of their compute copy; on the CPU (float or double) or a CUDA GPU.
//
// Every parameter of a model lives in one flat buffer, the weight-decayed ones
// first: elements [0, decay_count) get decoupled weight decay, the rest (norms,
// biases, embeddings) do not. Gradients and both moments are flat buffers of
// the same length and dtype.
//
//   lossrt::optim::AdamWState state{params, grads, m, v, compute_copy,
//                                   decay_count};
//   RETURN_IF_ERROR(context->ReserveWorkspace(
//       lossrt::optim::AdamWWorkspaceBytes(context->device(), n)));
//   RETURN_IF_ERROR(lossrt::optim::AdamWStep(*context, state, options, lr,
//                                            step, norm));  // norm: [] f32
//
// The step, for every element i (g the gradient, p the master weight, t the
// 1-based step, PyTorch's torch.optim.AdamW formulation):
//   norm  = sqrt(sum_i g_i^2)                       (before clipping)
//   scale = max_grad_norm > 0 ? min(1, max_grad_norm / (norm + 1e-6)) : 1
//   g     = scale * g
//   m     = beta1 * m + (1 - beta1) * g
//   v     = beta2 * v + (1 - beta2) * g^2
//   p     = p * (1 - lr * weight_decay)             (only i < decay_count)
//   p     = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   copy  = p rounded to the compute copy's dtype
// The gradients are only read (the trainer zeroes them). A non-finite gradient
// makes the norm non-finite; the update then goes on as PyTorch's does (the
// caller reads `norm` to skip or stop), so check it before trusting the step.
//
// The norm's sum of squares is accumulated in double in a fixed order on both
// backends (two stages on the GPU: per-block partial sums in the context's
// workspace, then one block), so it is bitwise reproducible run to run and the
// CPU and GPU agree to fp32 rounding. The update spells out the same float
// operations on both (no FMA contraction), so from the same f32 state and norm
// the CPU and GPU give the same bits. The GPU step never waits for the host:
// the update kernel reads the norm from device memory.
//
// Dtypes: params, grads, m and v f32 (f64 also allowed on the CPU); the
// compute copy an activation dtype of the device (f32 or f64 on the CPU, f32 or
// bf16 on a GPU); norm [] (or [1]) f32 (f32 or f64 for f64 gradients). All
// flat, contiguous, on the context's device, at most 2^31 - 1 elements, and no
// two of them overlapping. Bad arguments give InvalidArgument and write
// nothing.
#ifndef LOSSRT_GRAPH_OPTIM_ADAMW_H_
#define LOSSRT_GRAPH_OPTIM_ADAMW_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace optim {

struct AdamWOptions {
  float beta1 = 0.9f;          // in [0, 1)
  float beta2 = 0.95f;         // in [0, 1)
  float eps = 1e-8f;           // > 0
  float weight_decay = 0.1f;   // >= 0, applied to params [0, decay_count)
  float max_grad_norm = 1.0f;  // <= 0: no clipping
};

struct AdamWState {
  Tensor params;  // [n] f32 master weights (f64 allowed on the CPU)
  Tensor grads;   // [n] same dtype as params; read only
  Tensor m, v;    // [n] same dtype as params; Adam's first and second moments
  // [n] bf16 or f32 on a GPU (f32 or f64 on the CPU); rewritten from the
  // updated params.
  std::optional<Tensor> compute_copy;
  int64_t decay_count = 0;  // params [0, decay_count) are decayed
};

// One AdamW step (see above) with learning rate `lr` (finite, >= 0) at `step`
// (1-based, for the bias corrections). Writes the gradient norm before
// clipping to `norm`, then updates params, m, v and the compute copy.
absl::Status AdamWStep(Context& context, const AdamWState& state,
                       const AdamWOptions& options, float lr, int64_t step,
                       const Tensor& norm);

// Scratch bytes AdamWStep and GradientNorm take from the context's workspace
// for `n` elements on `device` (0 on the CPU); reserve them with
// Context::ReserveWorkspace to keep allocation out of the training loop.
int64_t AdamWWorkspaceBytes(const Device& device, int64_t n);

// The L2 norm of all elements of `grads` (any shape, contiguous) into `norm`,
// with the same reduction as AdamWStep.
absl::Status GradientNorm(Context& context, const Tensor& grads,
                          const Tensor& norm);

// The sum of the squares of all elements of `grads` (any shape, contiguous)
// into `sum_squares` ([] or [1] f64), accumulated in double as the norm of
// AdamWStep and GradientNorm is before their square root: one shard's part of
// the squared norm of a gradient split over ranks (sum the parts over the
// ranks, e.g. with an all-reduce, and pass the total to
// AdamWStepWithSumOfSquares).
absl::Status GradientSumOfSquares(Context& context, const Tensor& grads,
                                  const Tensor& sum_squares);

// AdamWStep on one shard of the parameters (ZeRO-1: each rank updates its
// part with its part of the moments) whose clipping uses the norm of the whole
// gradient, given as its sum of squares `sum_squares` ([] or [1] f64 on the
// context's device, e.g. the sum of every shard's GradientSumOfSquares):
// writes norm = sqrt(sum_squares) (as AdamWStep writes it), then updates
// params, m, v and the compute copy of the shard as AdamWStep does. The shard
// may be empty (n = 0): then only the norm is written.
absl::Status AdamWStepWithSumOfSquares(Context& context,
                                       const AdamWState& state,
                                       const AdamWOptions& options, float lr,
                                       int64_t step, const Tensor& sum_squares,
                                       const Tensor& norm);

}  // namespace optim
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPTIM_ADAMW_H_
