// Tests of the linear cross-entropy (loss/linear_cross_entropy.h) through its
// public API on every backend (the CPU always, cuda:0 when one is usable),
// against a double-precision reference: logits = hidden @ weight^T + bias
// computed in double from the same (rounded) inputs, then the cross-entropy's
// double reference (loss/cross_entropy_reference.h) for the loss, lse and
// dlogits, and the gradients of hidden, weight and bias from those in double.
//
// One parameterized case per backend x operand dtype x scenario runs: the fused
// call (with and without grad_loss), a repeat that must give the same bytes,
// the split forward (loss and lse) and the split backward from that lse.
// Scenarios cover bias (none, f32, operand dtype), every option, both
// reductions and none, ignored tokens, i32 targets, padded rows, the two
// schedules with the smallest budget they accept (many chunks whose boundaries
// do not divide N or V), V not a multiple of 8 and N = 1. Then plan invariants,
// N = 0, all tokens ignored, bad inputs (nothing written), on the GPU the same
// bytes on a fresh context, a tuned one and one with GEMM tuning off, and the
// precision of f32 gradients of 16-bit operands (the products of the rounded
// dlogits, not the exact gradients), and finite differences on the CPU.
//
// Outputs are poisoned with NaN bit patterns before every call: an element left
// unwritten is caught, and row padding must stay poisoned. Inputs' row padding
// is NaN too: reading it would poison the results.
//
// Tolerances (the issue's): per-token losses and lse within 1e-5 relative (plus
// two f32 ulps of |lse|, the resolution of an f32 lse when the loss is a small
// difference lse - z_t), reduced loss 1e-5 relative; gradients norm-wise within
// 1e-2 for 16-bit operands and 1e-5 for f32 (TF32 off).
#include "loss/linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "loss/cross_entropy_reference.h"
#include "loss/linear_cross_entropy_internal.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/status_assertions.h"
#include "tests/tensor_image.h"

namespace lossrt {
namespace {

using reference::CrossEntropyReference;
using reference::ReferenceOptions;
using reference::ReferenceReduction;
using reference::ReferenceResult;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr double kTwoUlpsF32 = 0x1p-22;

// ---------------------------------------------------------------------------------------
// Host images of tensors.

using test::Bytes;
using test::IsPoison;
using test::Load;
using test::Poison;
using test::Store;

double RoundTo(DType dtype, double value) {
  Bytes image(4);
  Store(dtype, image, 0, value);
  return Load(dtype, image, 0);
}

// ---------------------------------------------------------------------------------------
// A tensor on a backend with its host image: [rows, cols] (or a vector /
// scalar) with `stride` elements between rows.

struct Array {
  DType dtype = DType::kF32;
  Shape shape;
  int64_t stride = 0;  // 0 = contiguous
  Bytes host;
  Buffer buffer;
  Tensor view;  // on the backend

  int64_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t row_stride() const { return stride != 0 ? stride : cols(); }
  int64_t Span() const {
    return rows() == 0 ? 0 : (rows() - 1) * row_stride() + cols();
  }
  // Where logical element `i` (row-major) lives in the image.
  int64_t Index(int64_t i) const {
    return i / cols() * row_stride() + i % cols();
  }
  int64_t numel() const { return rows() * cols(); }
  double Get(int64_t i) const { return Load(dtype, host, Index(i)); }
  void Set(int64_t i, double value) { Store(dtype, host, Index(i), value); }
  std::vector<double> Values() const {
    std::vector<double> values(numel());
    for (int64_t i = 0; i < numel(); ++i) values[i] = Get(i);
    return values;
  }
};

// Copies raw bytes through CopyTensor, as a flat tensor of the array's dtype.
absl::Status CopyFlat(Context& context, const Array& array, bool upload) {
  const int64_t span = std::max<int64_t>(array.Span(), 1);
  const Tensor host = Tensor::Of(const_cast<uint8_t*>(array.host.data()),
                                 array.dtype, {span}, Device::Cpu());
  const Tensor device =
      Tensor::Of(array.buffer.data(), array.dtype, {span}, context.device());
  return upload ? CopyTensor(host, device, context)
                : CopyTensor(device, host, context);
}

absl::StatusOr<Array> MakeArray(Context& context, DType dtype, Shape shape,
                                int64_t stride = 0) {
  Array array;
  array.dtype = dtype;
  array.shape = shape;
  array.stride = stride;
  const int64_t span = std::max<int64_t>(array.Span(), 1);
  array.host.assign(span * DTypeSize(dtype), 0);
  Poison(dtype, array.host);
  ASSIGN_OR_RETURN(array.buffer,
                   context.allocator().Allocate(span * DTypeSize(dtype)));
  array.view = Tensor::Of(array.buffer.data(), dtype, shape, context.device(),
                          shape.size() == 2 ? stride : 0);
  RETURN_IF_ERROR(CopyFlat(context, array, /*upload=*/true));
  return array;
}

absl::Status Upload(Context& context, const Array& array) {
  return CopyFlat(context, array, true);
}
absl::Status Download(Context& context, Array& array) {
  RETURN_IF_ERROR(CopyFlat(context, array, false));
  return context.Synchronize();
}
absl::Status PoisonArray(Context& context, Array& array) {
  Poison(array.dtype, array.host);
  return Upload(context, array);
}

// ---------------------------------------------------------------------------------------
// Scenarios.

enum class BiasKind { kNone, kF32, kOperand };

struct Scenario {
  std::string name;
  int64_t n = 37;
  int64_t h = 24;
  int64_t v = 203;
  BiasKind bias = BiasKind::kNone;
  Reduction reduction = Reduction::kMean;
  double ignore_fraction = 0.0;
  float smoothing = 0.0f;
  float z_loss = 0.0f;
  float softcap = 0.0f;
  bool class_weights = false;
  bool d_hidden_f32 = false;  // else the operand dtype
  bool d_weight_f32 = true;
  bool d_bias_f32 = true;
  bool targets_i32 = false;
  int64_t pad = 0;  // row padding of hidden, weight, d_hidden and d_weight
  LinearCrossEntropySchedule schedule = LinearCrossEntropySchedule::kAuto;
  bool smallest_budget =
      false;               // the smallest budget the plan accepts: many chunks
  int64_t chunk_rows = 0;  // LinearCrossEntropyOptions::chunk_rows
  double logit_scale = 1.0;
  // LinearCrossEntropyOptions::operand_dtype_logits (16-bit operands only:
  // AllCases skips f32). Its scenarios take hidden and weight on a grid of
  // 1/32 in [-1, 1], whose logits' fp32 sums are exact, so that the GPU's
  // rounding of them to 16 bits is the reference's rounding of the exact ones.
  bool operand_dtype_logits = false;
};

std::vector<Scenario> Scenarios() {
  using S = LinearCrossEntropySchedule;
  std::vector<Scenario> all;
  Scenario s;
  s.name = "plain";
  all.push_back(s);

  s = Scenario();
  s.name = "bias_f32_sum_ignored";
  s.bias = BiasKind::kF32;
  s.reduction = Reduction::kSum;
  s.ignore_fraction = 0.2;
  all.push_back(s);

  s = Scenario();
  s.name = "bias_operand_none_i32";
  s.bias = BiasKind::kOperand;
  s.d_bias_f32 = false;
  s.reduction = Reduction::kNone;
  s.ignore_fraction = 0.2;
  s.targets_i32 = true;
  all.push_back(s);

  s = Scenario();
  s.name = "smoothing_weights";
  s.smoothing = 0.1f;
  s.class_weights = true;
  s.ignore_fraction = 0.15;
  all.push_back(s);

  s = Scenario();
  s.name = "zloss_softcap";
  s.z_loss = 1e-2f;
  s.softcap = 3.0f;
  s.logit_scale = 3.0;
  s.reduction = Reduction::kSum;
  all.push_back(s);

  s = Scenario();
  s.name = "everything_token_chunks_small";
  s.bias = BiasKind::kOperand;
  s.d_bias_f32 = false;
  s.d_weight_f32 = false;  // an fp32 accumulator rounded once
  s.smoothing = 0.05f;
  s.z_loss = 1e-3f;
  s.softcap = 5.0f;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.schedule = S::kTokenChunks;
  s.smallest_budget = true;
  all.push_back(s);

  s = Scenario();
  s.name = "everything_two_pass_small";
  s.bias = BiasKind::kOperand;
  s.d_bias_f32 = false;
  s.d_weight_f32 = false;
  s.smoothing = 0.05f;
  s.z_loss = 1e-3f;
  s.softcap = 5.0f;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.schedule = S::kTwoPass;
  s.smallest_budget = true;
  all.push_back(s);

  s = Scenario();
  s.name = "two_pass_none_padded";
  s.reduction = Reduction::kNone;
  s.pad = 3;
  s.targets_i32 = true;
  s.d_hidden_f32 = true;
  s.bias = BiasKind::kF32;
  s.schedule = S::kTwoPass;
  s.smallest_budget = true;
  s.n = 45;
  s.v = 301;
  all.push_back(s);

  s = Scenario();
  s.name = "token_chunks_padded_mean";
  s.pad = 5;
  s.bias = BiasKind::kF32;
  s.ignore_fraction = 0.3;
  s.schedule = S::kTokenChunks;
  s.smallest_budget = true;
  all.push_back(s);

  s = Scenario();
  s.name = "one_token";
  s.n = 1;
  s.h = 16;
  s.v = 50;
  s.bias = BiasKind::kF32;
  s.smoothing = 0.1f;
  all.push_back(s);

  s = Scenario();
  s.name = "one_token_two_pass";
  s.n = 1;
  s.h = 16;
  s.v = 50;
  s.schedule = S::kTwoPass;
  s.smallest_budget = true;
  all.push_back(s);

  s = Scenario();
  s.name = "wide_vocab";
  s.n = 64;
  s.h = 40;
  s.v = 1001;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.z_loss = 1e-4f;
  all.push_back(s);

  s = Scenario();
  s.name = "everything_vocab_slices_small";
  s.bias = BiasKind::kOperand;
  s.d_bias_f32 = false;
  s.d_weight_f32 = false;
  s.smoothing = 0.05f;
  s.z_loss = 1e-3f;
  s.softcap = 5.0f;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.schedule = S::kVocabSlices;
  s.smallest_budget = true;
  all.push_back(s);

  s = Scenario();
  s.name = "vocab_slices_none_padded";
  s.reduction = Reduction::kNone;
  s.pad = 3;
  s.targets_i32 = true;
  s.d_hidden_f32 = true;
  s.bias = BiasKind::kF32;
  s.schedule = S::kVocabSlices;
  s.smallest_budget = true;
  s.n = 45;
  s.v = 301;
  all.push_back(s);

  s = Scenario();
  s.name = "vocab_slices_mean_weights";
  s.class_weights = true;
  s.smoothing = 0.1f;
  s.ignore_fraction = 0.2;
  s.schedule = S::kVocabSlices;
  s.n = 130;
  s.v = 1001;
  all.push_back(s);

  s = Scenario();
  s.name = "vocab_slices_blocks_16bit_gradients";
  s.n = 130;
  s.v = 20;
  s.bias = BiasKind::kOperand;
  s.d_bias_f32 = false;
  s.d_weight_f32 = false;
  s.ignore_fraction = 0.1;
  s.schedule = S::kVocabSlices;
  s.smallest_budget = true;
  all.push_back(s);

  // The caller's chunk rows: several blocks (and chunks) where the default
  // budget holds every token in one.
  s = Scenario();
  s.name = "vocab_slices_chunk_rows";
  s.n = 130;
  s.v = 1001;
  s.bias = BiasKind::kF32;
  s.schedule = S::kVocabSlices;
  s.chunk_rows = 48;
  all.push_back(s);

  s = Scenario();
  s.name = "token_chunks_chunk_rows";
  s.reduction = Reduction::kSum;
  s.ignore_fraction = 0.2;
  s.schedule = S::kTokenChunks;
  s.chunk_rows = 10;
  all.push_back(s);

  // kCompactChunks (16-bit operands only: AllCases skips f32).
  s = Scenario();
  s.name = "compact_chunks_plain";
  s.bias = BiasKind::kF32;
  s.ignore_fraction = 0.1;
  s.schedule = S::kCompactChunks;
  all.push_back(s);

  s = Scenario();
  s.name = "everything_compact_chunks_small";
  s.bias = BiasKind::kOperand;
  s.d_bias_f32 = false;
  s.d_weight_f32 = false;
  s.smoothing = 0.05f;
  s.z_loss = 1e-3f;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.schedule = S::kCompactChunks;
  s.smallest_budget = true;
  all.push_back(s);

  s = Scenario();
  s.name = "compact_chunks_none_padded";
  s.reduction = Reduction::kNone;
  s.pad = 3;
  s.targets_i32 = true;
  s.d_hidden_f32 = true;
  s.bias = BiasKind::kF32;
  s.schedule = S::kCompactChunks;
  s.smallest_budget = true;
  s.n = 45;
  s.v = 301;
  all.push_back(s);

  s = Scenario();
  s.name = "compact_chunks_rows_mean_weights";
  s.class_weights = true;
  s.smoothing = 0.1f;
  s.ignore_fraction = 0.2;
  s.schedule = S::kCompactChunks;
  s.chunk_rows = 48;
  s.n = 130;
  s.v = 1001;
  s.logit_scale = 3.0;
  all.push_back(s);

  // 16-bit logits (operand_dtype_logits), no bias: kTokenChunks always rounds
  // the logits; kAuto where its plan runs token chunks (the case test's
  // reference follows each call's plan).
  s = Scenario();
  s.name = "operand_logits_plain";
  s.ignore_fraction = 0.1;
  s.operand_dtype_logits = true;
  all.push_back(s);

  s = Scenario();
  s.name = "operand_logits_everything_small";
  s.d_weight_f32 = false;
  s.smoothing = 0.05f;
  s.z_loss = 1e-3f;
  s.softcap = 3.0f;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.smallest_budget = true;
  s.schedule = LinearCrossEntropySchedule::kTokenChunks;
  s.operand_dtype_logits = true;
  all.push_back(s);

  s = Scenario();
  s.name = "operand_logits_auto_small";
  s.d_weight_f32 = false;  // its fp32 accumulator beside the chunks
  s.ignore_fraction = 0.1;
  s.smallest_budget = true;
  s.operand_dtype_logits = true;
  all.push_back(s);

  s = Scenario();
  s.name = "operand_logits_none_padded";
  s.reduction = Reduction::kNone;
  s.pad = 3;
  s.targets_i32 = true;
  s.d_hidden_f32 = true;
  s.smallest_budget = true;
  s.n = 45;
  s.v = 301;
  s.operand_dtype_logits = true;
  all.push_back(s);

  s = Scenario();
  s.name = "one_token_vocab_slices";
  s.n = 1;
  s.h = 16;
  s.v = 50;
  s.schedule = S::kVocabSlices;
  s.smallest_budget = true;
  all.push_back(s);

  s = Scenario();
  s.name = "tiny_vocab";
  s.n = 9;
  s.h = 8;
  s.v = 3;
  s.smoothing = 0.2f;
  s.schedule = S::kTwoPass;
  s.smallest_budget = true;
  all.push_back(s);
  return all;
}

// ---------------------------------------------------------------------------------------
// A problem's inputs (host, exactly representable in their dtypes) and its
// reference.

struct Data {
  // operand_dtype_logits: the dtype the reference rounds its logits to.
  std::optional<DType> logits_dtype;
  std::vector<double> hidden;  // [N, H]
  std::vector<double> weight;  // [V, H]
  std::vector<double> bias;    // [V] or empty
  std::vector<int64_t> targets;
  std::vector<double> class_weights;  // [V] or empty
};

constexpr int64_t kIgnore = -100;

Data MakeData(const Scenario& s, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  Data d;
  // Logits of standard deviation about logit_scale.
  const double hidden_scale = s.logit_scale;
  const double weight_scale = 1.0 / std::sqrt(static_cast<double>(s.h));
  if (s.operand_dtype_logits) {
    // On the 1/32 grid: products are multiples of 2^-10 below 1, so the
    // logits' sums (|sum| <= H) are exact in fp32 for H < 2^13.
    d.logits_dtype = dtype;
    std::uniform_int_distribution<int> grid(-32, 32);
    for (int64_t i = 0; i < s.n * s.h; ++i)
      d.hidden.push_back(grid(rng) / 32.0);
    for (int64_t i = 0; i < s.v * s.h; ++i)
      d.weight.push_back(grid(rng) / 32.0);
  } else {
    for (int64_t i = 0; i < s.n * s.h; ++i)
      d.hidden.push_back(RoundTo(dtype, hidden_scale * normal(rng)));
    for (int64_t i = 0; i < s.v * s.h; ++i)
      d.weight.push_back(RoundTo(dtype, weight_scale * normal(rng)));
  }
  if (s.bias != BiasKind::kNone) {
    const DType bias_type = s.bias == BiasKind::kF32 ? DType::kF32 : dtype;
    for (int64_t j = 0; j < s.v; ++j)
      d.bias.push_back(RoundTo(bias_type, 0.5 * normal(rng)));
  }
  for (int64_t i = 0; i < s.n; ++i) {
    d.targets.push_back(uniform(rng) < s.ignore_fraction
                            ? kIgnore
                            : static_cast<int64_t>(uniform(rng) * s.v) % s.v);
  }
  if (s.class_weights) {
    for (int64_t j = 0; j < s.v; ++j)
      d.class_weights.push_back(RoundTo(DType::kF32, 0.5 + 1.5 * uniform(rng)));
  }
  return d;
}

struct Expected {
  std::vector<double> token_loss;  // [N]
  std::vector<double> lse;         // [N]
  double loss = 0;
  std::vector<double> d_hidden;  // [N, H]
  std::vector<double> d_weight;  // [V, H]
  std::vector<double> d_bias;    // [V]
};

ReferenceOptions RefOptions(const Scenario& s, const Data& d) {
  ReferenceOptions options;
  options.ignore_index = kIgnore;
  options.reduction =
      s.reduction == Reduction::kMean  ? ReferenceReduction::kMean
      : s.reduction == Reduction::kSum ? ReferenceReduction::kSum
                                       : ReferenceReduction::kNone;
  options.label_smoothing = s.smoothing;
  options.z_loss = s.z_loss;
  options.softcap = s.softcap;
  options.class_weights = d.class_weights;
  return options;
}

// The cross-entropy's reference on logits = hidden @ weight^T + bias computed
// in double from the (rounded) inputs.
ReferenceResult ReferenceOnLogits(const Scenario& s, const Data& d,
                                  const std::vector<double>& grad_loss) {
  const int64_t n = s.n, h = s.h, v = s.v;
  std::vector<double> logits(n * v);  // [N, V]
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < v; ++j) {
      double sum = d.bias.empty() ? 0.0 : d.bias[j];
      for (int64_t k = 0; k < h; ++k)
        sum += d.hidden[i * h + k] * d.weight[j * h + k];
      logits[i * v + j] = d.logits_dtype ? RoundTo(*d.logits_dtype, sum) : sum;
    }
  }
  return CrossEntropyReference(logits, d.targets, v, RefOptions(s, d),
                               grad_loss);
}

