// The vocabulary-parallel cross-entropy (loss/vocab_parallel_cross_entropy.h):
// the rank-local checks, the exchange of the validity record (one all-gather,
// before anything is written), the per-token target weights from their owners,
// and the token-chunk loop. Each chunk: the local logits widened to fp32 (and
// soft-capped), the row max all-reduced (kMax), the row sums all-reduced
// (kSum, f64), the loss and lse from those, the local dlogits from the global
// lse, stored into grad_logits. The row math is that of the vocabulary-
// parallel linear cross-entropy (the CPU twins of vocab_parallel_internal.h,
// the kernels of vocab_parallel_kernels.h on CUDA).
#include "loss/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "loss/cross_entropy_cpu.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/loss_checks.h"
#include "loss/vocab_parallel_internal.h"
#include "loss/vocab_parallel_kernels.h"
#include "runtime/dtype.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include <cuda_runtime.h>

#include <optional>

#include "absl/container/inlined_vector.h"
#include "loss/cross_entropy_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace vocab_parallel {
namespace {

constexpr char kOpName[] = "vocabulary-parallel cross-entropy";
constexpr int64_t kAlignment = 256;
// A chunk's regions (logits, row max, row sums) are each 256-aligned: the most
// bytes their alignment may add.
constexpr int64_t kChunkSlack = 3 * kAlignment;

enum class Pass : int64_t { kForward, kForwardBackward, kBackward };

// One call on one rank.
struct Problem {
  Pass pass = Pass::kForward;
  const VocabShard* shard = nullptr;
  const Tensor* logits = nullptr;
  const Tensor* targets = nullptr;
  const CrossEntropyOptions* options = nullptr;
  const Tensor* loss = nullptr;
  const Tensor* lse = nullptr;
  const Tensor* grad_loss = nullptr;
  const Tensor* grad_logits = nullptr;
  int64_t tokens = 0;       // N
  int64_t local_vocab = 0;  // V_r
  bool backward() const { return pass != Pass::kForward; }
  bool forward() const { return pass != Pass::kBackward; }
  // Whether the row statistics come from the logits: every forward, and a
  // backward with entropy_weight != 0 (the entropy is not saved).
  bool statistics() const {
    return forward() || options->entropy_weight != 0.0f;
  }
};

absl::Status CheckInputs(const Context& context, Problem& p) {
  const Tensor& logits = *p.logits;
  RETURN_IF_ERROR(
      CheckDType(logits, {DType::kF32, DType::kBF16, DType::kF16}, "logits"));
  if (logits.rank() != 2) {
    return InvalidArgument("logits: expected [tokens, V_r], got ",
                           logits.ShapeString());
  }
  p.tokens = logits.dim(0);
  p.local_vocab = logits.dim(1);
  if (p.tokens < 1) {
    return InvalidArgument("logits: tokens must be >= 1, got ",
                           logits.ShapeString());
  }
  RETURN_IF_ERROR(ce::CheckVocab(p.local_vocab, "logits"));
  RETURN_IF_ERROR(ce::CheckOnContext(logits, context, "logits"));
  const VocabShard& shard = *p.shard;
  RETURN_IF_ERROR(ce::CheckVocab(shard.vocab, "shard.vocab"));
  if (shard.vocab_offset < 0 ||
      shard.vocab_offset > shard.vocab - p.local_vocab) {
    return InvalidArgument("shard: columns [", shard.vocab_offset, ", ",
                           shard.vocab_offset + p.local_vocab,
                           ") of the logits are outside the vocabulary [0, ",
                           shard.vocab, ")");
  }
  const Tensor& targets = *p.targets;
  RETURN_IF_ERROR(CheckDType(targets, {DType::kI64, DType::kI32}, "targets"));
  RETURN_IF_ERROR(CheckShape(targets, {p.tokens}, "targets"));
  RETURN_IF_ERROR(ce::CheckOnContext(targets, context, "targets"));
  return ce::CheckCrossEntropyOptions(*p.options, p.local_vocab, context);
}

absl::Status CheckOutputs(const Context& context, const Problem& p) {
  const CrossEntropyOptions& ce = *p.options;
  if (p.loss != nullptr) {
    RETURN_IF_ERROR(
        ce::CheckLossTensor(*p.loss, ce.reduction, p.tokens, context, "loss"));
  }
  if (p.lse != nullptr)
    RETURN_IF_ERROR(ce::CheckLseTensor(*p.lse, p.tokens, context));
  if (p.grad_loss != nullptr) {
    RETURN_IF_ERROR(ce::CheckLossTensor(*p.grad_loss, ce.reduction, p.tokens,
                                        context, "grad_loss"));
  }
  const Tensor& logits = *p.logits;
  if (p.grad_logits != nullptr) {
    const Tensor& grad = *p.grad_logits;
    if (grad.dtype != logits.dtype) {
      return InvalidArgument("grad_logits: dtype must match the logits (",
                             DTypeName(logits.dtype), "), got ",
                             DTypeName(grad.dtype));
    }
    RETURN_IF_ERROR(CheckShape(grad, {p.tokens, p.local_vocab}, "grad_logits"));
    RETURN_IF_ERROR(ce::CheckOnContext(grad, context, "grad_logits"));
    if (Overlaps(grad, logits) &&
        (grad.data != logits.data ||
         grad.effective_row_stride() != logits.effective_row_stride())) {
      return InvalidArgument(
          "grad_logits overlaps the logits without being the same tensor; "
          "pass the logits themselves for the in-place mode");
    }
  }
  // Outputs may overlap neither an input (but grad_logits the logits, in
  // place) nor each other.
  using Named = std::pair<const Tensor*, const char*>;
  std::vector<Named> inputs = {{p.targets, "targets"}};
  std::vector<Named> outputs;
  if (ce.class_weights.has_value())
    inputs.push_back({&*ce.class_weights, "class_weights"});
  if (p.grad_loss != nullptr) inputs.push_back({p.grad_loss, "grad_loss"});
  if (p.loss != nullptr) outputs.push_back({p.loss, "loss"});
  if (p.lse != nullptr)
    (p.forward() ? outputs : inputs).push_back({p.lse, "lse"});
  if (p.grad_logits != nullptr)
    outputs.push_back({p.grad_logits, "grad_logits"});
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].first != p.grad_logits &&
        Overlaps(*outputs[i].first, logits))
      return InvalidArgument(outputs[i].second, " overlaps the input logits");
    for (const Named& input : inputs) {
      if (Overlaps(*outputs[i].first, *input.first))
        return InvalidArgument(outputs[i].second, " overlaps the input ",
                               input.second);
    }
    for (size_t j = 0; j < i; ++j) {
      if (Overlaps(*outputs[i].first, *outputs[j].first))
        return InvalidArgument(outputs[i].second, " overlaps ",
                               outputs[j].second);
    }
  }
  return absl::OkStatus();
}

