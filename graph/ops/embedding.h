// Token (+ learned position) embedding lookup, forward and backward, on the
// CPU (f32, f64 tables) and CUDA (f32, bf16 tables).
//
//   out[r, :] = token_table[ids[r], :] + position_table[r % seq, :]
//
//   RETURN_IF_ERROR(lossrt::ops::EmbeddingForward(*context, ids, wte, &wpe,
//                                                 seq, x));  // x [B * T, C]
//
// ids are i32 [rows] with rows = batch * seq (row r is position r % seq of its
// sequence). Every call checks all of its arguments, the range of every id
// included, before it writes anything. On a GPU the id check is a small kernel
// whose result (a count of bad ids) is copied back to the host: each call
// waits for the context's stream once (a few microseconds plus whatever work
// was queued before it).
//
// The backward is bitwise reproducible run to run on every device (see
// EmbeddingBackward). On a GPU it sorts the ids in the context's workspace:
// reserve it before the hot path (or a CUDA graph capture).
//
//   RETURN_IF_ERROR(context->ReserveWorkspace(
//       lossrt::ops::EmbeddingBackwardWorkspaceBytes(context->device(), B * T,
//                                                    V, C)));
#ifndef LOSSRT_GRAPH_OPS_EMBEDDING_H_
#define LOSSRT_GRAPH_OPS_EMBEDDING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace ops {

// out [rows, C] = token_table [V, C] rows picked by ids [rows] (i32), plus
// position_table [P, C] row r % seq when position_table is not null (P >=
// seq). rows % seq == 0, seq >= 1. Tables and out share one activation dtype
// (f32/f64 on the CPU, f32/bf16 on a GPU); the sum is formed in f32 (f64 for
// f64) and rounded once. An id outside [0, V) is an InvalidArgument with
// nothing written. out must not overlap the inputs.
//
// `check_ids` false: the caller vouches that every id is in [0, V) (e.g. it
// checked them on the host), so the GPU skips the check and its read-back —
// the call then never waits for the stream (and can be captured in a CUDA
// graph). An id out of range is then undefined behaviour.
absl::Status EmbeddingForward(Context& context, const Tensor& ids,
                              const Tensor& token_table,
                              const Tensor* position_table, int64_t seq,
                              const Tensor& out, bool check_ids = true);

// d_token_table [V, C] += the rows of d_out [rows, C] scattered to their ids;
// d_position_table [P, C] (if not null; P >= seq) row p += the sum of d_out
// rows b * seq + p over the batch b. d_out is in the activation dtype, the
// table gradients in the accumulator dtype (f64 for f64 d_out, else f32).
// Outputs must not overlap the inputs or each other. On a GPU it takes
// EmbeddingBackwardWorkspaceBytes(...) of context.Workspace; with check_ids
// false it allocates nothing (once that is reserved) and never waits for the
// stream, so it can be captured in a CUDA graph.
//
// Determinism: both gradients are bitwise reproducible run to run on every
// device: the same ids and d_out give the same bits. d_position_table is a
// per-position sum over the batch in a fixed order. d_token_table is summed in
// row order on the CPU; on a GPU the ids are first sorted stably with their
// rows (a radix sort), so each id's rows lie together in row order, and one
// writer per id adds them in that order (a frequent id's rows in fixed slices
// of the sorted order, the slices' sums then in order) and adds the sum into
// its row once (that add is an atomic instruction, but each element gets only
// the one, so there is no order to vary). With fp32 atomics adding every row,
// as before, the order was the hardware's; now nothing depends on timing. (The
// GPU's grouping of the sums differs from the CPU's, so the two agree to fp32
// rounding, not bitwise.)
absl::Status EmbeddingBackward(Context& context, const Tensor& ids,
                               const Tensor& d_out, int64_t seq,
                               const Tensor& d_token_table,
                               const Tensor* d_position_table,
                               bool check_ids = true);

// Bytes of context.Workspace that EmbeddingBackward takes at most for ids
// [rows] into a token table [vocab, cols] on `device`, for
// Context::ReserveWorkspace ahead of the hot path. 0 on the CPU; on a GPU the
// id sort's arrays and temporaries and the partial sums of frequent ids (about
// 12 * rows + cols * rows / 4 bytes). 0 as well when the GPU cannot be asked
// (the backward then reports the error).
int64_t EmbeddingBackwardWorkspaceBytes(const Device& device, int64_t rows,
                                        int64_t vocab, int64_t cols);

}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_EMBEDDING_H_