// d_hidden, d_weight and d_bias in double from the given dlogits [N, V].
void SetGradients(const Scenario& s, const Data& d,
                  const std::vector<double>& dlogits, Expected& e) {
  const int64_t n = s.n, h = s.h, v = s.v;
  e.d_hidden.assign(n * h, 0.0);
  e.d_weight.assign(v * h, 0.0);
  e.d_bias.assign(v, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < v; ++j) {
      const double g = dlogits[i * v + j];
      e.d_bias[j] += g;
      for (int64_t k = 0; k < h; ++k) {
        e.d_hidden[i * h + k] += g * d.weight[j * h + k];
        e.d_weight[j * h + k] += g * d.hidden[i * h + k];
      }
    }
  }
}

Expected Reference(const Scenario& s, const Data& d,
                   const std::vector<double>& grad_loss) {
  const ReferenceResult r = ReferenceOnLogits(s, d, grad_loss);
  Expected e;
  e.token_loss = r.token_loss;
  e.lse = r.lse;
  e.loss = r.loss;
  SetGradients(s, d, r.grad, e);
  return e;
}

// ---------------------------------------------------------------------------------------
// The problem on a backend.

class Harness {
  // First, so that it is destroyed last: the arrays' buffers go back to its
  // allocator when they are destroyed.
  std::unique_ptr<Context> context_;

 public:
  Harness(const Scenario& s, DType dtype) : s_(s), dtype_(dtype) {}

  absl::Status Init(const Device& device, const Data& d) {
    ASSIGN_OR_RETURN(context_, Context::Create(device));
    Context& c = *context_;
    const int64_t hs = s_.pad == 0 ? 0 : s_.h + s_.pad;
    ASSIGN_OR_RETURN(hidden, MakeArray(c, dtype_, {s_.n, s_.h}, hs));
    ASSIGN_OR_RETURN(weight, MakeArray(c, dtype_, {s_.v, s_.h}, hs));
    ASSIGN_OR_RETURN(
        targets,
        MakeArray(c, s_.targets_i32 ? DType::kI32 : DType::kI64, {s_.n}));
    for (int64_t i = 0; i < s_.n * s_.h; ++i) hidden.Set(i, d.hidden[i]);
    for (int64_t i = 0; i < s_.v * s_.h; ++i) weight.Set(i, d.weight[i]);
    for (int64_t i = 0; i < s_.n; ++i)
      targets.Set(i, static_cast<double>(d.targets[i]));
    RETURN_IF_ERROR(Upload(c, hidden));
    RETURN_IF_ERROR(Upload(c, weight));
    RETURN_IF_ERROR(Upload(c, targets));
    inputs.hidden = hidden.view;
    inputs.weight = weight.view;
    inputs.targets = targets.view;
    if (!d.bias.empty()) {
      ASSIGN_OR_RETURN(
          bias, MakeArray(c, s_.bias == BiasKind::kF32 ? DType::kF32 : dtype_,
                          {s_.v}));
      for (int64_t j = 0; j < s_.v; ++j) bias.Set(j, d.bias[j]);
      RETURN_IF_ERROR(Upload(c, bias));
      inputs.bias = bias.view;
    }
    options.cross_entropy.ignore_index = kIgnore;
    options.cross_entropy.reduction = s_.reduction;
    options.cross_entropy.label_smoothing = s_.smoothing;
    options.cross_entropy.z_loss = s_.z_loss;
    options.cross_entropy.softcap = s_.softcap;
    options.schedule = s_.schedule;
    options.chunk_rows = s_.chunk_rows;
    options.operand_dtype_logits = s_.operand_dtype_logits;
    if (!d.class_weights.empty()) {
      ASSIGN_OR_RETURN(class_weights, MakeArray(c, DType::kF32, {s_.v}));
      for (int64_t j = 0; j < s_.v; ++j)
        class_weights.Set(j, d.class_weights[j]);
      RETURN_IF_ERROR(Upload(c, class_weights));
      options.cross_entropy.class_weights = class_weights.view;
    }
    const bool none = s_.reduction == Reduction::kNone;
    ASSIGN_OR_RETURN(loss,
                     MakeArray(c, DType::kF32, none ? Shape{s_.n} : Shape{}));
    ASSIGN_OR_RETURN(lse, MakeArray(c, DType::kF32, {s_.n}));
    ASSIGN_OR_RETURN(grad_loss,
                     MakeArray(c, DType::kF32, none ? Shape{s_.n} : Shape{}));
    ASSIGN_OR_RETURN(
        d_hidden,
        MakeArray(c, s_.d_hidden_f32 ? DType::kF32 : dtype_, {s_.n, s_.h}, hs));
    ASSIGN_OR_RETURN(
        d_weight,
        MakeArray(c, s_.d_weight_f32 ? DType::kF32 : dtype_, {s_.v, s_.h}, hs));
    gradients.d_hidden = d_hidden.view;
    gradients.d_weight = d_weight.view;
    if (!d.bias.empty()) {
      ASSIGN_OR_RETURN(
          d_bias,
          MakeArray(c, s_.d_bias_f32 ? DType::kF32 : bias.dtype, {s_.v}));
      gradients.d_bias = d_bias.view;
    }
    if (device.is_cuda()) {
      // The context's cuBLASLt workspace exists before any peak is measured.
      RETURN_IF_ERROR(c.cublaslt_workspace().status());
    }
    return absl::OkStatus();
  }

  // The plan input of the fused call (for picking budgets).
  lce::PlanInput FusedPlanInput() const {
    lce::PlanInput in;
    in.pass = lce::Pass::kForwardBackward;
    in.device = context_->device().kind;
    in.tokens = s_.n;
    in.hidden = s_.h;
    in.vocab = s_.v;
    in.operand_type = dtype_;
    in.d_hidden_type = d_hidden.dtype;
    in.d_weight_type = d_weight.dtype;
    in.has_bias = s_.bias != BiasKind::kNone;
    in.bias_f32 = !in.has_bias || bias.dtype == DType::kF32;
    in.d_bias_f32 = !in.has_bias || d_bias.dtype == DType::kF32;
    in.reduction_none = s_.reduction == Reduction::kNone;
    in.lse_given = false;  // the most demanding call: the fused one without lse
    in.max_workspace_bytes = options.max_workspace_bytes;
    in.use_tf32 = false;
    in.overlap_streams = options.overlap_streams;
    in.schedule = s_.schedule;
    in.chunk_rows = s_.chunk_rows;
    in.softcap = s_.softcap > 0.0f;
    in.fp32_gradient_accumulation = options.fp32_gradient_accumulation;
    in.operand_dtype_logits =
        options.operand_dtype_logits && dtype_ != DType::kF32;
    return in;
  }

  std::vector<Array*> Outputs() {
    std::vector<Array*> outputs = {&loss, &lse, &d_hidden, &d_weight};
    if (gradients.d_bias.has_value()) outputs.push_back(&d_bias);
    return outputs;
  }
  absl::Status PoisonOutputs() {
    for (Array* array : Outputs())
      RETURN_IF_ERROR(PoisonArray(*context_, *array));
    return absl::OkStatus();
  }
  absl::Status DownloadOutputs() {
    for (Array* array : Outputs()) RETURN_IF_ERROR(Download(*context_, *array));
    return absl::OkStatus();
  }

  Context& context() { return *context_; }

  Array hidden, weight, bias, targets, class_weights;
  Array loss, lse, grad_loss, d_hidden, d_weight, d_bias;
  LinearCrossEntropyInputs inputs;
  LinearCrossEntropyGradients gradients;
  LinearCrossEntropyOptions options;

 private:
  const Scenario s_;
  const DType dtype_;
};

// The schedule's name in test names and traces.
std::string ScheduleTestName(LinearCrossEntropySchedule schedule) {
  switch (schedule) {
    case LinearCrossEntropySchedule::kTokenChunks:
      return "token_chunks";
    case LinearCrossEntropySchedule::kTwoPass:
      return "two_pass";
    case LinearCrossEntropySchedule::kVocabSlices:
      return "vocab_slices";
    case LinearCrossEntropySchedule::kCompactChunks:
      return "compact_chunks";
    default:
      return "auto";
  }
}