int64_t Aligned(int64_t bytes) { return RoundUp(bytes, kAlignment); }

// The call's temporaries: per-call arrays (the block), then a token chunk's.
struct Layout {
  int64_t record = 0;          // i64 [P * kFields + kFields]
  int64_t row_loss = -1;       // f32 [N] (forward, mean or sum)
  int64_t lse = -1;            // f32 [N]: the lse when the caller's is not
                               // written (not given, or a backward's input)
  int64_t target_weight = -1;  // f64 [N + 1]: w[t] per token, then W
  int64_t block_bytes = 0;
  int64_t ld = 0;        // the chunk logits' row stride (floats)
  int64_t max_rows = 0;  // the most rows a chunk may take on this rank
  int64_t chunk_bytes = 0;
};

// The chunk's regions in its buffer.
struct ChunkRegions {
  float* logits = nullptr;   // [max_rows, ld] fp32; dlogits in place
  float* row_max = nullptr;  // [max_rows]
  double* sums = nullptr;    // [max_rows, kRowSums]
};

ChunkRegions RegionsOf(void* buffer, const Layout& layout) {
  ChunkRegions r;
  char* base = static_cast<char*>(buffer);
  r.logits = reinterpret_cast<float*>(base);
  base += Aligned(4 * layout.max_rows * layout.ld);
  r.row_max = reinterpret_cast<float*>(base);
  base += Aligned(4 * layout.max_rows);
  r.sums = reinterpret_cast<double*>(base);
  return r;
}

