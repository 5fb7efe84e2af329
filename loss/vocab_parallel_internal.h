// What the two vocabulary-parallel ops (the cross-entropy over sharded logits,
// loss/vocab_parallel_cross_entropy.h, and the linear cross-entropy over a
// sharded head, loss/vocab_parallel_linear_cross_entropy.h) share on the host:
// the values of the validity record that the ranks exchange before anything is
// written (hashes of the options and targets) and the verdict on the gathered
// records, and the CPU twins of the row kernels of vocab_parallel_kernels.h,
// which take the same ChunkArgs; and the runners' plumbing: the block's
// layout and regions, the record exchange (CPU and CUDA), the target weights,
// the chunk arguments and the chunks' statistics all-reduces. Internal to
// //loss.
//
//   // After the all-gather of every rank's record ([world, kFields]):
//   RETURN_IF_ERROR(CheckRecords(records, world, rank, validate, "op",
//   agreed)); RowMaxCpu(args);  // then all-reduce args.row_max (kMax)
//   RowSumsCpu(args);  // then all-reduce args.sums (kSum)
//   RowFinishCpu(args);  // loss, lse, dlogits in place
#ifndef LOSSRT_LOSS_VOCAB_PARALLEL_INTERNAL_H_
#define LOSSRT_LOSS_VOCAB_PARALLEL_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "loss/cross_entropy.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/vocab_parallel_kernels.h"
#include "runtime/allocator.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/dtype.h"
#include "runtime/int_math.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

#ifdef LOSSRT_WITH_CUDA
#include <optional>

#include "runtime/cuda_context.h"
#include "runtime/scoped_device.h"
#endif

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

// ---- The runners' plumbing, shared by the two ops ----

// Every region of the runners' blocks and chunk buffers is aligned to this.
constexpr int64_t kAlignment = 256;
inline int64_t Aligned(int64_t bytes) { return RoundUp(bytes, kAlignment); }