// The smallest budget (to 1/64) that MakePlan accepts for `input`.
int64_t SmallestBudget(lce::PlanInput input) {
  int64_t high = 4096;
  for (input.max_workspace_bytes = high; !lce::MakePlan(input).ok();
       high *= 2) {
    input.max_workspace_bytes = 2 * high;
  }
  int64_t low = high / 2;
  while (high - low > std::max<int64_t>(high / 64, 256)) {
    input.max_workspace_bytes = (low + high) / 2;
    (lce::MakePlan(input).ok() ? high : low) = input.max_workspace_bytes;
  }
  return high;
}

// ---------------------------------------------------------------------------------------
// Checks.

double NormRelativeError(const Array& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.Get(i);
    diff += (g - want[i]) * (g - want[i]);
    norm += want[i] * want[i];
  }
  if (norm == 0) return diff == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

// Every logical element written (and finite), every padding element still
// poisoned.
void ExpectWrittenExactly(const Array& array, const std::string& what) {
  int64_t unwritten = 0, bad = 0, padding_touched = 0;
  for (int64_t i = 0; i < array.numel(); ++i) {
    if (IsPoison(array.dtype, array.host, array.Index(i))) {
      ++unwritten;
    } else if (!std::isfinite(array.Get(i))) {
      ++bad;
    }
  }
  for (int64_t r = 0; r + 1 < array.rows(); ++r) {
    for (int64_t k = array.cols(); k < array.row_stride(); ++k) {
      if (!IsPoison(array.dtype, array.host, r * array.row_stride() + k))
        ++padding_touched;
    }
  }
  EXPECT_EQ(unwritten, 0) << what << ": elements left unwritten";
  EXPECT_EQ(bad, 0) << what << ": non-finite elements";
  EXPECT_EQ(padding_touched, 0) << what << ": row padding written";
}

// Every element (padding included) still poisoned.
void ExpectAllPoison(const Array& array, const std::string& what) {
  int64_t written = 0;
  for (int64_t k = 0; k < array.Span(); ++k)
    written += !IsPoison(array.dtype, array.host, k);
  EXPECT_EQ(written, 0) << what << ": elements written";
}

double GradientTolerance(DType dtype) {
  return dtype == DType::kF32 ? 1e-5 : 1e-2;
}

void ExpectLossAndLse(const Harness& h, const Scenario& s, const Expected& e,
                      bool with_lse, const std::string& what) {
  if (s.reduction == Reduction::kNone) {
    for (int64_t i = 0; i < s.n; ++i) {
      const double tolerance =
          1e-5 * std::fabs(e.token_loss[i]) + kTwoUlpsF32 * std::fabs(e.lse[i]);
      EXPECT_NEAR(h.loss.Get(i), e.token_loss[i], tolerance)
          << what << ": loss of token " << i;
    }
  } else {
    EXPECT_NEAR(h.loss.Get(0), e.loss, 1e-5 * std::fabs(e.loss) + 1e-30)
        << what << ": loss";
  }
  if (with_lse) {
    for (int64_t i = 0; i < s.n; ++i) {
      EXPECT_NEAR(h.lse.Get(i), e.lse[i],
                  1e-5 * std::fabs(e.lse[i]) + kTwoUlpsF32)
          << what << ": lse of token " << i;
    }
  }
}

void ExpectGradients(const Harness& h, DType dtype, const Expected& e,
                     const std::string& what) {
  const double tolerance = GradientTolerance(dtype);
  EXPECT_LT(NormRelativeError(h.d_hidden, e.d_hidden), tolerance)
      << what << ": d_hidden";
  EXPECT_LT(NormRelativeError(h.d_weight, e.d_weight), tolerance)
      << what << ": d_weight";
  if (h.gradients.d_bias.has_value()) {
    EXPECT_LT(NormRelativeError(h.d_bias, e.d_bias), tolerance)
        << what << ": d_bias";
  }
  ExpectWrittenExactly(h.d_hidden, what + " d_hidden");
  ExpectWrittenExactly(h.d_weight, what + " d_weight");
  if (h.gradients.d_bias.has_value())
    ExpectWrittenExactly(h.d_bias, what + " d_bias");
}

// ---------------------------------------------------------------------------------------
// The parameterized case: backend x dtype x scenario.

struct CaseParam {
  bool gpu;
  DType dtype;
  Scenario scenario;
};

std::string CaseName(const testing::TestParamInfo<CaseParam>& info) {
  return absl::StrCat(info.param.gpu ? "cuda_" : "cpu_",
                      DTypeName(info.param.dtype), "_",
                      info.param.scenario.name);
}

std::vector<CaseParam> AllCases() {
  std::vector<CaseParam> cases;
  for (bool gpu : {false, true}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const Scenario& s : Scenarios()) {
        if (dtype == DType::kF32 &&
            (s.schedule == LinearCrossEntropySchedule::kCompactChunks ||
             s.operand_dtype_logits)) {
          continue;  // refused: CompactChunksRefusals, OperandDtypeLogits
        }
        cases.push_back({gpu, dtype, s});
      }
    }
  }
  return cases;
}

class LinearCrossEntropyCaseTest : public testing::TestWithParam<CaseParam> {};

TEST_P(LinearCrossEntropyCaseTest, MatchesReference) {
  const CaseParam& param = GetParam();
  if (param.gpu) {
    SKIP_WITHOUT_GPU();
  }
  const Scenario& s = param.scenario;
  const DType dtype = param.dtype;
  const uint64_t seed = test::TestSeed();
  const Data data = MakeData(s, dtype, seed);
  Harness h(s, dtype);
  ASSERT_OK(h.Init(param.gpu ? Device::Cuda(0) : Device::Cpu(), data));
  Context& context = h.context();

  if (s.smallest_budget) {
    h.options.max_workspace_bytes = SmallestBudget(h.FusedPlanInput());
  }
  absl::StatusOr<lce::Plan> plan = lce::MakePlan(h.FusedPlanInput());
  ASSERT_OK(plan.status());
  SCOPED_TRACE(absl::StrCat("plan: ", plan->ToString(), ", budget ",
                            h.options.max_workspace_bytes));
  if (s.smallest_budget) {
    // Many chunks, whose boundaries do not all divide N (or V).
    if (plan->schedule == LinearCrossEntropySchedule::kVocabSlices ||
        plan->schedule == LinearCrossEntropySchedule::kCompactChunks) {
      // Token blocks or slices (the cheaper to hold: a 16-bit d_weight's
      // fp32 accumulator [V, H] comes with several blocks).
      if (s.n >= 8) {
        EXPECT_GE(plan->num_chunks * plan->num_slices, 3);
      }
    } else if (plan->schedule == LinearCrossEntropySchedule::kTwoPass) {
      // (With one token, a row of logits that fits holds every slice.)
      if (s.n >= 8) {
        EXPECT_GE(plan->num_slices, std::min<int64_t>(3, (s.v + 7) / 8));
      }
    } else {
      EXPECT_GE(plan->num_chunks, std::min<int64_t>(3, s.n));
    }
  }
  if (s.schedule != LinearCrossEntropySchedule::kAuto) {
    EXPECT_EQ(plan->schedule, s.schedule);
  }
  if (s.chunk_rows > 0) {
    EXPECT_EQ(plan->chunk_rows, s.chunk_rows);
    EXPECT_EQ(plan->num_chunks, (s.n + s.chunk_rows - 1) / s.chunk_rows);
  }

  // operand_dtype_logits: a call's logits are 16-bit where its own plan runs
  // token chunks (Plan::logit_bytes 2; kAuto may prefer a schedule of fp32
  // logits), and its reference rounds them there.
  auto rounds_logits = [&](lce::Pass pass, bool lse_given) {
    lce::PlanInput in = h.FusedPlanInput();
    in.pass = pass;
    in.lse_given = lse_given;
    const absl::StatusOr<lce::Plan> call_plan = lce::MakePlan(in);
    return call_plan.ok() && call_plan->logit_bytes != 4;
  };
  const bool fused_rounds = rounds_logits(lce::Pass::kForwardBackward, true);
  const bool fused_no_lse_rounds =
      rounds_logits(lce::Pass::kForwardBackward, false);
  const bool forward_rounds = rounds_logits(lce::Pass::kForward, true);
  const bool backward_rounds = rounds_logits(lce::Pass::kBackward, true);
  if (s.operand_dtype_logits && dtype != DType::kF32 &&
      s.schedule == LinearCrossEntropySchedule::kTokenChunks) {
    EXPECT_TRUE(fused_rounds && fused_no_lse_rounds && forward_rounds &&
                backward_rounds)
        << "kTokenChunks with operand_dtype_logits keeps fp32 logits";
  }
  Data data_fp32_logits = data;
  data_fp32_logits.logits_dtype.reset();
  auto reference = [&](bool rounded, const std::vector<double>& gl) {
    return Reference(s, rounded ? data : data_fp32_logits, gl);
  };
  const Expected expected = reference(fused_rounds, {});
  std::vector<double> grad_loss;
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::uniform_real_distribution<double> uniform(0.25, 1.5);
  for (int64_t i = 0; i < (s.reduction == Reduction::kNone ? s.n : 1); ++i) {
    grad_loss.push_back(RoundTo(DType::kF32, uniform(rng)));
    h.grad_loss.Set(i, grad_loss.back());
  }
  ASSERT_OK(Upload(context, h.grad_loss));
  const Expected expected_scaled = reference(fused_no_lse_rounds, grad_loss);

  // Fused, with lse; the peak of the context's allocator stays within the
  // budget.
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(context.Synchronize());
  const int64_t base = context.allocator().current_bytes();
  context.allocator().ResetPeak();
  ASSERT_OK(LinearCrossEntropyForwardBackward(
      context, h.inputs, h.options, h.loss.view, &h.lse.view, h.gradients));
  ASSERT_OK(context.Synchronize());
  if (param.gpu || dtype == DType::kF32) {
    // (The CPU keeps fp32 copies of 16-bit operands outside the budget.)
    EXPECT_LE(context.allocator().peak_bytes() - base,
              h.options.max_workspace_bytes);
  }
  ASSERT_OK(h.DownloadOutputs());
  ExpectWrittenExactly(h.loss, "fused loss");
  ExpectWrittenExactly(h.lse, "fused lse");
  ExpectLossAndLse(h, s, expected, true, "fused");
  ExpectGradients(h, dtype, expected, "fused");

  // The same bytes again.
  std::vector<Bytes> first;
  for (Array* array : h.Outputs()) first.push_back(array->host);
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(LinearCrossEntropyForwardBackward(
      context, h.inputs, h.options, h.loss.view, &h.lse.view, h.gradients));
  ASSERT_OK(h.DownloadOutputs());
  for (size_t k = 0; k < first.size(); ++k) {
    EXPECT_TRUE(first[k] == h.Outputs()[k]->host)
        << "output " << k << " differs between runs";
  }

  // Fused with an incoming gradient, without lse.
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(LinearCrossEntropyForwardBackward(context, h.inputs, h.options,
                                              h.loss.view, nullptr, h.gradients,
                                              &h.grad_loss.view));
  ASSERT_OK(h.DownloadOutputs());
  ExpectLossAndLse(h, s, expected, false, "fused with grad_loss");
  ExpectGradients(h, dtype, expected_scaled, "fused with grad_loss");

  // accumulate (f32 d_weight and d_bias): the same gradients added to start
  // values of the gradients' own scale (so that a missing or doubled term
  // shows), d_hidden written over its poison.
  const bool f32_weight_grads =
      h.d_weight.dtype == DType::kF32 &&
      (!h.gradients.d_bias.has_value() || h.d_bias.dtype == DType::kF32);
  if (f32_weight_grads) {
    ASSERT_OK(h.PoisonOutputs());
    auto start_values = [&](Array& array, const std::vector<double>& grad) {
      double rms = 0;
      for (double g : grad) rms += g * g;
      rms = grad.empty() ? 1 : std::sqrt(rms / grad.size()) + 1e-30;
      std::vector<double> start(array.numel());
      for (int64_t i = 0; i < array.numel(); ++i) {
        start[i] = RoundTo(DType::kF32, rms * (2 * uniform(rng) - 1.75));
        array.Set(i, start[i]);
      }
      return start;
    };
    const std::vector<double> weight_start =
        start_values(h.d_weight, expected_scaled.d_weight);
    ASSERT_OK(Upload(context, h.d_weight));
    std::vector<double> bias_start;
    if (h.gradients.d_bias.has_value()) {
      bias_start = start_values(h.d_bias, expected_scaled.d_bias);
      ASSERT_OK(Upload(context, h.d_bias));
    }
    LinearCrossEntropyGradients accumulating = h.gradients;
    accumulating.accumulate = true;
    ASSERT_OK(LinearCrossEntropyForwardBackward(
        context, h.inputs, h.options, h.loss.view, nullptr, accumulating,
        &h.grad_loss.view));
    ASSERT_OK(h.DownloadOutputs());
    ExpectLossAndLse(h, s, expected, false, "accumulating");
    const double tolerance = GradientTolerance(dtype);
    EXPECT_LT(NormRelativeError(h.d_hidden, expected_scaled.d_hidden),
              tolerance)
        << "accumulating: d_hidden";
    ExpectWrittenExactly(h.d_hidden, "accumulating d_hidden");
    auto expect_added = [&](const Array& got, const std::vector<double>& start,
                            const std::vector<double>& grad,
                            const std::string& what) {
      ExpectWrittenExactly(got, "accumulating " + what);
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double want = start[i] + grad[i];
        diff += (got.Get(i) - want) * (got.Get(i) - want);
        norm += grad[i] * grad[i];
      }
      // Relative to the gradient's own norm; the start values' fp32 sums add
      // a few ulps of the same scale.
      EXPECT_LE(std::sqrt(diff), (tolerance + 1e-6) * std::sqrt(norm) + 1e-30)
          << "accumulating: " << what;
    };
    expect_added(h.d_weight, weight_start, expected_scaled.d_weight,
                 "d_weight");
    if (h.gradients.d_bias.has_value()) {
      expect_added(h.d_bias, bias_start, expected_scaled.d_bias, "d_bias");
    }
  }

  // Split: forward (loss and lse), then backward from that lse.
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(LinearCrossEntropyForward(context, h.inputs, h.options, h.loss.view,
                                      &h.lse.view));
  ASSERT_OK(h.DownloadOutputs());
  ExpectWrittenExactly(h.loss, "forward loss");
  ExpectWrittenExactly(h.lse, "forward lse");
  ExpectLossAndLse(
      h, s,
      forward_rounds == fused_rounds ? expected : reference(forward_rounds, {}),
      true, "forward");
  for (Array* array : {&h.d_hidden, &h.d_weight}) {
    EXPECT_EQ(array->Values().size(), static_cast<size_t>(array->numel()));
    for (int64_t i = 0; i < array->numel(); ++i) {
      ASSERT_TRUE(IsPoison(array->dtype, array->host, array->Index(i)))
          << "forward wrote a gradient";
    }
  }
  if (s.schedule == LinearCrossEntropySchedule::kCompactChunks) {
    // Refused by the split backward (nothing written), which the other
    // schedules run.
    const absl::Status refused =
        LinearCrossEntropyBackward(context, h.inputs, h.lse.view,
                                   h.grad_loss.view, h.options, h.gradients);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    ASSERT_OK(h.DownloadOutputs());
    for (Array* array : {&h.d_hidden, &h.d_weight}) {
      for (int64_t i = 0; i < array->numel(); ++i) {
        ASSERT_TRUE(IsPoison(array->dtype, array->host, array->Index(i)))
            << "the refused backward wrote a gradient";
      }
    }
    h.options.schedule = LinearCrossEntropySchedule::kAuto;
  }
  ASSERT_OK(LinearCrossEntropyBackward(
      context, h.inputs, h.lse.view, h.grad_loss.view, h.options, h.gradients));
  ASSERT_OK(h.DownloadOutputs());
  if (forward_rounds == backward_rounds) {
    ExpectGradients(h, dtype,
                    backward_rounds == fused_no_lse_rounds
                        ? expected_scaled
                        : reference(backward_rounds, grad_loss),
                    "split backward");
  } else {
    // The forward's lse and the backward's logits differ in rounding (their
    // plans differ), which the reference does not model; the fused calls
    // above check both precisions.
    ASSERT_TRUE(s.operand_dtype_logits);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, LinearCrossEntropyCaseTest,
                         testing::ValuesIn(AllCases()), CaseName);