Layout PlanLayout(const Problem& p, int world_size) {
  Layout layout;
  const int64_t n = p.tokens;
  int64_t size = 0;
  auto add = [&size](bool needed, int64_t bytes) {
    if (!needed) return int64_t{-1};
    const int64_t offset = size;
    size += Aligned(bytes);
    return offset;
  };
  const bool reduced = p.options->reduction != Reduction::kNone;
  layout.record = add(true, 8 * kFields * (world_size + 1));
  layout.row_loss = add(p.forward() && reduced, 4 * n);
  layout.lse = add(p.lse == nullptr || !p.forward(), 4 * n);
  layout.target_weight = add(true, 8 * (n + 1));
  layout.block_bytes = size;
  layout.ld = RoundUp(p.local_vocab, int64_t{8});
  const int64_t row_bytes = 4 * layout.ld + 4 + 8 * kRowSums;
  layout.max_rows =
      std::min(std::max<int64_t>(kVocabParallelChunkBytes / row_bytes, 1), n);
  layout.chunk_bytes = layout.max_rows * row_bytes + kChunkSlack;
  return layout;
}

// The record's host-known fields (kOk .. kTargets) of a valid rank.
void FillRecord(const Problem& p, const Layout& layout, int64_t* fields) {
  fields[kOk] = 1;
  fields[kOffset] = p.shard->vocab_offset;
  fields[kLocalVocab] = p.local_vocab;
  fields[kVocab] = p.shard->vocab;
  fields[kTokens] = p.tokens;
  fields[kHidden] = 0;
  fields[kChunkRows] = layout.max_rows;
  fields[kPass] = static_cast<int64_t>(p.pass);
  fields[kOptions] = OptionsHash(*p.options);
}

// The chunk arguments that do not depend on the chunk.
ChunkArgs CallArgs(const Problem& p, const Layout& layout,
                   const float* class_weights) {
  const CrossEntropyOptions& ce = *p.options;
  ChunkArgs args;
  args.ld = layout.ld;
  args.cols = p.local_vocab;
  args.offset = p.shard->vocab_offset;
  args.vocab = p.shard->vocab;
  args.targets_i64 = p.targets->dtype == DType::kI64;
  args.ignore_index = ce.ignore_index;
  args.label_smoothing = ce.label_smoothing;
  args.z_loss = ce.z_loss;
  args.softcap = ce.softcap;
  args.entropy_weight = ce.entropy_weight;
  args.class_weights = class_weights;
  args.mean = ce.reduction == Reduction::kMean;
  args.fused = p.statistics();
  args.backward = p.backward();
  args.grad_type = p.logits->dtype;
  args.grad_loss_per_row = ce.reduction == Reduction::kNone;
  args.dlogits_scale = 1.0f;
  return args;
}

// The chunk arguments of rows [row_begin, row_end) given the call's.
ChunkArgs RowArgs(const ChunkArgs& call, const Problem& p,
                  const ChunkRegions& regions, int64_t row_begin,
                  int64_t row_end, float* lse, float* row_loss,
                  const double* target_weight) {
  ChunkArgs args = call;
  args.logits = regions.logits;
  args.rows = row_end - row_begin;
  args.row_max = regions.row_max;
  args.sums = regions.sums;
  args.targets = static_cast<const char*>(p.targets->data) +
                 row_begin * DTypeSize(p.targets->dtype);
  args.lse = lse + row_begin;
  args.row_loss = row_loss != nullptr ? row_loss + row_begin : nullptr;
  args.target_weight =
      target_weight != nullptr ? target_weight + row_begin : nullptr;
  if (p.grad_loss != nullptr) {
    args.grad_loss = p.grad_loss->data_as<const float>() +
                     (args.grad_loss_per_row ? row_begin : 0);
  }
  return args;
}

