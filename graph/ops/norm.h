// LayerNorm and RMSNorm over the last dim of activations [rows, C], forward
// and backward, on the CPU (f32, f64) and CUDA (f32, bf16).
//
//   LayerNorm: y = (x - mean) * rstd * gamma + beta,
//              mean = sum(x) / C, rstd = 1 / sqrt(sum((x - mean)^2) / C + eps)
//   RMSNorm:   y = x * rstd * gamma,  rstd = 1 / sqrt(sum(x^2) / C + eps)
//
//   RETURN_IF_ERROR(lossrt::ops::LayerNormForward(*context, x, gamma, &beta,
//                                                 1e-5f, y, mean, rstd));
//
// Shapes and dtypes: x, y, dx, dy [rows, C] and gamma, beta [C] in the
// activation dtype (f32/f64 on the CPU, f32/bf16 on a GPU); mean, rstd [rows]
// and d_gamma, d_beta [C] in the accumulator dtype (f64 for f64 activations,
// f32 otherwise). Forward writes mean and rstd for the backward to read.
// Parameter gradients are accumulated (d_gamma += ...); dx is overwritten
// (accumulate_dx false) or added to (true). Outputs must not overlap inputs
// or each other. Every call checks all of its arguments before it writes
// anything.
//
// Precision: statistics and row reductions in fp32 on the GPU, in double on
// the CPU (for f32 too); rstd is stored, so the backward uses exactly the
// forward's normalization.
//
// GPU: one warp per row, the row held in registers and read and written with
// 16-byte vectors, when C % 8 == 0, C <= 2048 and every tensor is 16-byte
// aligned; otherwise one block per row re-reading the row (slower, same
// results to rounding). d_gamma/d_beta are reduced deterministically in two
// stages, without atomics: each block of the first stage (one wave of the GPU
// at the kernel's occupancy, at most one block per 16 rows) sums its rows'
// contributions in a fixed order into a partial row of the workspace, then a
// second kernel adds the partials, in a fixed order, to d_gamma/d_beta.
// Results are bitwise reproducible run to run on a given GPU model (another
// SM count splits the rows differently, which changes the last bits of the
// parameter gradients).
#ifndef LOSSRT_GRAPH_OPS_NORM_H_
#define LOSSRT_GRAPH_OPS_NORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace ops {

// beta may be null (no shift). eps finite and >= 0.
absl::Status LayerNormForward(Context& context, const Tensor& x,
                              const Tensor& gamma, const Tensor* beta,
                              float eps, const Tensor& y, const Tensor& mean,
                              const Tensor& rstd);

// dx (+)= d loss / dx, d_gamma += sum over rows of dy * xhat, d_beta (if not
// null) += sum over rows of dy, with xhat = (x - mean) * rstd from the saved
// statistics. Uses NormBackwardWorkspaceBytes(...) of context.Workspace.
absl::Status LayerNormBackward(Context& context, const Tensor& x,
                               const Tensor& gamma, const Tensor& mean,
                               const Tensor& rstd, const Tensor& dy,
                               const Tensor& dx, bool accumulate_dx,
                               const Tensor& d_gamma, const Tensor* d_beta);

// eps finite and >= 0.
absl::Status RmsNormForward(Context& context, const Tensor& x,
                            const Tensor& gamma, float eps, const Tensor& y,
                            const Tensor& rstd);

// dx (+)= d loss / dx, d_gamma += sum over rows of dy * x * rstd. Uses
// NormBackwardWorkspaceBytes(...) of context.Workspace.
absl::Status RmsNormBackward(Context& context, const Tensor& x,
                             const Tensor& gamma, const Tensor& rstd,
                             const Tensor& dy, const Tensor& dx,
                             bool accumulate_dx, const Tensor& d_gamma);

// Bytes of context.Workspace the norm backwards take at most for x [rows,
// cols] on `device`, for Context::ReserveWorkspace ahead of the hot path: on a
// GPU 8 * cols * min(ceil(rows / 16), 16 * SMs) (about 1.3 MB per 100 columns
// on an H200 for large rows; 256 SMs are assumed when the count cannot be
// queried), on the CPU 16 * cols.
int64_t NormBackwardWorkspaceBytes(const Device& device, int64_t rows,
                                   int64_t cols);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_NORM_H_