// ---------------------------------------------------------------------------------------
// Plans.

// kVocabSlices: token blocks tile [0, N) in order; each is swept over slices
// that tile [0, V), forwards for the statistics (then the finish), backwards
// for the gradients, with the accumulation flags each step needs; the
// accumulators it needs are planned, and the last regions end in the block.
// kCompactChunks: token chunks tile [0, N) in order; each runs its slices'
// compact statistics over [0, V) in order, the finish, then one gradient
// block of the whole rows in the compact rows, which hold them.
void ExpectCompactBlocks(const lce::PlanInput& in, const lce::Plan& plan) {
  const std::vector<lce::Block> blocks = lce::MakeBlocks(in, plan);
  EXPECT_EQ(static_cast<int64_t>(blocks.size()),
            plan.num_chunks * (plan.num_slices + 2));
  EXPECT_GE(plan.compact_offset, 0);
  EXPECT_GE(plan.slice_max_offset, 0);
  // The kernels' 8-value accesses from each slice's start.
  EXPECT_TRUE(plan.slice_cols % 8 == 0 || plan.num_slices == 1);
  EXPECT_EQ(plan.chunk_ld % 8, 0);
  EXPECT_EQ(plan.compact_offset % 16, 0);
  size_t k = 0;
  int64_t next_row = 0;
  for (int64_t c = 0; c < plan.num_chunks; ++c) {
    const int64_t row_begin = blocks[k].row_begin;
    const int64_t row_end = blocks[k].row_end;
    EXPECT_EQ(row_begin, next_row);
    EXPECT_GT(row_end, row_begin);
    EXPECT_LE(row_end - row_begin, plan.chunk_rows);
    EXPECT_LE((row_end - row_begin) * plan.slice_ld * 4, plan.logits_bytes);
    next_row = row_end;
    int64_t next_col = 0;
    for (int64_t s = 0; s < plan.num_slices; ++s, ++k) {
      const lce::Block& b = blocks[k];
      EXPECT_EQ(b.mode, lce::CeMode::kCompactStats);
      EXPECT_EQ(b.row_begin, row_begin);
      EXPECT_EQ(b.col_begin, next_col);
      EXPECT_LE(b.col_end - b.col_begin, b.ld);
      EXPECT_EQ(b.accumulate, s > 0);
      next_col = b.col_end;
    }
    EXPECT_EQ(next_col, in.vocab);
    EXPECT_EQ(blocks[k++].mode, lce::CeMode::kSliceFinish);
    const lce::Block& b = blocks[k++];
    EXPECT_EQ(b.mode, lce::CeMode::kCompactBackward);
    EXPECT_EQ(b.row_begin, row_begin);
    EXPECT_EQ(b.col_begin, 0);
    EXPECT_EQ(b.col_end, in.vocab);
    EXPECT_EQ(b.ld, plan.chunk_ld);
    EXPECT_TRUE(b.d_hidden && b.d_weight);
    EXPECT_EQ(b.accumulate, c > 0);
  }
  EXPECT_EQ(next_row, in.tokens);
  // The compact rows and the slice maxima fit in the block.
  EXPECT_LE(plan.compact_offset + 2 * plan.chunk_rows * plan.chunk_ld,
            plan.block_bytes);
  EXPECT_LE(plan.slice_max_offset + 4 * plan.chunk_rows * plan.num_slices,
            plan.block_bytes);
}

void ExpectVocabSliceBlocks(const lce::PlanInput& in, const lce::Plan& plan) {
  const bool stats = in.pass != lce::Pass::kBackward;
  const bool backward = in.pass != lce::Pass::kForward;
  const std::vector<lce::Block> blocks = lce::MakeBlocks(in, plan);
  EXPECT_EQ(static_cast<int64_t>(blocks.size()),
            plan.num_chunks * ((stats ? plan.num_slices + 1 : 0) +
                               (backward ? plan.num_slices : 0)));
  EXPECT_GE(plan.slice_cols, 1);
  EXPECT_EQ(plan.slice_ld % 8, 0);
  size_t k = 0;
  int64_t next_row = 0;
  while (k < blocks.size()) {
    const int64_t row_begin = blocks[k].row_begin;
    const int64_t row_end = blocks[k].row_end;
    EXPECT_EQ(row_begin, next_row);
    EXPECT_GT(row_end, row_begin);
    EXPECT_LE((row_end - row_begin) * plan.slice_ld * 4, plan.logits_bytes);
    next_row = row_end;
    if (stats) {
      int64_t next_col = 0;
      for (int64_t s = 0; s < plan.num_slices; ++s, ++k) {
        const lce::Block& b = blocks[k];
        EXPECT_EQ(b.mode, lce::CeMode::kSliceStats);
        EXPECT_EQ(b.row_begin, row_begin);
        EXPECT_EQ(b.col_begin, next_col);
        EXPECT_LE(b.col_end - b.col_begin, b.ld);
        EXPECT_EQ(b.accumulate, s > 0);
        next_col = b.col_end;
      }
      EXPECT_EQ(next_col, in.vocab);
      EXPECT_EQ(blocks[k].mode, lce::CeMode::kSliceFinish);
      ++k;
    }
    if (backward) {
      int64_t next_end = in.vocab;
      for (int64_t s = 0; s < plan.num_slices; ++s, ++k) {
        const lce::Block& b = blocks[k];
        EXPECT_EQ(b.mode, lce::CeMode::kSliceBackward);
        EXPECT_EQ(b.row_begin, row_begin);
        EXPECT_EQ(b.row_end, row_end);
        EXPECT_EQ(b.col_end, next_end);
        EXPECT_LE(b.col_end - b.col_begin, b.ld);
        EXPECT_EQ(b.logits_ready, stats && s == 0);
        EXPECT_TRUE(b.d_hidden && b.d_weight);
        EXPECT_EQ(b.d_hidden_accumulate, s > 0);
        EXPECT_EQ(b.d_hidden_done, s == plan.num_slices - 1);
        EXPECT_EQ(b.accumulate, row_begin > 0);
        next_end = b.col_begin;
      }
      EXPECT_EQ(next_end, 0);
    }
  }
  EXPECT_EQ(next_row, in.tokens);
  if (backward && in.d_hidden_type != DType::kF32 && plan.num_slices > 1) {
    ASSERT_GE(plan.d_hidden_acc_offset, 0);
    EXPECT_LE(plan.d_hidden_acc_offset + 4 * plan.chunk_rows * in.hidden,
              plan.block_bytes);
  }
  if (backward && in.d_weight_type != DType::kF32 && plan.num_chunks > 1) {
    ASSERT_GE(plan.d_weight_acc_offset, 0);
    EXPECT_LE(plan.d_weight_acc_offset + 4 * in.vocab * in.hidden,
              plan.block_bytes);
  }
  if (stats) {
    ASSERT_GE(plan.row_stats_offset, 0);
    EXPECT_LE(plan.row_stats_offset + 8 * lce::kStats * in.tokens,
              plan.block_bytes);
  }
}

TEST(LinearCrossEntropyPlanTest, PlansFitTheBudgetAndBlocksCoverTheProblem) {
  std::mt19937_64 rng(test::TestSeed());
  auto pick = [&](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(rng);
  };
  int feasible = 0;
  int compact_plans = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    lce::PlanInput in;
    in.pass = static_cast<lce::Pass>(pick(0, 2));
    in.device = pick(0, 1) ? DeviceKind::kCuda : DeviceKind::kCpu;
    in.tokens = pick(0, 3) == 0 ? pick(0, 3) : pick(1, 5000);
    in.hidden = pick(1, 700);
    in.vocab = pick(1, 60000);
    const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
    in.operand_type = types[pick(0, 2)];
    in.d_hidden_type = pick(0, 1) ? DType::kF32 : in.operand_type;
    in.d_weight_type = pick(0, 1) ? DType::kF32 : in.operand_type;
    in.has_bias = pick(0, 1);
    in.bias_f32 = pick(0, 1);
    in.d_bias_f32 = pick(0, 1);
    in.reduction_none = pick(0, 2) == 0;
    in.lse_given = in.pass == lce::Pass::kBackward || pick(0, 1);
    in.max_workspace_bytes = int64_t{1} << pick(10, 33);
    in.max_workspace_bytes += pick(0, in.max_workspace_bytes);
    in.schedule = static_cast<LinearCrossEntropySchedule>(pick(0, 4));
    in.softcap = pick(0, 3) == 0;
    in.chunk_rows = pick(0, 3) == 0 ? pick(1, 300) : 0;
    const absl::StatusOr<lce::Plan> plan = lce::MakePlan(in);
    const bool compact_refused =
        in.schedule == LinearCrossEntropySchedule::kCompactChunks &&
        in.tokens > 0 && in.pass != lce::Pass::kForward &&
        (in.pass == lce::Pass::kBackward || in.operand_type == DType::kF32 ||
         in.softcap);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(plan.status().message().find(
                    compact_refused ? "kCompactChunks" : "needs at least"),
                absl::string_view::npos)
          << plan.status();
      continue;
    }
    EXPECT_FALSE(compact_refused) << plan->ToString();
    ++feasible;
    SCOPED_TRACE(absl::StrCat(
        "N=", in.tokens, " H=", in.hidden, " V=", in.vocab,
        " budget=", in.max_workspace_bytes, ": ", plan->ToString()));
    EXPECT_LE(plan->total_bytes, in.max_workspace_bytes);
    EXPECT_EQ(plan->chunk_ld % 8, 0);
    if (in.chunk_rows > 0) {
      EXPECT_EQ(plan->chunk_rows, std::min(in.chunk_rows, in.tokens));
    }
    // Sub-buffers inside the block, after the logits.
    for (int64_t offset :
         {plan->stats_offset, plan->row_loss_offset, plan->lse_offset,
          plan->grad_scale_offset, plan->bias_offset, plan->ones_offset,
          plan->d_bias_acc_offset, plan->d_weight_acc_offset,
          plan->row_max_offset, plan->row_stats_offset,
          plan->d_hidden_acc_offset, plan->target_logprob_offset,
          plan->compact_offset, plan->slice_max_offset}) {
      if (offset < 0) continue;
      EXPECT_EQ(offset % 256, 0);
      EXPECT_GE(offset, plan->logits_bytes);
      EXPECT_LE(offset, plan->block_bytes);
    }
    if (plan->schedule == LinearCrossEntropySchedule::kVocabSlices) {
      ExpectVocabSliceBlocks(in, *plan);
      continue;
    }
    if (plan->schedule == LinearCrossEntropySchedule::kCompactChunks) {
      ++compact_plans;
      ExpectCompactBlocks(in, *plan);
      continue;
    }
    if (in.pass != lce::Pass::kForward && in.d_weight_type != DType::kF32 &&
        plan->schedule == LinearCrossEntropySchedule::kTokenChunks &&
        in.tokens > 0) {
      EXPECT_GE(plan->d_weight_acc_offset, 0);
    }
    // Token blocks tile [0, N) in order with the whole vocabulary; slices tile
    // [0, V).
    int64_t next_row = 0, next_col = 0;
    for (const lce::Block& block : lce::MakeBlocks(in, *plan)) {
      EXPECT_LE((block.row_end - block.row_begin) * block.ld * 4,
                plan->logits_bytes);
      EXPECT_LE(block.col_end - block.col_begin, block.ld);
      EXPECT_EQ(block.ld % 8, 0);
      if (block.mode == lce::CeMode::kSliceBackward) {
        EXPECT_EQ(next_row, in.tokens) << "slices before the token pass ended";
        EXPECT_EQ(block.col_begin, next_col);
        EXPECT_EQ(block.row_begin, 0);
        EXPECT_EQ(block.row_end, in.tokens);
        EXPECT_TRUE(block.d_weight && !block.d_hidden && !block.accumulate);
        next_col = block.col_end;
      } else {
        EXPECT_EQ(block.row_begin, next_row);
        EXPECT_EQ(block.col_begin, 0);
        EXPECT_EQ(block.col_end, in.vocab);
        EXPECT_GT(block.row_end, block.row_begin);
        EXPECT_EQ(block.accumulate, block.row_begin > 0);
        next_row = block.row_end;
      }
    }
    EXPECT_EQ(next_row, in.tokens);
    if (in.pass != lce::Pass::kForward &&
        plan->schedule == LinearCrossEntropySchedule::kTwoPass) {
      EXPECT_EQ(next_col, in.vocab);
    }
  }
  EXPECT_GT(feasible, 1000);
  EXPECT_GT(compact_plans, 20);
}