// Offsets of aligned regions in one block, in the order they are added.
class BlockPlan {
 public:
  // The offset of a region of `bytes` bytes, or -1 when it is not `needed`.
  int64_t Add(bool needed, int64_t bytes) {
    if (!needed) return -1;
    const int64_t offset = size_;
    size_ += Aligned(bytes);
    return offset;
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

// A token chunk's regions in its buffer, each aligned.
struct ChunkRegions {
  float* logits = nullptr;   // [max_rows, ld] fp32; dlogits in place
  float* row_max = nullptr;  // [max_rows]
  double* sums = nullptr;    // [max_rows, kRowSums]
  float* partial = nullptr;  // [max_rows, H]: d_hidden's rows (linear op)
};
ChunkRegions RegionsOf(void* buffer, int64_t max_rows, int64_t ld);

// This rank's slice [offset, offset + local_vocab) of the vocabulary [0,
// vocab).
struct Slice {
  int64_t offset = 0;
  int64_t local_vocab = 0;  // V_r
  int64_t vocab = 0;        // V
};

// The shard's vocabulary (>= 1) and the slice inside it; `units` and `of`
// name the slice in the message ("columns", "the logits").
absl::Status CheckSliceInVocab(const Slice& slice, absl::string_view units,
                               absl::string_view of);

// What a valid rank's record says of its call, besides the hashes.
struct CallFacts {
  Slice slice;
  int64_t tokens = 0;      // N
  int64_t hidden = 0;      // H; 0 for the cross-entropy over logits
  int64_t chunk_rows = 0;  // the most rows a chunk may take on this rank
  int64_t pass = 0;        // the op's pass
};

// The record's host-known fields (kOk .. kOptions) of a valid rank.
void FillRecord(const CallFacts& facts, const CrossEntropyOptions& options,
                int64_t* fields);

// The rank's record array [world_size + 1, kFields] (its own record last):
// `in_block` when the call's block exists, else a fresh allocation that
// `fallback` keeps.
absl::StatusOr<int64_t*> RecordArray(Context& context, int64_t* in_block,
                                     int world_size, Buffer& fallback);

// The CPU path's exchange: the rank's record (zeros but, when `local` is OK,
// the facts and the options' and targets' hashes) all-gathered over the
// ranks; then `local`'s verdict and CheckRecords's (`op` naming the op).
absl::Status ExchangeRecordsCpu(Context& context, Communicator& comm,
                                int64_t* in_block, const absl::Status& local,
                                const CallFacts& facts,
                                const CrossEntropyOptions& options,
                                const Tensor& targets, absl::string_view op,
                                Agreed& agreed);

// The CPU path's target scan, before the exchange: the targets against the
// whole vocabulary (the same verdict on every rank: the targets are), the
// class weights' signs ([V_r] or null) against this rank's slice; then
// CheckTargetStats's verdict.
absl::Status ScanTargetsHost(const Tensor& targets, const Slice& slice,
                             const float* class_weights,
                             const CrossEntropyOptions& options,
                             ce::TargetStats& stats);

// The CPU path's target weights ([N + 1]): target_weight[i] = w[t_i] from the
// rank that owns t_i (all-reduced, kSum) and target_weight[N] = W, the class
// weights' total; without class weights 1 per token and W = V, no collective.
// `ce_denominator`: the mean's denominator as the target scan sums it (in
// token order).
absl::Status TargetWeightsCpu(Context& context, Communicator& comm,
                              const Tensor& targets, const Slice& slice,
                              const float* class_weights, int64_t ignore_index,
                              double* target_weight, double& ce_denominator);

// The chunk arguments that do not depend on the chunk; the mean's scales
// (MeanScales), W and the dlogits' scale are left for the caller.
ChunkArgs CallArgs(const CrossEntropyOptions& options, const Slice& slice,
                   int64_t ld, const Tensor& targets,
                   const float* class_weights, bool fused, bool backward,
                   DType grad_type);

// The mean's scales from its denominators (1 for the other reductions).
void MeanScales(const CrossEntropyOptions& options, double ce_denominator,
                double z_denominator, ChunkArgs& args);

// The chunk arguments of rows [row_begin, row_end) given the call's. `lse`,
// `row_loss` (or null), `target_weight` (or null: 1) and `grad_loss` (or
// null) are the call's, from row 0.
ChunkArgs RowArgs(const ChunkArgs& call, const ChunkRegions& regions,
                  const Tensor& targets, const Tensor* grad_loss,
                  int64_t row_begin, int64_t row_end, float* lse,
                  float* row_loss, const double* target_weight);

// The chunk's global statistics on the CPU (args.fused): the local row max
// all-reduced (kMax), then the row sums relative to it all-reduced (kSum).
absl::Status GlobalRowStatsCpu(Context& context, Communicator& comm,
                               const ChunkArgs& args);

// The loss ([] or [1] reduced, else [N]), lse ([N]) and grad_loss checks,
// each when the tensor is given.
absl::Status CheckStatTensors(const Context& context, Reduction reduction,
                              int64_t tokens, const Tensor* loss,
                              const Tensor* lse, const Tensor* grad_loss);

using NamedTensor = std::pair<const Tensor*, const char*>;

// The tensors of every call, in the order of the overlap checks: the class
// weights and grad_loss (inputs), the loss (an output), the lse (an output
// of a forward, else an input); each when given.
void AddCallTensors(const CrossEntropyOptions& options, const Tensor* grad_loss,
                    const Tensor* loss, const Tensor* lse, bool forward,
                    std::vector<NamedTensor>& inputs,
                    std::vector<NamedTensor>& outputs);

// No output overlaps an input or an earlier output, but `in_place_output`
// may overlap `in_place_input` (null: no such pair).
absl::Status CheckDisjoint(const std::vector<NamedTensor>& outputs,
                           const std::vector<NamedTensor>& inputs,
                           const Tensor* in_place_output,
                           const Tensor* in_place_input);

// What each runner holds for the call: the context, the communicator, the
// options, the per-call block and the chunk buffer, the agreed chunks and the
// class weights.
class RunnerBase {
 protected:
  RunnerBase(Context& context, Communicator& comm,
             const CrossEntropyOptions& options)
      : context_(context), comm_(comm), ce_(options) {}

  // The block's region at `offset` (null for -1).
  template <typename T>
  T* At(int64_t offset) const {
    return offset < 0 ? nullptr
                      : reinterpret_cast<T*>(static_cast<char*>(block_.data()) +
                                             offset);
  }
  // `count` elements at `data` as a 1-D tensor on the context's device.
  Tensor View(void* data, DType dtype, int64_t count) const {
    return Tensor::Of(data, dtype, {count}, context_.device());
  }

  Context& context_;
  Communicator& comm_;
  const CrossEntropyOptions& ce_;

  Agreed agreed_;
  Buffer block_;                          // per-call arrays
  Buffer chunk_;                          // a chunk's regions
  const float* class_weights_ = nullptr;  // [V_r] or null
};

// Runs chunk(row_begin, row_end) over the agreed token chunks of [0, tokens),
// in order, up to the first error.
template <typename ChunkFn>
absl::Status ForEachChunk(const Agreed& agreed, int64_t tokens,
                          ChunkFn&& chunk) {
  for (int64_t c = 0; c < agreed.num_chunks; ++c) {
    const int64_t begin = c * agreed.chunk_rows;
    RETURN_IF_ERROR(chunk(begin, std::min(tokens, begin + agreed.chunk_rows)));
  }
  return absl::OkStatus();
}

// One call on one rank: the communicator must be given; the verdict of the
// rank-local checks (the op's CheckInputs, then CheckOutputs, found next to
// its Problem) goes into the rank's record whatever it is, so that no other
// rank waits for an invalid one; then the CPU runner or (built with CUDA) the
// CUDA one. `op` names the op.
template <typename CpuRunner, typename CudaRunner, typename Problem>
absl::Status RunRank(Context& context, Problem& p, absl::string_view op) {
  if (p.shard->communicator == nullptr) {
    return InvalidArgument("shard.communicator is null");
  }
  absl::Status local = CheckInputs(context, p);
  if (local.ok()) local = CheckOutputs(context, p);
  if (!context.device().is_cpu()) {
#ifdef LOSSRT_WITH_CUDA
    CudaRunner runner(context, p);
    return runner.Run(local);
#else
    return absl::UnimplementedError(absl::StrCat(op, ": built without CUDA"));
#endif
  }
  CpuRunner runner(context, p);
  return runner.Run(local);
}

#ifdef LOSSRT_WITH_CUDA
// Makes the context's device current for as long as `device` lives; the
// context's stream.
absl::StatusOr<cudaStream_t> EnterDevice(Context& context,
                                         std::optional<ScopedDevice>& device);

// The mean's denominators and W, from the ranks' records.
struct Denominators {
  double ce = 0.0;
  double z = 0.0;
  double weight_total = 0.0;
};

// The CUDA path's exchange: the rank's record (when `local` is OK, the facts
// and the device's scan of the targets and class weights, [V_r] or null)
// all-gathered over the ranks and read back (the call's one wait for the
// stream); then `local`'s verdict, the rank's target stats, CheckRecords's;
// on success the denominators from the ranks' sums, in rank order.
absl::Status ExchangeRecordsCuda(
    Context& context, Communicator& comm, cudaStream_t stream,
    int64_t* in_block, const absl::Status& local, const CallFacts& facts,
    const CrossEntropyOptions& options, const Tensor& targets,
    const float* class_weights, absl::string_view op, Agreed& agreed,
    Denominators& denominators);

// The CUDA path's target weights ([N], class weights given): w[t_i] from the
// rank that owns t_i (all-reduced, kSum).
absl::Status TargetWeightsCuda(Context& context, Communicator& comm,
                               cudaStream_t stream, const Tensor& targets,
                               const Slice& slice, const float* class_weights,
                               double* target_weight);

// The chunk's global statistics on the device (args.fused): the row max
// (kMax; the kernel soft-caps in place), then the row sums (kSum).
absl::Status GlobalRowStatsCuda(Context& context, Communicator& comm,
                                cudaStream_t stream, const ChunkArgs& args);
#endif  // LOSSRT_WITH_CUDA

}  // namespace vocab_parallel
}  // namespace lossrt

#endif  // LOSSRT_LOSS_VOCAB_PARALLEL_INTERNAL_H_