// The mean's scales from its denominators.
void MeanScales(const CrossEntropyOptions& ce, double ce_denominator,
                double z_denominator, ChunkArgs& args) {
  args.ce_scale = 1.0;
  args.z_scale = 1.0;
  if (ce.reduction == Reduction::kMean) {
    args.ce_scale = ce_denominator > 0 ? 1.0 / ce_denominator : 0.0;
    args.z_scale = z_denominator > 0 ? 1.0 / z_denominator : 0.0;
  }
}

// The CPU path.
class Runner {
 public:
  Runner(Context& context, const Problem& p)
      : context_(context),
        p_(p),
        comm_(*p.shard->communicator),
        ce_(*p.options) {}

  // `checks`: the verdict of the rank-local argument checks. The rank takes
  // part in the exchange whatever it is.
  absl::Status Run(const absl::Status& checks);

 private:
  template <typename T>
  T* At(int64_t offset) const {
    return offset < 0 ? nullptr
                      : reinterpret_cast<T*>(static_cast<char*>(block_.data()) +
                                             offset);
  }
  Tensor View(void* data, DType dtype, int64_t count) const {
    return Tensor::Of(data, dtype, {count}, context_.device());
  }
  absl::Status Prepare();
  absl::Status Exchange(const absl::Status& local);
  absl::Status Chunk(const ChunkArgs& call, int64_t row_begin, int64_t row_end);

  Context& context_;
  const Problem& p_;
  Communicator& comm_;
  const CrossEntropyOptions& ce_;

  Layout layout_;
  Agreed agreed_;
  Buffer block_;  // per-call arrays
  Buffer chunk_;  // a chunk's fp32 logits and statistics
  const float* class_weights_ = nullptr;  // [V_r] or null
  ce::TargetStats stats_{};
};

absl::Status Runner::Prepare() {
  layout_ = PlanLayout(p_, comm_.world_size());
  const int64_t n = p_.tokens;
  const int64_t v = p_.local_vocab;
  // The targets against the whole vocabulary (the same verdict on every rank:
  // the targets are), the class weights' signs against this rank's slice.
  stats_ =
      ce::ScanTargetsCpu(p_.targets->data, p_.targets->dtype == DType::kI64, n,
                         p_.shard->vocab, ce_.ignore_index, nullptr);
  stats_.negative_weights = 0;
  if (ce_.class_weights.has_value()) {
    class_weights_ = ce_.class_weights->data_as<const float>();
    for (int64_t j = 0; j < v; ++j) {
      if (!(class_weights_[j] >= 0.0f)) ++stats_.negative_weights;
    }
  }
  RETURN_IF_ERROR(ce::CheckTargetStats(stats_, ce_, n, p_.shard->vocab));
  ASSIGN_OR_RETURN(block_, context_.allocator().Allocate(layout_.block_bytes));
  ASSIGN_OR_RETURN(chunk_, context_.allocator().Allocate(layout_.chunk_bytes));
  return absl::OkStatus();
}

absl::Status Runner::Exchange(const absl::Status& local) {
  const int world = comm_.world_size();
  // The record lives in the block when it exists, else in a small buffer.
  Buffer fallback;
  int64_t* record = nullptr;
  if (block_.data() != nullptr) {
    record = At<int64_t>(layout_.record);
  } else {
    ASSIGN_OR_RETURN(fallback,
                     context_.allocator().Allocate(8 * kFields * (world + 1)));
    record = fallback.data_as<int64_t>();
  }
  int64_t* mine = record + world * kFields;
  std::fill(mine, mine + kFields, 0);
  if (local.ok()) {
    FillRecord(p_, layout_, mine);
    mine[kTargets] = TargetsHash(*p_.targets);
  }
  RETURN_IF_ERROR(comm_.AllGather(View(mine, DType::kI64, kFields),
                                  View(record, DType::kI64, world * kFields),
                                  context_));
  RETURN_IF_ERROR(local);
  return CheckRecords(record, world, comm_.rank(), ce_.validate_targets,
                      kOpName, agreed_);
}