lce::PlanInput BenchPlanInput(int64_t n, int64_t h, int64_t v, int64_t budget,
                              DType d_weight) {
  lce::PlanInput in;
  in.pass = lce::Pass::kForwardBackward;
  in.device = DeviceKind::kCuda;
  in.tokens = n;
  in.hidden = h;
  in.vocab = v;
  in.operand_type = DType::kBF16;
  in.d_hidden_type = DType::kBF16;
  in.d_weight_type = d_weight;
  in.max_workspace_bytes = budget;
  return in;
}

// What the performance targets rest on: at the default budget the benchmark's
// shapes run token chunks of >= 1024 tokens with an fp32 d_weight; a 16-bit
// d_weight whose fp32 accumulator does not fit switches to the two-pass
// schedule rather than fail.
TEST(LinearCrossEntropyPlanTest, BenchmarkShapes) {
  const int64_t shapes[][3] = {{4096, 4096, 128256},
                               {16384, 4096, 128256},
                               {16384, 768, 50304},
                               {8192, 2304, 256000}};
  for (const auto& shape : shapes) {
    for (int64_t budget :
         {int64_t{64} << 20, int64_t{256} << 20, kGiB, 4 * kGiB}) {
      for (DType d_weight : {DType::kF32, DType::kBF16}) {
        const absl::StatusOr<lce::Plan> plan = lce::MakePlan(
            BenchPlanInput(shape[0], shape[1], shape[2], budget, d_weight));
        ASSERT_OK(plan.status());
        std::printf(
            "N=%-6lld H=%-5lld V=%-7lld budget %5lld MiB d_weight %-4s: %s, "
            "est %.1f ms\n",
            static_cast<long long>(shape[0]), static_cast<long long>(shape[1]),
            static_cast<long long>(shape[2]),
            static_cast<long long>(budget >> 20), DTypeName(d_weight),
            plan->ToString().c_str(), plan->estimated_seconds * 1e3);
        EXPECT_LE(plan->total_bytes, budget);
        if (budget == kGiB && d_weight == DType::kF32) {
          EXPECT_EQ(plan->schedule, LinearCrossEntropySchedule::kTokenChunks);
          EXPECT_GE(plan->chunk_rows, 1024);
        }
      }
    }
  }
}

// The planner's measured choices (H200, bench/RESULTS.md at d6c85d2 and
// 1d22b11; H100, 2026-12-07): the second stream only over at most two token
// chunks; token chunks leave most of a small budget to the logits (1/64 to the
// GEMMs); at 256 MiB the H = 4096 shapes run compact chunks (faster there than
// the token chunks of half as many rows), at 1 GiB token chunks.
TEST(LinearCrossEntropyPlanTest, StreamsAndGemmWorkspaceFollowTheMeasurements) {
  const absl::StatusOr<lce::Plan> two_chunks =
      lce::MakePlan(BenchPlanInput(4096, 4096, 128256, kGiB, DType::kF32));
  ASSERT_OK(two_chunks.status());
  EXPECT_EQ(two_chunks->num_chunks, 2);
  EXPECT_TRUE(two_chunks->overlap_streams) << two_chunks->ToString();

  const absl::StatusOr<lce::Plan> eight_chunks =
      lce::MakePlan(BenchPlanInput(16384, 4096, 128256, kGiB, DType::kF32));
  ASSERT_OK(eight_chunks.status());
  EXPECT_EQ(eight_chunks->num_chunks, 8);
  EXPECT_FALSE(eight_chunks->overlap_streams) << eight_chunks->ToString();

  for (const int64_t n : {4096, 16384}) {
    const absl::StatusOr<lce::Plan> compact = lce::MakePlan(
        BenchPlanInput(n, 4096, 128256, int64_t{256} << 20, DType::kF32));
    ASSERT_OK(compact.status());
    EXPECT_EQ(compact->schedule, LinearCrossEntropySchedule::kCompactChunks)
        << compact->ToString();
    EXPECT_GE(compact->chunk_rows, 832) << compact->ToString();
    EXPECT_LE(compact->total_bytes, int64_t{256} << 20);
  }

  lce::PlanInput token_chunks =
      BenchPlanInput(4096, 4096, 128256, int64_t{256} << 20, DType::kF32);
  token_chunks.schedule = LinearCrossEntropySchedule::kTokenChunks;
  const absl::StatusOr<lce::Plan> small = lce::MakePlan(token_chunks);
  ASSERT_OK(small.status());
  EXPECT_EQ(small->schedule, LinearCrossEntropySchedule::kTokenChunks);
  EXPECT_EQ(small->gemm_workspace_bytes, int64_t{4} << 20);
  EXPECT_EQ(small->chunk_rows, 512) << small->ToString();
  EXPECT_LE(small->total_bytes, int64_t{256} << 20);
}

// kCompactChunks holds all 4096 tokens of the first benchmark shape in one
// chunk at 1 GiB (1002 MiB of fp16 probabilities: no d_weight accumulation)
// by giving cuBLASLt 4 MiB instead of its 16 MiB share; with room to spare it
// keeps the share.
TEST(LinearCrossEntropyPlanTest,
     CompactChunksShrinkTheGemmWorkspaceForOneChunk) {
  for (DType d_weight : {DType::kF32, DType::kBF16}) {
    lce::PlanInput in = BenchPlanInput(4096, 4096, 128256, kGiB, d_weight);
    in.schedule = LinearCrossEntropySchedule::kCompactChunks;
    const absl::StatusOr<lce::Plan> plan = lce::MakePlan(in);
    ASSERT_OK(plan.status());
    EXPECT_EQ(plan->num_chunks, 1) << plan->ToString();
    EXPECT_EQ(plan->gemm_workspace_bytes, int64_t{4} << 20);
    EXPECT_LT(plan->d_weight_acc_offset, 0) << plan->ToString();
    EXPECT_LE(plan->total_bytes, kGiB);

    in.max_workspace_bytes = 2 * kGiB;
    const absl::StatusOr<lce::Plan> roomy = lce::MakePlan(in);
    ASSERT_OK(roomy.status());
    EXPECT_EQ(roomy->num_chunks, 1) << roomy->ToString();
    EXPECT_EQ(roomy->gemm_workspace_bytes, int64_t{16} << 20);
  }
}

// A bf16 d_weight of the first benchmark shape at 1 GiB: its fp32
// accumulator (2004 MiB) cannot fit, so by default no plan accumulates
// d_weight over token chunks; summed in bf16 (fp32_gradient_accumulation
// off) it takes the token chunks of the f32 d_weight, with no accumulator.
TEST(LinearCrossEntropyPlanTest, OutputDtypeSumsTakeTheTokenChunks) {
  lce::PlanInput in = BenchPlanInput(4096, 4096, 128256, kGiB, DType::kBF16);
  const absl::StatusOr<lce::Plan> fp32_sums = lce::MakePlan(in);
  ASSERT_OK(fp32_sums.status());
  EXPECT_NE(fp32_sums->schedule, LinearCrossEntropySchedule::kTokenChunks)
      << fp32_sums->ToString();
  EXPECT_LT(fp32_sums->d_weight_acc_offset, 0) << fp32_sums->ToString();

  in.fp32_gradient_accumulation = false;
  const absl::StatusOr<lce::Plan> bf16_sums = lce::MakePlan(in);
  ASSERT_OK(bf16_sums.status());
  EXPECT_EQ(bf16_sums->schedule, LinearCrossEntropySchedule::kTokenChunks)
      << bf16_sums->ToString();
  EXPECT_EQ(bf16_sums->num_chunks, 2) << bf16_sums->ToString();
  EXPECT_LT(bf16_sums->d_weight_acc_offset, 0) << bf16_sums->ToString();
  EXPECT_LE(bf16_sums->total_bytes, kGiB);
}

// 16-bit logits (operand_dtype_logits) take half a row's bytes: at 1 GiB all
// 4096 tokens of the first benchmark shape fit one token chunk (no d_weight
// accumulation), against two chunks of fp32 logits.
TEST(LinearCrossEntropyPlanTest, OperandDtypeLogitsHalveTheChunks) {
  lce::PlanInput in = BenchPlanInput(4096, 4096, 128256, kGiB, DType::kF32);
  in.operand_dtype_logits = true;
  const absl::StatusOr<lce::Plan> plan = lce::MakePlan(in);
  ASSERT_OK(plan.status());
  EXPECT_EQ(plan->schedule, LinearCrossEntropySchedule::kTokenChunks);
  EXPECT_EQ(plan->logit_bytes, 2);
  EXPECT_EQ(plan->num_chunks, 1) << plan->ToString();
  EXPECT_EQ(plan->logits_bytes, 2 * 4096 * plan->chunk_ld);
  EXPECT_LE(plan->total_bytes, kGiB);
  in.operand_dtype_logits = false;
  const absl::StatusOr<lce::Plan> fp32 = lce::MakePlan(in);
  ASSERT_OK(fp32.status());
  EXPECT_EQ(fp32->logit_bytes, 4);
  EXPECT_EQ(fp32->num_chunks, 2) << fp32->ToString();
}

// kAuto with operand_dtype_logits weighs the 16-bit token chunks against the
// schedules of fp32 logits: at 64 MiB (253-row chunks, timed 2.7-5.4x the
// three GEMMs) it takes the vocabulary slices, and a bf16 d_weight whose fp32
// accumulator leaves no room for token chunks at 1 GiB gets a schedule that
// writes it once instead of an error. kTokenChunks still rounds at 64 MiB.
TEST(LinearCrossEntropyPlanTest, OperandDtypeLogitsGiveWayToFp32Schedules) {
  const int64_t kMiB = 1 << 20;
  lce::PlanInput in =
      BenchPlanInput(4096, 4096, 128256, 64 * kMiB, DType::kF32);
  in.operand_dtype_logits = true;
  const absl::StatusOr<lce::Plan> small = lce::MakePlan(in);
  ASSERT_OK(small.status());
  EXPECT_NE(small->schedule, LinearCrossEntropySchedule::kTokenChunks)
      << small->ToString();
  EXPECT_EQ(small->logit_bytes, 4) << small->ToString();
  in.schedule = LinearCrossEntropySchedule::kTokenChunks;
  const absl::StatusOr<lce::Plan> forced = lce::MakePlan(in);
  ASSERT_OK(forced.status());
  EXPECT_EQ(forced->logit_bytes, 2);
  EXPECT_GT(forced->estimated_seconds, small->estimated_seconds);

  lce::PlanInput bf16 = BenchPlanInput(4096, 4096, 128256, kGiB, DType::kBF16);
  bf16.operand_dtype_logits = true;
  const absl::StatusOr<lce::Plan> once = lce::MakePlan(bf16);
  ASSERT_OK(once.status());
  EXPECT_NE(once->schedule, LinearCrossEntropySchedule::kTokenChunks)
      << once->ToString();
  EXPECT_EQ(once->logit_bytes, 4);
  EXPECT_LE(once->total_bytes, kGiB);
}

// ---------------------------------------------------------------------------------------
// Special cases on every backend.

class LinearCrossEntropyTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      SKIP_WITHOUT_GPU();
    }
  }
  Device device() const { return GetParam() ? Device::Cuda(0) : Device::Cpu(); }
};

std::string BackendName(const testing::TestParamInfo<bool>& info) {
  return info.param ? "cuda" : "cpu";
}

