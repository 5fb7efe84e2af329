// What the two vocabulary-parallel ops (the cross-entropy over sharded logits,
// loss/vocab_parallel_cross_entropy.h, and the linear cross-entropy over a
// sharded head, loss/vocab_parallel_linear_cross_entropy.h) share on the host:
// the values of the validity record that the ranks exchange before anything is
// written (hashes of the options and targets) and the verdict on the gathered
// records, and the CPU twins of the row kernels of vocab_parallel_kernels.h,
// which take the same ChunkArgs. Internal to //loss.
//
//   // After the all-gather of every rank's record ([world, kFields]):
//   RETURN_IF_ERROR(CheckRecords(records, world, rank, validate, "op",
//   agreed)); RowMaxCpu(args);  // then all-reduce args.row_max (kMax)
//   RowSumsCpu(args);  // then all-reduce args.sums (kSum)
//   RowFinishCpu(args);  // loss, lse, dlogits in place
#ifndef LOSSRT_LOSS_VOCAB_PARALLEL_INTERNAL_H_
#define LOSSRT_LOSS_VOCAB_PARALLEL_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "loss/cross_entropy.h"
#include "loss/vocab_parallel_kernels.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace vocab_parallel {

// A hash of the options that decide the collectives and the results (whether
// class weights are given, not their values), for the record's kOptions.
int64_t OptionsHash(const CrossEntropyOptions& options);

// A hash of the targets' bytes (host memory), for the record's kTargets.
int64_t TargetsHash(const Tensor& targets);

// Element i of a host array of f32, bf16 or f16, as f32.
float LoadHost(const void* base, DType type, int64_t i);
// Stores `value` rounded to `type` at element i of a host array.
void StoreHost(void* base, DType type, int64_t i, float value);
// `value` rounded to `type` and back (f32: unchanged).
float RoundTo(DType type, float value);
// Target i of an i64 or i32 host tensor.
int64_t LoadTarget(const Tensor& targets, int64_t i);

// What every rank agrees on after the exchange.
struct Agreed {
  int64_t chunk_rows = 0;  // rows of every token chunk but the last
  int64_t num_chunks = 0;
};

// The verdict on the gathered records ([world_size, kFields]): every rank
// valid (else an InvalidArgument naming the first rank that rejected its
// inputs, `op` naming the op), one vocab, N, H and pass, the same options and
// targets, slices contiguous in rank order covering [0, vocab). On success,
// the chunks every rank takes (the smallest kChunkRows decides).
absl::Status CheckRecords(const int64_t* records, int world_size, int rank,
                          bool validate_targets, absl::string_view op,
                          Agreed& agreed);

// The CPU twins of the row kernels, over args.rows rows of fp32 logits
// (args.logits, row stride args.ld) that are already soft-capped (unlike the
// CUDA kernels, which cap in RowMax or, not fused, in RowFinish).
// args.target_weight must be given (1 a token without class weights).

// Soft-caps rows x cols of z in place (no-op for cap <= 0).
void SoftcapCpu(float* z, int64_t rows, int64_t cols, int64_t ld, float cap);
// args.row_max[i] = the local max of row i.
void RowMaxCpu(const ChunkArgs& args);
// args.sums[i] from args.row_max (the global max by then).
void RowSumsCpu(const ChunkArgs& args);
// Loss and lse (args.fused) from the global sums, and (args.backward) the
// dlogits in place: fp32 values rounded to args.grad_type, stored as fp32.
void RowFinishCpu(const ChunkArgs& args);

}  // namespace vocab_parallel
}  // namespace lossrt

#endif  // LOSSRT_LOSS_VOCAB_PARALLEL_INTERNAL_H_