absl::Status Runner::Run(const absl::Status& checks) {
  RETURN_IF_ERROR(Exchange(checks.ok() ? Prepare() : checks));
  const Tensor& targets = *p_.targets;
  const int64_t n = p_.tokens;
  const int64_t v = p_.local_vocab;
  const int64_t offset = p_.shard->vocab_offset;
  const int64_t vocab = p_.shard->vocab;

  // The targets' weights from their owners and the weight total W.
  double* target_weight = At<double>(layout_.target_weight);
  if (class_weights_ != nullptr) {
    double local_total = 0.0;
    for (int64_t j = 0; j < v; ++j) local_total += class_weights_[j];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = LoadTarget(targets, i);
      target_weight[i] =
          t >= offset && t < offset + v ? class_weights_[t - offset] : 0.0;
    }
    target_weight[n] = local_total;
    const Tensor all = View(target_weight, DType::kF64, n + 1);
    RETURN_IF_ERROR(comm_.AllReduce(all, all, ReduceOp::kSum, context_));
  } else {
    std::fill(target_weight, target_weight + n, 1.0);
    target_weight[n] = static_cast<double>(vocab);
  }
  // The mean's denominators as the target scan sums them (in token order).
  double ce_denominator = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = LoadTarget(targets, i);
    if (t != ce_.ignore_index && t >= 0 && t < vocab)
      ce_denominator += target_weight[i];
  }
  ChunkArgs call = CallArgs(p_, layout_, class_weights_);
  call.weight_total = target_weight[n];
  MeanScales(ce_, ce_denominator, stats_.z_denominator, call);

  float* lse = p_.forward() && p_.lse != nullptr ? p_.lse->data_as<float>()
                                                 : At<float>(layout_.lse);
  if (!call.fused) lse = p_.lse->data_as<float>();  // the saved lse, read
  float* row_loss = !p_.forward() ? nullptr
                    : ce_.reduction == Reduction::kNone
                        ? p_.loss->data_as<float>()
                        : At<float>(layout_.row_loss);
  for (int64_t c = 0; c < agreed_.num_chunks; ++c) {
    const int64_t begin = c * agreed_.chunk_rows;
    const int64_t end = std::min(n, begin + agreed_.chunk_rows);
    const ChunkArgs args = RowArgs(call, p_, RegionsOf(chunk_.data(), layout_),
                                   begin, end, lse, row_loss, target_weight);
    RETURN_IF_ERROR(Chunk(args, begin, end));
  }
  if (p_.forward() && ce_.reduction != Reduction::kNone) {
    *p_.loss->data_as<float>() =
        static_cast<float>(ce::SumRowsCpu(row_loss, n));
  }
  return absl::OkStatus();
}

absl::Status Runner::Chunk(const ChunkArgs& args, int64_t row_begin,
                           int64_t row_end) {
  const Tensor& logits = *p_.logits;
  const int64_t rows = row_end - row_begin;
  const int64_t v = p_.local_vocab;
  const int64_t ld = layout_.ld;
  // The chunk's logits in fp32 [rows, ld], soft-capped.
  const int64_t src_ld = logits.effective_row_stride();
  for (int64_t i = 0; i < rows; ++i) {
    float* dst = args.logits + i * ld;
    const int64_t base = (row_begin + i) * src_ld;
    if (logits.dtype == DType::kF32) {
      std::memcpy(dst, logits.data_as<const float>() + base, 4 * v);
    } else {
      for (int64_t j = 0; j < v; ++j)
        dst[j] = LoadHost(logits.data, logits.dtype, base + j);
    }
  }
  SoftcapCpu(args.logits, rows, v, ld, ce_.softcap);

  // The global lse: the row max (kMax), then the row sums (kSum).
  if (args.fused) {
    RowMaxCpu(args);
    const Tensor maxes = View(args.row_max, DType::kF32, rows);
    RETURN_IF_ERROR(comm_.AllReduce(maxes, maxes, ReduceOp::kMax, context_));
    RowSumsCpu(args);
    const Tensor all = View(args.sums, DType::kF64, rows * kRowSums);
    RETURN_IF_ERROR(comm_.AllReduce(all, all, ReduceOp::kSum, context_));
  }
  RowFinishCpu(args);
  if (!p_.backward()) return absl::OkStatus();
  // The dlogits (already rounded to the logits' dtype) into grad_logits.
  const Tensor& grad = *p_.grad_logits;
  const int64_t grad_ld = grad.effective_row_stride();
  for (int64_t i = 0; i < rows; ++i) {
    const float* src = args.logits + i * ld;
    const int64_t base = (row_begin + i) * grad_ld;
    if (grad.dtype == DType::kF32) {
      std::memcpy(grad.data_as<float>() + base, src, 4 * v);
    } else {
      for (int64_t j = 0; j < v; ++j)
        StoreHost(grad.data, grad.dtype, base + j, src[j]);
    }
  }
  return absl::OkStatus();
}