TEST_P(LinearCrossEntropyTest, NoTokensGiveZeroLossAndGradients) {
  Scenario s;
  s.n = 0;
  s.bias = BiasKind::kF32;
  const Data data = MakeData(s, DType::kBF16, test::TestSeed());
  Harness h(s, DType::kBF16);
  ASSERT_OK(h.Init(device(), data));
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(LinearCrossEntropyForwardBackward(
      h.context(), h.inputs, h.options, h.loss.view, &h.lse.view, h.gradients));
  ASSERT_OK(h.DownloadOutputs());
  EXPECT_EQ(h.loss.Get(0), 0.0);
  for (int64_t i = 0; i < h.d_weight.numel(); ++i)
    ASSERT_EQ(h.d_weight.Get(i), 0.0);
  for (int64_t i = 0; i < h.d_bias.numel(); ++i)
    ASSERT_EQ(h.d_bias.Get(i), 0.0);
  // accumulate adds the zero gradient: d_weight and d_bias keep their values.
  for (int64_t i = 0; i < h.d_weight.numel(); ++i)
    h.d_weight.Set(i, 0.25 * static_cast<double>(i % 7) - 0.5);
  for (int64_t i = 0; i < h.d_bias.numel(); ++i)
    h.d_bias.Set(i, 0.125 * static_cast<double>(i % 5));
  ASSERT_OK(Upload(h.context(), h.d_weight));
  ASSERT_OK(Upload(h.context(), h.d_bias));
  LinearCrossEntropyGradients accumulating = h.gradients;
  accumulating.accumulate = true;
  ASSERT_OK(LinearCrossEntropyForwardBackward(h.context(), h.inputs, h.options,
                                              h.loss.view, &h.lse.view,
                                              accumulating));
  ASSERT_OK(h.DownloadOutputs());
  for (int64_t i = 0; i < h.d_weight.numel(); ++i)
    ASSERT_EQ(h.d_weight.Get(i), 0.25 * static_cast<double>(i % 7) - 0.5);
  for (int64_t i = 0; i < h.d_bias.numel(); ++i)
    ASSERT_EQ(h.d_bias.Get(i), 0.125 * static_cast<double>(i % 5));
}

TEST_P(LinearCrossEntropyTest, AllIgnoredGivesZeroLossAndGradients) {
  for (LinearCrossEntropySchedule schedule :
       {LinearCrossEntropySchedule::kTokenChunks,
        LinearCrossEntropySchedule::kTwoPass,
        LinearCrossEntropySchedule::kVocabSlices,
        LinearCrossEntropySchedule::kCompactChunks}) {
    Scenario s;
    s.ignore_fraction = 1.0;
    s.bias = BiasKind::kF32;
    s.z_loss = 1e-2f;
    s.smoothing = 0.1f;
    s.schedule = schedule;
    const Data data = MakeData(s, DType::kBF16, test::TestSeed());
    Harness h(s, DType::kBF16);
    ASSERT_OK(h.Init(device(), data));
    ASSERT_OK(h.PoisonOutputs());
    ASSERT_OK(LinearCrossEntropyForwardBackward(h.context(), h.inputs,
                                                h.options, h.loss.view,
                                                &h.lse.view, h.gradients));
    ASSERT_OK(h.DownloadOutputs());
    EXPECT_EQ(h.loss.Get(0), 0.0);
    for (Array* array : {&h.d_hidden, &h.d_weight, &h.d_bias}) {
      for (int64_t i = 0; i < array->numel(); ++i)
        ASSERT_EQ(array->Get(i), 0.0);
    }
  }
}

// Every bad call returns InvalidArgument and leaves every output poisoned.
TEST_P(LinearCrossEntropyTest, BadInputsAreRejectedAndWriteNothing) {
  Scenario s;
  s.bias = BiasKind::kF32;
  s.class_weights = true;
  const Data data = MakeData(s, DType::kBF16, test::TestSeed());
  Harness h(s, DType::kBF16);
  ASSERT_OK(h.Init(device(), data));
  Context& context = h.context();
  absl::StatusOr<Array> made = MakeArray(context, DType::kI64, {s.n});
  ASSERT_OK(made.status());
  Array wrong_target = std::move(made).value();
  for (int64_t i = 0; i < s.n; ++i) wrong_target.Set(i, data.targets[i]);
  wrong_target.Set(s.n / 2, s.v);  // out of range
  ASSERT_OK(Upload(context, wrong_target));
  made = MakeArray(context, DType::kF32, {s.v});
  ASSERT_OK(made.status());
  Array negative_weights = std::move(made).value();
  for (int64_t j = 0; j < s.v; ++j)
    negative_weights.Set(j, j == 7 ? -1.0 : 1.0);
  ASSERT_OK(Upload(context, negative_weights));
  Array host_hidden;  // on the CPU whatever the backend
  host_hidden.dtype = DType::kBF16;
  host_hidden.shape = {s.n, s.h};
  host_hidden.host.assign(s.n * s.h * 2, 0);

  struct Bad {
    std::string name;
    std::function<void(LinearCrossEntropyInputs&, LinearCrossEntropyOptions&,
                       LinearCrossEntropyGradients&, Tensor& loss)>
        edit;
  };
  std::vector<Bad> bads = {
      {"hidden rank",
       [](auto& in, auto&, auto&, auto&) {
         in.hidden.shape = {in.hidden.dim(0) * in.hidden.dim(1)};
       }},
      {"weight dtype",
       [](auto& in, auto&, auto&, auto&) { in.weight.dtype = DType::kF16; }},
      {"hidden size",
       [](auto& in, auto&, auto&, auto&) { in.weight.shape[1] -= 1; }},
      {"targets shape",
       [](auto& in, auto&, auto&, auto&) { in.targets.shape[0] -= 1; }},
      {"targets dtype",
       [](auto& in, auto&, auto&, auto&) { in.targets.dtype = DType::kF32; }},
      {"bias shape",
       [](auto& in, auto&, auto&, auto&) { in.bias->shape[0] += 1; }},
      {"bias dtype",
       [](auto& in, auto&, auto&, auto&) { in.bias->dtype = DType::kF16; }},
      {"d_bias missing",
       [](auto&, auto&, auto& g, auto&) { g.d_bias.reset(); }},
      {"d_bias without bias",
       [](auto& in, auto&, auto&, auto&) { in.bias.reset(); }},
      {"d_weight dtype",
       [](auto&, auto&, auto& g, auto&) { g.d_weight.dtype = DType::kF16; }},
      {"accumulate into a 16-bit d_weight",
       [](auto& in, auto&, auto& g, auto&) {
         g.accumulate = true;
         g.d_weight.dtype = in.weight.dtype;
       }},

      {"d_hidden shape",
       [](auto&, auto&, auto& g, auto&) { g.d_hidden.shape[0] += 1; }},
      {"loss shape", [](auto&, auto&, auto&, auto& loss) { loss.shape = {2}; }},
      {"null hidden",
       [](auto& in, auto&, auto&, auto&) { in.hidden.data = nullptr; }},
      {"row stride",
       [](auto& in, auto&, auto&, auto&) { in.hidden.row_stride = 3; }},
      {"smoothing", [](auto&, auto& o, auto&,
                       auto&) { o.cross_entropy.label_smoothing = 1.0f; }},
      {"z_loss",
       [](auto&, auto& o, auto&, auto&) { o.cross_entropy.z_loss = -1.0f; }},
      {"softcap",
       [](auto&, auto& o, auto&, auto&) { o.cross_entropy.softcap = NAN; }},
      {"class weights shape",
       [](auto&, auto& o, auto&, auto&) {
         o.cross_entropy.class_weights->shape[0] -= 1;
       }},
      {"budget",
       [](auto&, auto& o, auto&, auto&) { o.max_workspace_bytes = 1000; }},
      {"zero budget",
       [](auto&, auto& o, auto&, auto&) { o.max_workspace_bytes = 0; }},
      {"negative chunk rows",
       [](auto&, auto& o, auto&, auto&) { o.chunk_rows = -1; }},
      {"target out of range",
       [&](auto& in, auto&, auto&, auto&) { in.targets = wrong_target.view; }},
      {"negative class weight",
       [&](auto&, auto& o, auto&, auto&) {
         o.cross_entropy.class_weights = negative_weights.view;
       }},
      {"output overlaps input",
       [](auto& in, auto&, auto& g, auto&) {
         g.d_weight.data = in.weight.data;
         g.d_weight.dtype = in.weight.dtype;
       }},
      {"outputs overlap",
       [](auto&, auto&, auto& g, auto&) { g.d_bias->data = g.d_weight.data; }},
  };
  if (GetParam()) {
    bads.push_back({"hidden on the host", [&](auto& in, auto&, auto&, auto&) {
                      in.hidden =
                          Tensor::Of(host_hidden.host.data(), DType::kBF16,
                                     {s.n, s.h}, Device::Cpu());
                    }});
  }
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.name);
    LinearCrossEntropyInputs inputs = h.inputs;
    LinearCrossEntropyOptions options = h.options;
    LinearCrossEntropyGradients gradients = h.gradients;
    Tensor loss = h.loss.view;
    bad.edit(inputs, options, gradients, loss);
    ASSERT_OK(h.PoisonOutputs());
    const absl::Status status = LinearCrossEntropyForwardBackward(
        context, inputs, options, loss, &h.lse.view, gradients);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    ASSERT_OK(h.DownloadOutputs());
    for (Array* array : h.Outputs()) {
      for (int64_t i = 0; i < static_cast<int64_t>(array->host.size()) /
                                  DTypeSize(array->dtype);
           ++i) {
        ASSERT_TRUE(IsPoison(array->dtype, array->host, i))
            << "an output was written";
      }
    }
  }
}

// The budget error names the smallest budget that works, and that budget works.
// Also with the caller's chunk rows, on each schedule that takes them: the
// named budget runs chunks of exactly those rows.
TEST_P(LinearCrossEntropyTest, TooSmallBudgetNamesTheSmallestOne) {
  using S = LinearCrossEntropySchedule;
  const struct {
    S schedule;
    DType dtype;
    int64_t chunk_rows;
  } cases[] = {{S::kTokenChunks, DType::kF32, 0},
               {S::kTokenChunks, DType::kF32, 20},
               {S::kVocabSlices, DType::kF32, 16},
               {S::kCompactChunks, DType::kBF16, 24}};
  for (const auto& c : cases) {
    SCOPED_TRACE(absl::StrCat(ScheduleTestName(c.schedule), ", chunk rows ",
                              c.chunk_rows));
    Scenario s;
    s.schedule = c.schedule;
    s.chunk_rows = c.chunk_rows;
    const Data data = MakeData(s, c.dtype, test::TestSeed());
    Harness h(s, c.dtype);
    ASSERT_OK(h.Init(device(), data));
    h.options.max_workspace_bytes = 512;
    const absl::Status status = LinearCrossEntropyForwardBackward(
        h.context(), h.inputs, h.options, h.loss.view, &h.lse.view,
        h.gradients);
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    const std::string message(status.message());
    const size_t at = message.find("needs at least ");
    ASSERT_NE(at, std::string::npos) << message;
    h.options.max_workspace_bytes = std::stoll(message.substr(at + 15));
    ASSERT_OK(LinearCrossEntropyForwardBackward(h.context(), h.inputs,
                                                h.options, h.loss.view,
                                                &h.lse.view, h.gradients));
    if (c.chunk_rows > 0) {
      lce::PlanInput in = h.FusedPlanInput();
      in.lse_given = true;  // as the call above
      absl::StatusOr<lce::Plan> plan = lce::MakePlan(in);
      ASSERT_OK(plan.status());
      EXPECT_EQ(plan->chunk_rows, c.chunk_rows);
      // One byte less does not fit (to the bisection's byte).
      in.max_workspace_bytes -= 1;
      EXPECT_FALSE(lce::MakePlan(in).ok());
    }
  }
}

// Rows whose target is near certain (1 - p_t about 2e-8, far below an f32
// ulp of the lse): the target's gradient p_t - 1 must survive in d_weight and
// d_bias, whose norms it dominates here, on both schedules. The two-pass
// schedule's slices cannot recover p_t - 1 from the f32 lse of the row; they
// take the target's log-probability that the first pass computes from the row
// max and log-sum.
TEST_P(LinearCrossEntropyTest, NearCertainTargetsKeepTheirGradients) {
  for (LinearCrossEntropySchedule schedule :
       {LinearCrossEntropySchedule::kTokenChunks,
        LinearCrossEntropySchedule::kTwoPass,
        LinearCrossEntropySchedule::kVocabSlices}) {
    for (bool weighted_sum : {false, true}) {
      Scenario s;
      s.n = 8;
      s.h = 16;
      s.v = 300;
      s.bias = BiasKind::kF32;
      s.schedule = schedule;
      if (weighted_sum) {
        s.reduction = Reduction::kSum;
        s.class_weights = true;
      }
      SCOPED_TRACE(
          absl::StrCat(ScheduleTestName(schedule),
                       weighted_sum ? ", class weights, sum" : ", mean"));
      Data data = MakeData(s, DType::kF32, test::TestSeed());
      constexpr int64_t kCertain = 7;
      for (int64_t& target : data.targets) target = kCertain;
      data.bias[kCertain] = 24.0;
      Harness h(s, DType::kF32);
      ASSERT_OK(h.Init(device(), data));
      h.options.max_workspace_bytes = SmallestBudget(h.FusedPlanInput());
      ASSERT_OK(h.PoisonOutputs());
      ASSERT_OK(LinearCrossEntropyForwardBackward(h.context(), h.inputs,
                                                  h.options, h.loss.view,
                                                  &h.lse.view, h.gradients));
      ASSERT_OK(h.DownloadOutputs());
      const Expected e = Reference(s, data, {});
      // The case is what it claims: the target's gradient is tiny.
      ASSERT_LT(std::fabs(e.d_bias[kCertain]), 1e-6);
      ASSERT_GT(std::fabs(e.d_bias[kCertain]), 1e-10);
      ExpectLossAndLse(h, s, e, /*with_lse=*/true, "near-certain targets");
      ExpectGradients(h, DType::kF32, e, "near-certain targets");
      EXPECT_NEAR(h.d_bias.Get(kCertain), e.d_bias[kCertain],
                  1e-5 * std::fabs(e.d_bias[kCertain]));
    }
  }
}

