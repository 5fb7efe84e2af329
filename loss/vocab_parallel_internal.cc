// The host pieces shared by the vocabulary-parallel ops
// (vocab_parallel_internal.h): record hashes and verdict, and the CPU twins of
// the row kernels (vocab_parallel_kernels.cu), whose per-row math follows the
// cross-entropy's CPU op (loss/cross_entropy_cpu.cc) term for term, so that
// the results differ from the single-device ops only by the order of the sums
// over the vocabulary; and the runners' plumbing (the record exchange, the
// target weights, the chunk arguments, the statistics' all-reduces).
#include "loss/vocab_parallel_internal.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "loss/cross_entropy_cpu.h"
#include "loss/loss_checks.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "absl/container/inlined_vector.h"
#include "runtime/cuda_status.h"
#endif

namespace lossrt {
namespace vocab_parallel {
namespace {

using RowMajor =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// FNV-1a over bytes, folded into `hash`.
uint64_t Fnv(uint64_t hash, const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

template <typename T>
uint64_t FnvValue(uint64_t hash, const T& value) {
  return Fnv(hash, &value, sizeof(value));
}

int64_t RowTarget(const ChunkArgs& args, int64_t i) {
  return args.targets_i64 ? static_cast<const int64_t*>(args.targets)[i]
                          : static_cast<const int32_t*>(args.targets)[i];
}

}  // namespace

int64_t OptionsHash(const CrossEntropyOptions& ce) {
  uint64_t hash = 14695981039346656037ull;
  hash = FnvValue(hash, ce.ignore_index);
  hash = FnvValue(hash, static_cast<int>(ce.reduction));
  hash = FnvValue(hash, ce.label_smoothing);
  hash = FnvValue(hash, ce.z_loss);
  hash = FnvValue(hash, ce.softcap);
  hash = FnvValue(hash, ce.entropy_weight);
  hash = FnvValue(hash, ce.class_weights.has_value());
  hash = FnvValue(hash, ce.validate_targets);
  return static_cast<int64_t>(hash >> 1);
}

int64_t TargetsHash(const Tensor& targets) {
  const uint64_t hash =
      Fnv(14695981039346656037ull, targets.data,
          static_cast<size_t>(targets.dim(0) * DTypeSize(targets.dtype)));
  return static_cast<int64_t>(hash >> 1);
}

float LoadHost(const void* base, DType type, int64_t i) {
  switch (type) {
    case DType::kBF16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return F16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

void StoreHost(void* base, DType type, int64_t i, float value) {
  switch (type) {
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(value);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToF16Bits(value);
      break;
    default:
      static_cast<float*>(base)[i] = value;
  }
}

int64_t LoadTarget(const Tensor& targets, int64_t i) {
  return targets.dtype == DType::kI64 ? targets.data_as<const int64_t>()[i]
                                      : targets.data_as<const int32_t>()[i];
}

absl::Status CheckRecords(const int64_t* records, int world_size, int rank,
                          bool validate_targets, absl::string_view op,
                          Agreed& agreed) {
  for (int r = 0; r < world_size; ++r) {
    const int64_t* rec = records + r * kFields;
    // The device's verdict on a rank's targets and class weights (CUDA; 0 on
    // the CPU, which checks them before the exchange).
    const bool rejected = rec[kOk] == 0 || rec[kNegativeWeights] > 0 ||
                          (validate_targets && rec[kInvalid] > 0);
    if (rejected && r != rank) {
      return InvalidArgument(
          op, ": rank ", r,
          " rejected its inputs (see its error); nothing was written");
    }
  }
  const int64_t* first = records;
  int64_t expected_offset = 0;
  int64_t max_rows = first[kChunkRows];
  for (int r = 0; r < world_size; ++r) {
    const int64_t* rec = records + r * kFields;
    for (Field field : {kVocab, kTokens, kHidden, kPass}) {
      if (rec[field] != first[field]) {
        const char* names[] = {"", "", "", "vocab", "N", "H", "", "pass"};
        return InvalidArgument("vocab shard: rank ", r, "'s ", names[field],
                               " = ", rec[field], " differs from rank 0's ",
                               first[field]);
      }
    }
    if (rec[kOptions] != first[kOptions]) {
      return InvalidArgument(
          "vocab shard: rank ", r,
          "'s cross-entropy options (or whether it has class weights) differ "
          "from rank 0's");
    }
    if (rec[kTargets] != first[kTargets]) {
      return InvalidArgument("vocab shard: rank ", r,
                             "'s targets differ from rank 0's");
    }
    if (rec[kOffset] != expected_offset) {
      return InvalidArgument("vocab shard: rank ", r, "'s slice starts at ",
                             rec[kOffset], ", expected ", expected_offset,
                             " (slices contiguous in rank order from 0)");
    }
    expected_offset += rec[kLocalVocab];
    max_rows = std::min(max_rows, rec[kChunkRows]);
  }
  if (expected_offset != first[kVocab]) {
    return InvalidArgument("vocab shard: the ranks' slices cover [0, ",
                           expected_offset, "), not the vocabulary [0, ",
                           first[kVocab], ")");
  }
  const int64_t n = first[kTokens];
  if (n > 0) {
    const int64_t chunks = CeilDiv(n, max_rows);
    agreed.chunk_rows = CeilDiv(n, chunks);
    agreed.num_chunks = chunks;
  }
  return absl::OkStatus();
}

void SoftcapCpu(float* z, int64_t rows, int64_t cols, int64_t ld, float cap) {
  if (cap <= 0.0f) return;
  const float inv_cap = 1.0f / cap;
  MatrixMap map(z, rows, cols, Eigen::OuterStride<>(ld));  // [rows, cols]
  map = cap * (map * inv_cap).array().tanh().matrix();
}

void RowMaxCpu(const ChunkArgs& args) {
  const MatrixMap z(args.logits, args.rows, args.cols,
                    Eigen::OuterStride<>(args.ld));  // [rows, cols]
  for (int64_t i = 0; i < args.rows; ++i) args.row_max[i] = z.row(i).maxCoeff();
}

void RowSumsCpu(const ChunkArgs& args) {
  const bool entropy = args.entropy_weight != 0.0f;
  const double s = args.label_smoothing;
  const int64_t v = args.cols;
  for (int64_t i = 0; i < args.rows; ++i) {
    const float m = args.row_max[i];
    const float* zr = args.logits + i * args.ld;  // [cols]
    double sum_exp = 0.0, smooth = 0.0, centered = 0.0, gap = 0.0;
    for (int64_t j = 0; j < v; ++j) {
      const float d = zr[j] - m;
      const float e = std::exp(d);
      sum_exp += e;
      if (entropy && e > 0.0f) centered += static_cast<double>(e) * d;
      if (s > 0.0) {
        smooth +=
            (args.class_weights != nullptr ? args.class_weights[j] : 1.0f) *
            static_cast<double>(m - zr[j]);
      }
    }
    const int64_t t = RowTarget(args, i);
    if (t >= args.offset && t < args.offset + v)
      gap = static_cast<double>(m) - zr[t - args.offset];
    double* out = args.sums + i * kRowSums;
    out[kSumExp] = sum_exp;
    out[kSmoothSum] = smooth;
    out[kTargetGap] = gap;
    out[kCentered] = centered;
  }
}

void RowFinishCpu(const ChunkArgs& args) {
  const int64_t v = args.cols;
  const int64_t offset = args.offset;
  const int64_t vocab = args.vocab;
  const double s = args.label_smoothing;
  const float cap = args.softcap;
  const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  const bool entropy = args.entropy_weight != 0.0f;
  const double weight_total = args.weight_total;
  for (int64_t i = 0; i < args.rows; ++i) {
    const int64_t t = RowTarget(args, i);
    const bool ignored = t == args.ignore_index;
    const bool valid = !ignored && t >= 0 && t < vocab;
    float* zr = args.logits + i * args.ld;  // [cols]
    double shift = 0.0, log_sum = 0.0, lse = 0.0, row_entropy = 0.0;
    if (args.fused) {
      const double* sum = args.sums + i * kRowSums;
      shift = args.row_max[i];
      log_sum = std::log(sum[kSumExp]);
      lse = shift + log_sum;
      args.lse[i] = static_cast<float>(lse);
      if (entropy && valid) {
        row_entropy = args.row_max[i] == std::numeric_limits<float>::infinity()
                          ? kNaN
                          : log_sum - sum[kCentered] / sum[kSumExp];
      }
      if (!valid) {
        if (args.row_loss != nullptr) args.row_loss[i] = ignored ? 0.0f : kNaN;
      } else {
        const double w_t = args.target_weight[i];
        const double nll = sum[kTargetGap] + log_sum;
        double ce = (1.0 - s) * w_t * nll;
        if (s > 0.0)
          ce += s / vocab * (weight_total * log_sum + sum[kSmoothSum]);
        double zl = args.z_loss > 0.0f ? args.z_loss * lse * lse : 0.0;
        if (entropy) zl -= args.entropy_weight * row_entropy;
        if (args.row_loss != nullptr) {
          args.row_loss[i] = static_cast<float>(
              args.mean ? ce * args.ce_scale + zl * args.z_scale : ce + zl);
        }
      }
    } else {
      shift = args.lse[i];
      lse = shift;
    }
    if (!args.backward) continue;

    if (!valid) {
      std::fill(zr, zr + v, ignored ? 0.0f : kNaN);
      continue;
    }
    // The coefficients of loss/cross_entropy_cpu.cc's WriteGradRow.
    double g = 1.0;
    if (args.grad_loss != nullptr)
      g = args.grad_loss[args.grad_loss_per_row ? i : 0];
    g = static_cast<float>(args.dlogits_scale * g);
    const double w_t = args.target_weight[i];
    const double ce_scale = g * args.ce_scale, z_scale = g * args.z_scale;
    const double target_coef = ce_scale * (1.0 - s) * w_t;
    const double smooth_w = ce_scale * s / vocab;
    const double z_term =
        args.z_loss > 0.0f ? 2.0 * z_scale * args.z_loss * lse : 0.0;
    const double coef_d = target_coef + smooth_w * weight_total + z_term;
    const double target_offset = smooth_w * (weight_total - w_t) + z_term;
    const double ent_coef = z_scale * args.entropy_weight;
    // The target's gradient (its owner only), through expm1 as the
    // single-device op.
    float target_grad = 0.0f;
    const bool owner = t >= offset && t < offset + v;
    if (owner) {
      const double z_t = zr[t - offset];
      const double d_t = (z_t - shift) - log_sum;
      double dz_t = coef_d * std::expm1(d_t) + target_offset;
      if (ent_coef != 0.0 && std::exp(d_t) > 0)
        dz_t += ent_coef * std::exp(d_t) * (d_t + row_entropy);
      if (cap > 0.0f) {
        const double q = z_t * inv_cap;
        dz_t *= 1.0 - q * q;
      }
      target_grad = static_cast<float>(dz_t);
    }
    const float shift_f = static_cast<float>(shift);
    const float log_sum_f = static_cast<float>(log_sum);
    const float coef = static_cast<float>(coef_d);
    const float smooth_wf = static_cast<float>(smooth_w);
    const float ent_f = static_cast<float>(ent_coef);
    const float entropy_f = static_cast<float>(row_entropy);
    for (int64_t j = 0; j < v; ++j) {
      const float zj = zr[j];
      const float d = (zj - shift_f) - log_sum_f;
      const float e = std::exp(d);
      float dz;
      if (ent_coef != 0.0) {
        dz = e > 0.0f ? e * (coef + ent_f * (d + entropy_f)) : 0.0f;
      } else {
        dz = coef * e;
      }
      if (smooth_w != 0.0) {
        dz -= smooth_wf *
              (args.class_weights != nullptr ? args.class_weights[j] : 1.0f);
      }
      if (cap > 0.0f) dz *= 1.0f - (zj * inv_cap) * (zj * inv_cap);
      zr[j] = dz;
    }
    if (owner) zr[t - offset] = target_grad;
    // The single-device ops' dlogits are in the operand dtype.
    if (args.grad_type != DType::kF32) {
      for (int64_t j = 0; j < v; ++j)
        zr[j] = RoundToDType(args.grad_type, zr[j]);
    }
  }
}

ChunkRegions RegionsOf(void* buffer, int64_t max_rows, int64_t ld) {
  ChunkRegions r;
  char* base = static_cast<char*>(buffer);
  r.logits = reinterpret_cast<float*>(base);
  base += Aligned(4 * max_rows * ld);
  r.row_max = reinterpret_cast<float*>(base);
  base += Aligned(4 * max_rows);
  r.sums = reinterpret_cast<double*>(base);
  base += Aligned(8 * kRowSums * max_rows);
  r.partial = reinterpret_cast<float*>(base);
  return r;
}

absl::Status CheckSliceInVocab(const Slice& slice, absl::string_view units,
                               absl::string_view of) {
  RETURN_IF_ERROR(ce::CheckVocab(slice.vocab, "shard.vocab"));
  if (slice.offset < 0 || slice.offset > slice.vocab - slice.local_vocab) {
    return InvalidArgument("shard: ", units, " [", slice.offset, ", ",
                           slice.offset + slice.local_vocab, ") of ", of,
                           " are outside the vocabulary [0, ", slice.vocab,
                           ")");
  }
  return absl::OkStatus();
}

void FillRecord(const CallFacts& facts, const CrossEntropyOptions& options,
                int64_t* fields) {
  fields[kOk] = 1;
  fields[kOffset] = facts.slice.offset;
  fields[kLocalVocab] = facts.slice.local_vocab;
  fields[kVocab] = facts.slice.vocab;
  fields[kTokens] = facts.tokens;
  fields[kHidden] = facts.hidden;
  fields[kChunkRows] = facts.chunk_rows;
  fields[kPass] = facts.pass;
  fields[kOptions] = OptionsHash(options);
}

absl::StatusOr<int64_t*> RecordArray(Context& context, int64_t* in_block,
                                     int world_size, Buffer& fallback) {
  if (in_block != nullptr) return in_block;
  ASSIGN_OR_RETURN(
      fallback, context.allocator().Allocate(8 * kFields * (world_size + 1)));
  return fallback.data_as<int64_t>();
}

namespace {

Tensor VectorOn(const Context& context, void* data, DType dtype,
                int64_t count) {
  return Tensor::Of(data, dtype, {count}, context.device());
}

}  // namespace

absl::Status ExchangeRecordsCpu(Context& context, Communicator& comm,
                                int64_t* in_block, const absl::Status& local,
                                const CallFacts& facts,
                                const CrossEntropyOptions& options,
                                const Tensor& targets, absl::string_view op,
                                Agreed& agreed) {
  const int world = comm.world_size();
  Buffer fallback;
  ASSIGN_OR_RETURN(int64_t * record,
                   RecordArray(context, in_block, world, fallback));
  int64_t* mine = record + world * kFields;
  std::fill(mine, mine + kFields, 0);
  if (local.ok()) {
    FillRecord(facts, options, mine);
    mine[kTargets] = TargetsHash(targets);
  }
  RETURN_IF_ERROR(comm.AllGather(
      VectorOn(context, mine, DType::kI64, kFields),
      VectorOn(context, record, DType::kI64, world * kFields), context));
  RETURN_IF_ERROR(local);
  return CheckRecords(record, world, comm.rank(), options.validate_targets, op,
                      agreed);
}

absl::Status ScanTargetsHost(const Tensor& targets, const Slice& slice,
                             const float* class_weights,
                             const CrossEntropyOptions& options,
                             ce::TargetStats& stats) {
  const int64_t n = targets.dim(0);
  stats = ce::ScanTargetsCpu(targets.data, targets.dtype == DType::kI64, n,
                             slice.vocab, options.ignore_index, nullptr);
  stats.negative_weights = 0;
  if (class_weights != nullptr) {
    for (int64_t j = 0; j < slice.local_vocab; ++j) {
      if (!(class_weights[j] >= 0.0f)) ++stats.negative_weights;
    }
  }
  return ce::CheckTargetStats(stats, options, n, slice.vocab);
}

absl::Status TargetWeightsCpu(Context& context, Communicator& comm,
                              const Tensor& targets, const Slice& slice,
                              const float* class_weights, int64_t ignore_index,
                              double* target_weight, double& ce_denominator) {
  const int64_t n = targets.dim(0);
  const int64_t v = slice.local_vocab;
  const int64_t offset = slice.offset;
  if (class_weights != nullptr) {
    double local_total = 0.0;
    for (int64_t j = 0; j < v; ++j) local_total += class_weights[j];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = LoadTarget(targets, i);
      target_weight[i] =
          t >= offset && t < offset + v ? class_weights[t - offset] : 0.0;
    }
    target_weight[n] = local_total;
    const Tensor all = VectorOn(context, target_weight, DType::kF64, n + 1);
    RETURN_IF_ERROR(comm.AllReduce(all, all, ReduceOp::kSum, context));
  } else {
    std::fill(target_weight, target_weight + n, 1.0);
    target_weight[n] = static_cast<double>(slice.vocab);
  }
  ce_denominator = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = LoadTarget(targets, i);
    if (t != ignore_index && t >= 0 && t < slice.vocab)
      ce_denominator += target_weight[i];
  }
  return absl::OkStatus();
}

ChunkArgs CallArgs(const CrossEntropyOptions& options, const Slice& slice,
                   int64_t ld, const Tensor& targets,
                   const float* class_weights, bool fused, bool backward,
                   DType grad_type) {
  ChunkArgs args;
  args.ld = ld;
  args.cols = slice.local_vocab;
  args.offset = slice.offset;
  args.vocab = slice.vocab;
  args.targets_i64 = targets.dtype == DType::kI64;
  args.ignore_index = options.ignore_index;
  args.label_smoothing = options.label_smoothing;
  args.z_loss = options.z_loss;
  args.softcap = options.softcap;
  args.entropy_weight = options.entropy_weight;
  args.class_weights = class_weights;
  args.mean = options.reduction == Reduction::kMean;
  args.fused = fused;
  args.backward = backward;
  args.grad_type = grad_type;
  args.grad_loss_per_row = options.reduction == Reduction::kNone;
  args.dlogits_scale = 1.0f;
  return args;
}

void MeanScales(const CrossEntropyOptions& options, double ce_denominator,
                double z_denominator, ChunkArgs& args) {
  args.ce_scale = 1.0;
  args.z_scale = 1.0;
  if (options.reduction == Reduction::kMean) {
    args.ce_scale = ce_denominator > 0 ? 1.0 / ce_denominator : 0.0;
    args.z_scale = z_denominator > 0 ? 1.0 / z_denominator : 0.0;
  }
}

ChunkArgs RowArgs(const ChunkArgs& call, const ChunkRegions& regions,
                  const Tensor& targets, const Tensor* grad_loss,
                  int64_t row_begin, int64_t row_end, float* lse,
                  float* row_loss, const double* target_weight) {
  ChunkArgs args = call;
  args.logits = regions.logits;
  args.rows = row_end - row_begin;
  args.row_max = regions.row_max;
  args.sums = regions.sums;
  args.targets = static_cast<const char*>(targets.data) +
                 row_begin * DTypeSize(targets.dtype);
  args.lse = lse + row_begin;
  args.row_loss = row_loss != nullptr ? row_loss + row_begin : nullptr;
  args.target_weight =
      target_weight != nullptr ? target_weight + row_begin : nullptr;
  if (grad_loss != nullptr) {
    args.grad_loss = grad_loss->data_as<const float>() +
                     (args.grad_loss_per_row ? row_begin : 0);
  }
  return args;
}

absl::Status GlobalRowStatsCpu(Context& context, Communicator& comm,
                               const ChunkArgs& args) {
  RowMaxCpu(args);
  const Tensor maxes = VectorOn(context, args.row_max, DType::kF32, args.rows);
  RETURN_IF_ERROR(comm.AllReduce(maxes, maxes, ReduceOp::kMax, context));
  RowSumsCpu(args);
  const Tensor all =
      VectorOn(context, args.sums, DType::kF64, args.rows * kRowSums);
  return comm.AllReduce(all, all, ReduceOp::kSum, context);
}

absl::Status CheckStatTensors(const Context& context, Reduction reduction,
                              int64_t tokens, const Tensor* loss,
                              const Tensor* lse, const Tensor* grad_loss) {
  if (loss != nullptr) {
    RETURN_IF_ERROR(
        ce::CheckLossTensor(*loss, reduction, tokens, context, "loss"));
  }
  if (lse != nullptr)
    RETURN_IF_ERROR(ce::CheckLseTensor(*lse, tokens, context));
  if (grad_loss != nullptr) {
    RETURN_IF_ERROR(ce::CheckLossTensor(*grad_loss, reduction, tokens, context,
                                        "grad_loss"));
  }
  return absl::OkStatus();
}

void AddCallTensors(const CrossEntropyOptions& options, const Tensor* grad_loss,
                    const Tensor* loss, const Tensor* lse, bool forward,
                    std::vector<NamedTensor>& inputs,
                    std::vector<NamedTensor>& outputs) {
  if (options.class_weights.has_value())
    inputs.push_back({&*options.class_weights, "class_weights"});
  if (grad_loss != nullptr) inputs.push_back({grad_loss, "grad_loss"});
  if (loss != nullptr) outputs.push_back({loss, "loss"});
  if (lse != nullptr) (forward ? outputs : inputs).push_back({lse, "lse"});
}

absl::Status CheckDisjoint(const std::vector<NamedTensor>& outputs,
                           const std::vector<NamedTensor>& inputs,
                           const Tensor* in_place_output,
                           const Tensor* in_place_input) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (const NamedTensor& input : inputs) {
      if (in_place_output != nullptr && outputs[i].first == in_place_output &&
          input.first == in_place_input)
        continue;
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

#ifdef LOSSRT_WITH_CUDA
absl::StatusOr<cudaStream_t> EnterDevice(Context& context,
                                         std::optional<ScopedDevice>& device) {
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  device.emplace(std::move(scoped));
  return CudaStreamOf(context);
}

absl::Status ExchangeRecordsCuda(
    Context& context, Communicator& comm, cudaStream_t stream,
    int64_t* in_block, const absl::Status& local, const CallFacts& facts,
    const CrossEntropyOptions& options, const Tensor& targets,
    const float* class_weights, absl::string_view op, Agreed& agreed,
    Denominators& denominators) {
  const int world = comm.world_size();
  const int rank = comm.rank();
  Buffer fallback;
  // device [world + 1, kFields]
  ASSIGN_OR_RETURN(int64_t * record,
                   RecordArray(context, in_block, world, fallback));
  int64_t* mine = record + world * kFields;
  RecordArgs args;
  args.record = mine;
  if (local.ok()) {
    FillRecord(facts, options, args.fields);
    args.scan = true;
    args.targets = targets.data;
    args.targets_i64 = targets.dtype == DType::kI64;
    args.tokens = facts.tokens;
    args.vocab = facts.slice.vocab;
    args.ignore_index = options.ignore_index;
    args.offset = facts.slice.offset;
    args.local_vocab = facts.slice.local_vocab;
    args.class_weights = class_weights;
  }
  CUDA_RETURN_IF_ERROR(LaunchRecord(args, stream));
  RETURN_IF_ERROR(comm.AllGather(
      VectorOn(context, mine, DType::kI64, kFields),
      VectorOn(context, record, DType::kI64, world * kFields), context));
  // The call's one wait for the stream: the records on the host.
  absl::InlinedVector<int64_t, 16 * kFields> records(world * kFields);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(records.data(), record,
                                       8 * kFields * world,
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  RETURN_IF_ERROR(local);
  const int64_t* own = records.data() + rank * kFields;
  ce::TargetStats stats{};
  stats.invalid = own[kInvalid];
  stats.negative_weights = own[kNegativeWeights];
  RETURN_IF_ERROR(
      ce::CheckTargetStats(stats, options, facts.tokens, facts.slice.vocab));
  RETURN_IF_ERROR(CheckRecords(records.data(), world, rank,
                               options.validate_targets, op, agreed));

  // The mean's denominators and W from the ranks' sums, in rank order.
  denominators.z = static_cast<double>(own[kCounted]);
  denominators.ce = denominators.z;
  denominators.weight_total = static_cast<double>(facts.slice.vocab);
  if (class_weights != nullptr) {
    denominators.ce = 0.0;
    denominators.weight_total = 0.0;
    for (int r = 0; r < world; ++r) {
      double target_weights = 0.0, weights = 0.0;
      std::memcpy(&target_weights, &records[r * kFields + kTargetWeightSum], 8);
      std::memcpy(&weights, &records[r * kFields + kWeightSum], 8);
      denominators.ce += target_weights;
      denominators.weight_total += weights;
    }
  }
  return absl::OkStatus();
}

absl::Status TargetWeightsCuda(Context& context, Communicator& comm,
                               cudaStream_t stream, const Tensor& targets,
                               const Slice& slice, const float* class_weights,
                               double* target_weight) {
  const int64_t n = targets.dim(0);
  TargetWeightArgs tw;
  tw.targets = targets.data;
  tw.targets_i64 = targets.dtype == DType::kI64;
  tw.tokens = n;
  tw.offset = slice.offset;
  tw.local_vocab = slice.local_vocab;
  tw.class_weights = class_weights;
  tw.target_weight = target_weight;
  CUDA_RETURN_IF_ERROR(LaunchTargetWeights(tw, stream));
  const Tensor all = VectorOn(context, target_weight, DType::kF64, n);
  return comm.AllReduce(all, all, ReduceOp::kSum, context);
}

absl::Status GlobalRowStatsCuda(Context& context, Communicator& comm,
                                cudaStream_t stream, const ChunkArgs& args) {
  CUDA_RETURN_IF_ERROR(LaunchRowMax(args, stream));
  const Tensor maxes = VectorOn(context, args.row_max, DType::kF32, args.rows);
  RETURN_IF_ERROR(comm.AllReduce(maxes, maxes, ReduceOp::kMax, context));
  CUDA_RETURN_IF_ERROR(LaunchRowSums(args, stream));
  const Tensor sums =
      VectorOn(context, args.sums, DType::kF64, args.rows * kRowSums);
  return comm.AllReduce(sums, sums, ReduceOp::kSum, context);
}
#endif  // LOSSRT_WITH_CUDA

}  // namespace vocab_parallel
}  // namespace lossrt