#ifdef LOSSRT_WITH_CUDA
// The CUDA path: the same exchange and chunk loop, every step on the
// context's stream. The targets are checked on the device and their verdict
// travels in the record, so that the exchange needs the call's one wait for
// the stream (the records' readback).
class CudaRunner {
 public:
  CudaRunner(Context& context, const Problem& p)
      : context_(context),
        p_(p),
        comm_(*p.shard->communicator),
        ce_(*p.options) {}

  absl::Status Run(const absl::Status& checks);

 private:
  template <typename T>
  T* At(int64_t offset) const {
    return offset < 0 ? nullptr
                      : reinterpret_cast<T*>(static_cast<char*>(block_.data()) +
                                             offset);
  }
  Tensor View(void* data, DType dtype, int64_t count) const {
    return Tensor::Of(data, dtype, {count}, context_.device());
  }
  absl::Status Prepare();
  absl::Status Exchange(const absl::Status& local);
  absl::Status Chunk(const ChunkArgs& args, int64_t row_begin, int64_t row_end);

  Context& context_;
  const Problem& p_;
  Communicator& comm_;
  const CrossEntropyOptions& ce_;

  std::optional<ScopedDevice> device_;
  cudaStream_t stream_ = nullptr;
  Layout layout_;
  Agreed agreed_;
  Buffer block_;  // per-call arrays (device)
  Buffer chunk_;  // a chunk's fp32 logits and statistics (device)
  const float* class_weights_ = nullptr;  // [V_r] or null
  double weight_total_ = 0.0;
  double ce_denominator_ = 0.0;
  double z_denominator_ = 0.0;
};

absl::Status CudaRunner::Prepare() {
  layout_ = PlanLayout(p_, comm_.world_size());
  if (ce_.class_weights.has_value())
    class_weights_ = ce_.class_weights->data_as<const float>();
  ASSIGN_OR_RETURN(block_, context_.allocator().Allocate(layout_.block_bytes));
  ASSIGN_OR_RETURN(chunk_, context_.allocator().Allocate(layout_.chunk_bytes));
  return absl::OkStatus();
}