// kVocabSlices computes target_logprob (z_t - lse, 0 for ignored tokens) from
// the merged statistics, on the forward and the fused pass, and refuses the
// extras and the entropy term that need whole rows: InvalidArgument, nothing
// written.
// operand_dtype_logits: refused (InvalidArgument, nothing written) for f32
// operands, with a bias, and with kTwoPass, kVocabSlices or kCompactChunks.
TEST_P(LinearCrossEntropyTest, OperandDtypeLogitsRefusals) {
  const struct {
    const char* name;
    DType dtype;
    BiasKind bias;
    LinearCrossEntropySchedule schedule;
  } refusals[] = {
      {"f32 operands", DType::kF32, BiasKind::kNone,
       LinearCrossEntropySchedule::kAuto},
      {"bias", DType::kBF16, BiasKind::kF32, LinearCrossEntropySchedule::kAuto},
      {"two-pass", DType::kBF16, BiasKind::kNone,
       LinearCrossEntropySchedule::kTwoPass},
      {"vocabulary slices", DType::kF16, BiasKind::kNone,
       LinearCrossEntropySchedule::kVocabSlices},
      {"compact chunks", DType::kBF16, BiasKind::kNone,
       LinearCrossEntropySchedule::kCompactChunks},
  };
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.name);
    Scenario s;
    s.bias = refusal.bias;
    s.schedule = refusal.schedule;
    s.operand_dtype_logits = true;
    const Data data = MakeData(s, refusal.dtype, test::TestSeed());
    Harness h(s, refusal.dtype);
    ASSERT_OK(h.Init(device(), data));
    ASSERT_OK(h.PoisonOutputs());
    const absl::Status status = LinearCrossEntropyForwardBackward(
        h.context(), h.inputs, h.options, h.loss.view, &h.lse.view,
        h.gradients);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("operand_dtype_logits"),
              absl::string_view::npos)
        << status;
    ASSERT_OK(h.DownloadOutputs());
    ExpectAllPoison(h.loss, "refused loss");
    ExpectAllPoison(h.d_hidden, "refused d_hidden");
    ExpectAllPoison(h.d_weight, "refused d_weight");
  }
}

// kCompactChunks writes target_logprob on the fused pass, and refuses what it
// cannot compute: f32 operands, the soft cap, whole-row statistics and the
// split backward, with InvalidArgument and nothing written.
TEST_P(LinearCrossEntropyTest, CompactChunksTargetLogprobAndRefusals) {
  Scenario s;
  s.n = 40;
  s.v = 260;
  s.logit_scale = 2.0;
  s.class_weights = true;
  s.ignore_fraction = 0.2;
  s.schedule = LinearCrossEntropySchedule::kCompactChunks;
  const Data data = MakeData(s, DType::kBF16, test::TestSeed());
  Harness h(s, DType::kBF16);
  ASSERT_OK(h.Init(device(), data));
  h.options.max_workspace_bytes = SmallestBudget(h.FusedPlanInput());
  Context& context = h.context();
  ASSERT_OK_AND_ASSIGN(Array logprob, MakeArray(context, DType::kF32, {s.n}));
  ASSERT_OK_AND_ASSIGN(Array predicted, MakeArray(context, DType::kI64, {s.n}));
  const ReferenceResult r = ReferenceOnLogits(s, data, {});
  {
    ASSERT_OK(h.PoisonOutputs());
    ASSERT_OK(PoisonArray(context, logprob));
    CrossEntropyExtras extras;
    extras.target_logprob = logprob.view;
    ASSERT_OK(LinearCrossEntropyForwardBackward(context, h.inputs, h.options,
                                                h.loss.view, &h.lse.view,
                                                h.gradients, nullptr, &extras));
    ASSERT_OK(Download(context, logprob));
    for (int64_t i = 0; i < s.n; ++i) {
      if (data.targets[i] == kIgnore) {
        EXPECT_EQ(logprob.Get(i), 0.0) << i;
        continue;
      }
      const double want = r.target_logprob[i];
      EXPECT_NEAR(logprob.Get(i), want, 1e-5 * std::fabs(want) + 1e-6) << i;
    }
  }
  const struct {
    const char* name;
    std::function<void(LinearCrossEntropyOptions&, CrossEntropyExtras&)> change;
  } refusals[] = {
      {"soft cap", [](auto& o, auto&) { o.cross_entropy.softcap = 5.0f; }},
      {"entropy_weight",
       [](auto& o, auto&) { o.cross_entropy.entropy_weight = 0.1f; }},
      {"predicted", [&](auto&, auto& e) { e.predicted = predicted.view; }},
  };
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.name);
    ASSERT_OK(h.PoisonOutputs());
    ASSERT_OK(PoisonArray(context, predicted));
    const Bytes predicted_before = predicted.host;
    LinearCrossEntropyOptions options = h.options;
    CrossEntropyExtras extras;
    refusal.change(options, extras);
    const absl::Status status = LinearCrossEntropyForwardBackward(
        context, h.inputs, options, h.loss.view, &h.lse.view, h.gradients,
        nullptr, &extras);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("kCompactChunks"), absl::string_view::npos)
        << status;
    ASSERT_OK(h.DownloadOutputs());
    ASSERT_OK(Download(context, predicted));
    ExpectAllPoison(h.loss, "refused loss");
    ExpectAllPoison(h.d_weight, "refused d_weight");
    EXPECT_TRUE(predicted.host == predicted_before) << "refused predicted";
  }
  // f32 operands.
  const Data data32 = MakeData(s, DType::kF32, test::TestSeed());
  Harness h32(s, DType::kF32);
  ASSERT_OK(h32.Init(device(), data32));
  ASSERT_OK(h32.PoisonOutputs());
  const absl::Status status = LinearCrossEntropyForwardBackward(
      h32.context(), h32.inputs, h32.options, h32.loss.view, &h32.lse.view,
      h32.gradients);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  ASSERT_OK(h32.DownloadOutputs());
  ExpectAllPoison(h32.loss, "f32 loss");
  ExpectAllPoison(h32.d_hidden, "f32 d_hidden");
}

TEST_P(LinearCrossEntropyTest, VocabSlicesTargetLogprobAndRefusedExtras) {
  Scenario s;
  s.n = 40;
  s.v = 260;
  s.softcap = 4.0f;
  s.logit_scale = 2.0;
  s.class_weights = true;
  s.ignore_fraction = 0.2;
  s.schedule = LinearCrossEntropySchedule::kVocabSlices;
  const Data data = MakeData(s, DType::kF32, test::TestSeed());
  Harness h(s, DType::kF32);
  ASSERT_OK(h.Init(device(), data));
  h.options.max_workspace_bytes = SmallestBudget(h.FusedPlanInput());
  Context& context = h.context();
  ASSERT_OK_AND_ASSIGN(Array logprob, MakeArray(context, DType::kF32, {s.n}));
  ASSERT_OK_AND_ASSIGN(Array predicted, MakeArray(context, DType::kI64, {s.n}));
  const ReferenceResult r = ReferenceOnLogits(s, data, {});
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "forward");
    ASSERT_OK(h.PoisonOutputs());
    ASSERT_OK(PoisonArray(context, logprob));
    CrossEntropyExtras extras;
    extras.target_logprob = logprob.view;
    ASSERT_OK(
        fused ? LinearCrossEntropyForwardBackward(context, h.inputs, h.options,
                                                  h.loss.view, &h.lse.view,
                                                  h.gradients, nullptr, &extras)
              : LinearCrossEntropyForward(context, h.inputs, h.options,
                                          h.loss.view, &h.lse.view, &extras));
    ASSERT_OK(h.DownloadOutputs());
    ASSERT_OK(Download(context, logprob));
    for (int64_t i = 0; i < s.n; ++i) {
      if (data.targets[i] == kIgnore) {
        EXPECT_EQ(logprob.Get(i), 0.0) << i;
        continue;
      }
      const double want = r.target_logprob[i];
      EXPECT_NEAR(logprob.Get(i), want, 1e-5 * std::fabs(want) + 1e-6) << i;
    }
  }
  for (bool entropy_weight : {false, true}) {
    ASSERT_OK(h.PoisonOutputs());
    ASSERT_OK(PoisonArray(context, predicted));
    const Bytes predicted_before = predicted.host;
    CrossEntropyExtras extras;
    LinearCrossEntropyOptions options = h.options;
    if (entropy_weight) {
      options.cross_entropy.entropy_weight = 0.1f;
    } else {
      extras.predicted = predicted.view;
    }
    const absl::Status status = LinearCrossEntropyForward(
        context, h.inputs, options, h.loss.view, &h.lse.view, &extras);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    ASSERT_OK(h.DownloadOutputs());
    ASSERT_OK(Download(context, predicted));
    ExpectAllPoison(h.loss, "refused loss");
    ExpectAllPoison(h.lse, "refused lse");
    EXPECT_TRUE(predicted.host == predicted_before) << "refused predicted";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LinearCrossEntropyTest, testing::Bool(),
                         BackendName);

// ---------------------------------------------------------------------------------------
// GPU: the bits do not depend on the GEMM tuning, and the precision of f32
// gradients of 16-bit operands is what the header says.

// A budget of at most 16 token chunks, from the smallest budget up (the
// allocator's 2 MiB granularity makes the count jump): the first chunk's
// d_weight and d_bias GEMMs have beta = 0, the later ones accumulate.
int64_t FewChunksBudget(lce::PlanInput input) {
  int64_t budget = SmallestBudget(input);
  for (;;) {
    input.max_workspace_bytes = budget;
    const absl::StatusOr<lce::Plan> plan = lce::MakePlan(input);
    if (plan.ok() && plan->num_chunks <= 16) return budget;
    budget += budget / 10;
  }
}

// The outputs' bytes after one fused call on the harness's context.
absl::StatusOr<std::vector<Bytes>> FusedOutputs(Harness& h) {
  RETURN_IF_ERROR(h.PoisonOutputs());
  RETURN_IF_ERROR(LinearCrossEntropyForwardBackward(
      h.context(), h.inputs, h.options, h.loss.view, &h.lse.view, h.gradients));
  RETURN_IF_ERROR(h.DownloadOutputs());
  std::vector<Bytes> outputs;
  for (Array* array : h.Outputs()) outputs.push_back(array->host);
  return outputs;
}

// Runs the fused call on `h` (with a budget of a few token chunks) and adds
// its outputs to `runs`.
void RunChunkedCall(Harness& h, const std::string& what,
                    std::vector<std::vector<Bytes>>& runs) {
  SCOPED_TRACE(what);
  h.options.max_workspace_bytes = FewChunksBudget(h.FusedPlanInput());
  const absl::StatusOr<lce::Plan> plan = lce::MakePlan(h.FusedPlanInput());
  ASSERT_OK(plan.status());
  EXPECT_GE(plan->num_chunks, 3) << plan->ToString();
  EXPECT_EQ(plan->schedule, LinearCrossEntropySchedule::kTokenChunks);
  ASSERT_OK_AND_ASSIGN(std::vector<Bytes> outputs, FusedOutputs(h));
  for (Array* array : h.Outputs()) ExpectWrittenExactly(*array, what);
  runs.push_back(std::move(outputs));
}

// A context's first call tunes its GEMMs on the way (the first chunk's
// beta = 0 d_weight GEMM chooses for the accumulating chunks after it too; the
// last, shorter chunk is a shape of its own, never tuned; the d_bias GEMV is
// never tuned: timing its candidates on one chunk let the d_bias of two fresh
// contexts differ); a second call runs them tuned; a context with tuning off
// runs the heuristic's first choices throughout. All write the same bytes:
// loss, lse, d_hidden, d_weight and d_bias.
TEST(LinearCrossEntropyCudaTest, ChunkedGradientsDoNotDependOnGemmTuning) {
  SKIP_WITHOUT_GPU();
  // f32 gradients; bf16 ones through fp32 accumulators, rounded once; bf16
  // ones summed in bf16 (fp32_gradient_accumulation off: the GEMMs accumulate
  // into the bf16 outputs with beta = 1).
  for (int variant = 0; variant < 3; ++variant) {
    const bool f32_outputs = variant == 0;
    const bool fp32_sums = variant != 2;
    SCOPED_TRACE(f32_outputs ? "f32 gradients"
                 : fp32_sums ? "bf16 gradients, fp32 sums"
                             : "bf16 gradients, bf16 sums");
    Scenario s;
    s.n = 777;
    s.h = 256;
    s.v = 1536;
    s.bias = BiasKind::kOperand;
    s.d_hidden_f32 = f32_outputs;
    s.d_weight_f32 = f32_outputs;
    s.d_bias_f32 = f32_outputs;
    s.ignore_fraction = 0.1;
    s.schedule = LinearCrossEntropySchedule::kTokenChunks;
    const Data data = MakeData(s, DType::kBF16, test::TestSeed());
    std::vector<std::vector<Bytes>> runs;
    Harness first(s, DType::kBF16);  // each harness makes its own context
    ASSERT_OK(first.Init(Device::Cuda(0), data));
    first.options.fp32_gradient_accumulation = fp32_sums;
    RunChunkedCall(first, "fresh context", runs);
    RunChunkedCall(first, "same context", runs);
    Harness second(s, DType::kBF16);
    ASSERT_OK(second.Init(Device::Cuda(0), data));
    second.options.fp32_gradient_accumulation = fp32_sums;
    RunChunkedCall(second, "new context", runs);
    Harness untuned(s, DType::kBF16);
    ASSERT_OK(untuned.Init(Device::Cuda(0), data));
    untuned.options.fp32_gradient_accumulation = fp32_sums;
    ASSERT_OK(untuned.context().set_gemm_tuning(false));
    RunChunkedCall(untuned, "context with tuning off", runs);
    ASSERT_EQ(runs.size(), 4u);
    const char* names[] = {"loss", "lse", "d_hidden", "d_weight", "d_bias"};
    for (size_t run = 1; run < runs.size(); ++run) {
      for (size_t k = 0; k < runs[0].size(); ++k) {
        EXPECT_TRUE(runs[run][k] == runs[0][k])
            << names[k] << " of run " << run << " differs from the first's";
      }
    }
  }
}