absl::Status CudaRunner::Exchange(const absl::Status& local) {
  const int world = comm_.world_size();
  const int rank = comm_.rank();
  Buffer fallback;
  int64_t* record = nullptr;  // device [world + 1, kFields]
  if (block_.data() != nullptr) {
    record = At<int64_t>(layout_.record);
  } else {
    ASSIGN_OR_RETURN(fallback,
                     context_.allocator().Allocate(8 * kFields * (world + 1)));
    record = fallback.data_as<int64_t>();
  }
  int64_t* mine = record + world * kFields;
  RecordArgs args;
  args.record = mine;
  if (local.ok()) {
    FillRecord(p_, layout_, args.fields);
    args.scan = true;
    args.targets = p_.targets->data;
    args.targets_i64 = p_.targets->dtype == DType::kI64;
    args.tokens = p_.tokens;
    args.vocab = p_.shard->vocab;
    args.ignore_index = ce_.ignore_index;
    args.offset = p_.shard->vocab_offset;
    args.local_vocab = p_.local_vocab;
    args.class_weights = class_weights_;
  }
  CUDA_RETURN_IF_ERROR(LaunchRecord(args, stream_));
  RETURN_IF_ERROR(comm_.AllGather(View(mine, DType::kI64, kFields),
                                  View(record, DType::kI64, world * kFields),
                                  context_));
  // The call's one wait for the stream: the records on the host.
  absl::InlinedVector<int64_t, 16 * kFields> records(world * kFields);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(records.data(), record,
                                       8 * kFields * world,
                                       cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  RETURN_IF_ERROR(local);
  const int64_t* own = records.data() + rank * kFields;
  ce::TargetStats stats{};
  stats.invalid = own[kInvalid];
  stats.negative_weights = own[kNegativeWeights];
  RETURN_IF_ERROR(ce::CheckTargetStats(stats, ce_, p_.tokens, p_.shard->vocab));
  RETURN_IF_ERROR(CheckRecords(records.data(), world, rank,
                               ce_.validate_targets, kOpName, agreed_));

  // The mean's denominators and W from the ranks' sums, in rank order.
  z_denominator_ = static_cast<double>(own[kCounted]);
  ce_denominator_ = z_denominator_;
  weight_total_ = static_cast<double>(p_.shard->vocab);
  if (class_weights_ != nullptr) {
    ce_denominator_ = 0.0;
    weight_total_ = 0.0;
    for (int r = 0; r < world; ++r) {
      double target_weights = 0.0, weights = 0.0;
      std::memcpy(&target_weights, &records[r * kFields + kTargetWeightSum], 8);
      std::memcpy(&weights, &records[r * kFields + kWeightSum], 8);
      ce_denominator_ += target_weights;
      weight_total_ += weights;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::Run(const absl::Status& checks) {
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context_.device().ordinal));
  device_.emplace(std::move(scoped));
  ASSIGN_OR_RETURN(stream_, CudaStreamOf(context_));
  absl::Status local = checks;
  if (local.ok()) local = Prepare();
  RETURN_IF_ERROR(Exchange(local));
  const int64_t n = p_.tokens;

  // The targets' weights from their owners (kSum over the ranks).
  double* target_weight = nullptr;
  if (class_weights_ != nullptr) {
    target_weight = At<double>(layout_.target_weight);
    TargetWeightArgs tw;
    tw.targets = p_.targets->data;
    tw.targets_i64 = p_.targets->dtype == DType::kI64;
    tw.tokens = n;
    tw.offset = p_.shard->vocab_offset;
    tw.local_vocab = p_.local_vocab;
    tw.class_weights = class_weights_;
    tw.target_weight = target_weight;
    CUDA_RETURN_IF_ERROR(LaunchTargetWeights(tw, stream_));
    const Tensor all = View(target_weight, DType::kF64, n);
    RETURN_IF_ERROR(comm_.AllReduce(all, all, ReduceOp::kSum, context_));
  }
  ChunkArgs call = CallArgs(p_, layout_, class_weights_);
  call.weight_total = weight_total_;
  MeanScales(ce_, ce_denominator_, z_denominator_, call);

  float* lse = p_.forward() && p_.lse != nullptr ? p_.lse->data_as<float>()
                                                 : At<float>(layout_.lse);
  if (!call.fused) lse = p_.lse->data_as<float>();  // the saved lse, read
  float* row_loss = !p_.forward() ? nullptr
                    : ce_.reduction == Reduction::kNone
                        ? p_.loss->data_as<float>()
                        : At<float>(layout_.row_loss);
  const ChunkRegions regions = RegionsOf(chunk_.data(), layout_);
  for (int64_t c = 0; c < agreed_.num_chunks; ++c) {
    const int64_t begin = c * agreed_.chunk_rows;
    const int64_t end = std::min(n, begin + agreed_.chunk_rows);
    RETURN_IF_ERROR(Chunk(
        RowArgs(call, p_, regions, begin, end, lse, row_loss, target_weight),
        begin, end));
  }
  if (p_.forward() && ce_.reduction != Reduction::kNone) {
    CUDA_RETURN_IF_ERROR(
        ce::LaunchSumRows(row_loss, n, p_.loss->data_as<float>(), stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::Chunk(const ChunkArgs& args, int64_t row_begin,
                               int64_t row_end) {
  const Tensor& logits = *p_.logits;
  const int64_t rows = row_end - row_begin;
  const int64_t e = DTypeSize(logits.dtype);
  // The chunk's logits in fp32 [rows, ld].
  WidenArgs widen;
  widen.src = static_cast<const char*>(logits.data) +
              row_begin * logits.effective_row_stride() * e;
  widen.type = logits.dtype;
  widen.src_ld = logits.effective_row_stride();
  widen.dst = args.logits;
  widen.dst_ld = args.ld;
  widen.rows = rows;
  widen.cols = args.cols;
  CUDA_RETURN_IF_ERROR(LaunchWiden(widen, stream_));

  // The global lse: the row max (kMax, soft-capping in place), then the row
  // sums (kSum).
  if (args.fused) {
    CUDA_RETURN_IF_ERROR(LaunchRowMax(args, stream_));
    const Tensor maxes = View(args.row_max, DType::kF32, rows);
    RETURN_IF_ERROR(comm_.AllReduce(maxes, maxes, ReduceOp::kMax, context_));
    CUDA_RETURN_IF_ERROR(LaunchRowSums(args, stream_));
    const Tensor sums = View(args.sums, DType::kF64, rows * kRowSums);
    RETURN_IF_ERROR(comm_.AllReduce(sums, sums, ReduceOp::kSum, context_));
  }
  CUDA_RETURN_IF_ERROR(LaunchRowFinish(args, stream_));
  if (!p_.backward()) return absl::OkStatus();
  // The dlogits, stored in the logits' dtype from each fp32 row's start
  // (a row stride of ld * 4 bytes), into grad_logits.
  const Tensor& grad = *p_.grad_logits;
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
      static_cast<char*>(grad.data) +
          row_begin * grad.effective_row_stride() * e,
      grad.effective_row_stride() * e, args.logits, args.ld * 4, args.cols * e,
      rows, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}
#endif  // LOSSRT_WITH_CUDA

absl::Status Run(Context& context, Problem& p) {
  if (p.shard->communicator == nullptr) {
    return InvalidArgument("shard.communicator is null");
  }
  absl::Status local = CheckInputs(context, p);
  if (local.ok()) local = CheckOutputs(context, p);
  // An invalid rank still takes part in the exchange (its record says so), so
  // that no other rank waits for it.
  if (!context.device().is_cpu()) {
#ifdef LOSSRT_WITH_CUDA
    CudaRunner runner(context, p);
    return runner.Run(local);
#else
    return absl::UnimplementedError(
        "vocabulary-parallel cross-entropy: built without CUDA");
#endif
  }
  Runner runner(context, p);
  return runner.Run(local);
}

}  // namespace
}  // namespace vocab_parallel

absl::Status VocabParallelCrossEntropyForward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const CrossEntropyOptions& options,
    const Tensor& loss, const Tensor* lse) {
  vocab_parallel::Problem problem;
  problem.pass = vocab_parallel::Pass::kForward;
  problem.shard = &shard;
  problem.logits = &logits;
  problem.targets = &targets;
  problem.options = &options;
  problem.loss = &loss;
  problem.lse = lse;
  return vocab_parallel::Run(context, problem);
}

absl::Status VocabParallelCrossEntropyBackward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const Tensor& lse, const Tensor& grad_loss,
    const CrossEntropyOptions& options, const Tensor& grad_logits) {
  vocab_parallel::Problem problem;
  problem.pass = vocab_parallel::Pass::kBackward;
  problem.shard = &shard;
  problem.logits = &logits;
  problem.targets = &targets;
  problem.options = &options;
  problem.lse = &lse;
  problem.grad_loss = &grad_loss;
  problem.grad_logits = &grad_logits;
  return vocab_parallel::Run(context, problem);
}

absl::Status VocabParallelCrossEntropyForwardBackward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const CrossEntropyOptions& options,
    const Tensor& loss, const Tensor* lse, const Tensor& grad_logits,
    const Tensor* grad_loss) {
  vocab_parallel::Problem problem;
  problem.pass = vocab_parallel::Pass::kForwardBackward;
  problem.shard = &shard;
  problem.logits = &logits;
  problem.targets = &targets;
  problem.options = &options;
  problem.loss = &loss;
  problem.lse = lse;
  problem.grad_loss = grad_loss;
  problem.grad_logits = &grad_logits;
  return vocab_parallel::Run(context, problem);
}

}  // namespace lossrt