// With bf16 or f16 operands and f32 gradient outputs, the gradients are
// products of the dlogits rounded to the operand dtype (the header's
// "Precision"), d_bias included: they agree with a double reference that
// rounds the dlogits the same way far more closely than with the exact
// gradients.
//
// Let u be the operand dtype's unit roundoff (2^-8 bf16, 2^-11 f16; 16-bit
// values are 2u apart, relatively). Against the rounding reference the error
// is the fp32 accumulation's (a few 2^-24 times the square root of the sums'
// lengths, about 1e-6 here) plus the dlogits whose fp32 value and exact value
// round to neighbouring 16-bit values: a fraction of about d / (2u) of them,
// d ~ 2^-22 being the fp32 dlogit's relative error, each off by 2u, so a
// relative Frobenius error of about sqrt(2 d u), 4e-5 for bf16 and 1.5e-5 for
// f16, under the bounds (1e-4, 5e-5). Against the exact gradients the error
// is the rounding itself, up to u per dlogit; it is nearly the same for every
// target entry ((p_t - 1) / count each, p_t ~ 1/V), so it does not average
// out and lies between about min(p_t, u) and u, in the band [1e-5, 2u] (2u:
// for the cancellation in sums like d_bias). If f32 outputs were computed from
// fp32 dlogits, the exact error would fall to the accumulation's (below 1e-5)
// and the rounding reference's would rise to the rounding's: the assertions
// would fail, and the header would have to change.
// The reference's dlogits as the kernels store them for 16-bit operands:
// scaled (f16 with the mean: a power of two), rounded to the operand dtype,
// unscaled exactly by the GEMMs' alpha.
std::vector<double> KernelDlogits(const Scenario& s, DType dtype,
                                  const ReferenceResult& r) {
  const double scale =
      lce::DlogitsScale(dtype, static_cast<int>(s.reduction), r.ce_denominator);
  std::vector<double> rounded(r.grad.size());
  for (size_t i = 0; i < rounded.size(); ++i)
    rounded[i] = RoundTo(dtype, r.grad[i] * scale) / scale;
  return rounded;
}

class LinearCrossEntropyPrecisionTest
    : public testing::TestWithParam<
          std::tuple<DType, LinearCrossEntropySchedule>> {};

TEST_P(LinearCrossEntropyPrecisionTest, F32GradientsCarryTheDlogitsRounding) {
  SKIP_WITHOUT_GPU();
  const DType dtype = std::get<0>(GetParam());
  Scenario s;
  s.n = 512;
  s.h = 128;
  s.v = 2000;
  s.bias = BiasKind::kF32;
  s.d_hidden_f32 = true;
  s.d_weight_f32 = true;
  s.d_bias_f32 = true;
  s.ignore_fraction = 0.1;
  s.schedule = std::get<1>(GetParam());
  const Data data = MakeData(s, dtype, test::TestSeed());
  Harness h(s, dtype);
  ASSERT_OK(h.Init(Device::Cuda(0), data));
  h.options.max_workspace_bytes = SmallestBudget(h.FusedPlanInput());
  ASSERT_OK(FusedOutputs(h).status());

  const ReferenceResult r = ReferenceOnLogits(s, data, {});
  Expected exact;
  SetGradients(s, data, r.grad, exact);
  const std::vector<double> rounded = KernelDlogits(s, dtype, r);
  Expected emulated;
  SetGradients(s, data, rounded, emulated);

  // u: the unit roundoff of the operand dtype.
  const double u = dtype == DType::kBF16 ? 0x1p-8 : 0x1p-11;
  const double emulation_bound = dtype == DType::kBF16 ? 1e-4 : 5e-5;
  const struct {
    const char* name;
    const Array& got;
    const std::vector<double>& exact;
    const std::vector<double>& emulated;
  } gradients[] = {{"d_hidden", h.d_hidden, exact.d_hidden, emulated.d_hidden},
                   {"d_weight", h.d_weight, exact.d_weight, emulated.d_weight},
                   {"d_bias", h.d_bias, exact.d_bias, emulated.d_bias}};
  for (const auto& g : gradients) {
    ExpectWrittenExactly(g.got, g.name);
    const double to_emulated = NormRelativeError(g.got, g.emulated);
    const double to_exact = NormRelativeError(g.got, g.exact);
    std::printf(
        "%s %s: relative error %.3g against the rounded dlogits' "
        "products, %.3g against the exact gradient\n",
        DTypeName(dtype), g.name, to_emulated, to_exact);
    EXPECT_GT(to_exact, 1e-5) << g.name;
    EXPECT_LT(to_exact, 2 * u) << g.name;
    if (s.schedule == LinearCrossEntropySchedule::kCompactChunks) {
      // The fp16 probabilities' rounding comes on top of the dlogits':
      // within half as much again of the rounded dlogits' own error.
      double diff = 0, norm = 0;
      for (size_t i = 0; i < g.exact.size(); ++i) {
        diff += (g.emulated[i] - g.exact[i]) * (g.emulated[i] - g.exact[i]);
        norm += g.exact[i] * g.exact[i];
      }
      const double rounding = std::sqrt(diff / norm);
      std::printf("%s %s: the rounded dlogits' own error %.3g\n",
                  DTypeName(dtype), g.name, rounding);
      EXPECT_LT(to_exact, 1.5 * rounding) << g.name;
    } else {
      EXPECT_LT(to_emulated, emulation_bound) << g.name;
      EXPECT_LT(10 * to_emulated, to_exact) << g.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    SixteenBitOperands, LinearCrossEntropyPrecisionTest,
    testing::Combine(
        testing::Values(DType::kBF16, DType::kF16),
        testing::Values(LinearCrossEntropySchedule::kTokenChunks,
                        LinearCrossEntropySchedule::kTwoPass,
                        LinearCrossEntropySchedule::kVocabSlices,
                        LinearCrossEntropySchedule::kCompactChunks)),
    [](const testing::TestParamInfo<
        std::tuple<DType, LinearCrossEntropySchedule>>& info) {
      return absl::StrCat(DTypeName(std::get<0>(info.param)), "_",
                          ScheduleTestName(std::get<1>(info.param)));
    });

// ---------------------------------------------------------------------------------------
// fp32_gradient_accumulation off: a bf16 d_weight and d_bias summed over
// token chunks in the outputs themselves, rounded after every chunk, with no
// fp32 accumulator in the plan. Emulated in double from the dlogits rounded as
// the kernels round them (F32GradientsCarryTheDlogitsRounding): the running
// sums rounded to bf16 after each chunk, against the default's single rounding
// of the whole sum. Each call matches its own emulation to about the fp32
// accumulation's flips of a bf16 rounding (a few 1e-5 relative) and the other
// one's to the roundings' difference (a few 1e-3 with 5 chunks): the factor 4
// between them fails if the option changes nothing, or rounds more or less
// often than once a chunk.

// d_weight [V, H] and d_bias [V] of `dlogits` [N, V], their running sums over
// chunks of `chunk_rows` rows rounded to bf16 after each chunk (chunk_rows >=
// N: once).
void BfloatSumsOverChunks(const Scenario& s, const Data& d,
                          const std::vector<double>& dlogits,
                          int64_t chunk_rows, Expected& e) {
  const int64_t n = s.n, h = s.h, v = s.v;
  e.d_weight.assign(v * h, 0.0);
  e.d_bias.assign(v, 0.0);
  std::vector<double> weight_part(v * h), bias_part(v);
  for (int64_t begin = 0; begin < n; begin += chunk_rows) {
    std::fill(weight_part.begin(), weight_part.end(), 0.0);
    std::fill(bias_part.begin(), bias_part.end(), 0.0);
    for (int64_t i = begin; i < std::min(n, begin + chunk_rows); ++i) {
      for (int64_t j = 0; j < v; ++j) {
        const double g = dlogits[i * v + j];
        bias_part[j] += g;
        for (int64_t k = 0; k < h; ++k)
          weight_part[j * h + k] += g * d.hidden[i * h + k];
      }
    }
    for (int64_t i = 0; i < v * h; ++i)
      e.d_weight[i] = RoundTo(DType::kBF16, e.d_weight[i] + weight_part[i]);
    for (int64_t j = 0; j < v; ++j)
      e.d_bias[j] = RoundTo(DType::kBF16, e.d_bias[j] + bias_part[j]);
  }
}

TEST_P(LinearCrossEntropyTest, OutputDtypeAccumulationRoundsEveryChunk) {
  Scenario s;
  s.n = 300;
  s.h = 64;
  s.v = 500;
  s.bias = BiasKind::kOperand;
  s.d_weight_f32 = false;
  s.d_bias_f32 = false;
  s.ignore_fraction = 0.1;
  s.schedule = LinearCrossEntropySchedule::kTokenChunks;
  s.chunk_rows = 64;  // 5 chunks, the last of 44 rows
  const Data data = MakeData(s, DType::kBF16, test::TestSeed());

  const ReferenceResult r = ReferenceOnLogits(s, data, {});
  const std::vector<double> rounded = KernelDlogits(s, DType::kBF16, r);
  Expected per_chunk, once;
  BfloatSumsOverChunks(s, data, rounded, s.chunk_rows, per_chunk);
  BfloatSumsOverChunks(s, data, rounded, s.n, once);

  for (bool fp32_accumulation : {false, true}) {
    SCOPED_TRACE(fp32_accumulation ? "fp32 accumulators" : "bf16 outputs");
    Harness h(s, DType::kBF16);
    ASSERT_OK(h.Init(device(), data));
    h.options.fp32_gradient_accumulation = fp32_accumulation;
    const absl::StatusOr<lce::Plan> plan = lce::MakePlan(h.FusedPlanInput());
    ASSERT_OK(plan.status());
    EXPECT_EQ(plan->num_chunks, 5) << plan->ToString();
    EXPECT_EQ(plan->d_weight_acc_offset >= 0, fp32_accumulation);
    EXPECT_EQ(plan->d_bias_acc_offset >= 0, fp32_accumulation);
    ASSERT_OK(FusedOutputs(h).status());
    const Expected& own = fp32_accumulation ? once : per_chunk;
    const Expected& other = fp32_accumulation ? per_chunk : once;
    const struct {
      const char* name;
      const Array& got;
      const std::vector<double>& own;
      const std::vector<double>& other;
    } gradients[] = {{"d_weight", h.d_weight, own.d_weight, other.d_weight},
                     {"d_bias", h.d_bias, own.d_bias, other.d_bias}};
    for (const auto& g : gradients) {
      ExpectWrittenExactly(g.got, g.name);
      const double to_own = NormRelativeError(g.got, g.own);
      const double to_other = NormRelativeError(g.got, g.other);
      std::printf(
          "%s, %s: %.3g from the emulation of its roundings, %.3g from the "
          "other's\n",
          fp32_accumulation ? "fp32 accumulators" : "rounded every chunk",
          g.name, to_own, to_other);
      EXPECT_LT(4 * to_own, to_other) << g.name;
      EXPECT_LT(to_other, 4 * 0x1p-8) << g.name;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Finite differences of the op's own forward on the CPU (f32), for both
// schedules.

TEST(LinearCrossEntropyGradientTest, MatchesFiniteDifferences) {
  for (LinearCrossEntropySchedule schedule :
       {LinearCrossEntropySchedule::kTokenChunks,
        LinearCrossEntropySchedule::kTwoPass,
        LinearCrossEntropySchedule::kVocabSlices}) {
    Scenario s;
    s.n = 6;
    s.h = 5;
    s.v = 13;
    s.bias = BiasKind::kF32;
    s.reduction = Reduction::kSum;
    s.smoothing = 0.1f;
    s.z_loss = 0.02f;
    s.softcap = 2.5f;
    s.class_weights = true;
    s.d_hidden_f32 = true;
    s.schedule = schedule;
    s.logit_scale = 1.5;
    const uint64_t seed = test::TestSeed();
    Data data = MakeData(s, DType::kF32, seed);
    data.targets[2] = kIgnore;
    Harness h(s, DType::kF32);
    ASSERT_OK(h.Init(Device::Cpu(), data));
    h.options.max_workspace_bytes = SmallestBudget(h.FusedPlanInput());
    ASSERT_OK(LinearCrossEntropyForwardBackward(
        h.context(), h.inputs, h.options, h.loss.view, nullptr, h.gradients));
    ASSERT_OK(h.DownloadOutputs());
    auto loss_at = [&](Array& array, int64_t i, double value) {
      const double saved = array.Get(i);
      array.Set(i, value);
      EXPECT_TRUE(Upload(h.context(), array).ok());
      EXPECT_TRUE(LinearCrossEntropyForward(h.context(), h.inputs, h.options,
                                            h.loss.view)
                      .ok());
      EXPECT_TRUE(Download(h.context(), h.loss).ok());
      array.Set(i, saved);
      EXPECT_TRUE(Upload(h.context(), array).ok());
      return h.loss.Get(0);
    };
    const double eps = 1e-2;
    auto check = [&](Array& input, const Array& gradient, const char* name) {
      for (int64_t i = 0; i < input.numel();
           i += std::max<int64_t>(1, input.numel() / 9)) {
        const double x = input.Get(i);
        const double fd =
            (loss_at(input, i, x + eps) - loss_at(input, i, x - eps)) /
            (2 * eps);
        EXPECT_NEAR(gradient.Get(i), fd, 2e-3 + 1e-2 * std::fabs(fd))
            << name << "[" << i << "]";
      }
    };
    check(h.hidden, h.d_hidden, "d_hidden");
    check(h.weight, h.d_weight, "d_weight");
    check(h.bias, h.d_bias, "d_bias");
  }
}

}  // namespace
}  // namespace lossrt
