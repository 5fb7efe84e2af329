// Device math shared by every cross-entropy kernel: element conversions, the
// row statistics (max, sum of exponentials, target logit) and their warp
// reduction, the per-row loss and gradient coefficients, programmatic
// dependent launch and the unpacking of 16-byte pieces. Internal to //loss.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_ROW_STATS_CUH_
#define LOSSRT_LOSS_CROSS_ENTROPY_ROW_STATS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "loss/cross_entropy_kernels.h"
#include "loss/cross_entropy_softcap.h"
#include "runtime/device_convert.cuh"

namespace lossrt {
namespace ce {

constexpr int kMaxThreads = 512;
constexpr int kMaxCluster = 8;  // the portable cluster size
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float NegInf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float QuietNaN() {
  return __int_as_float(0x7fffffff);
}

using device_convert::FromFloat;
using device_convert::ToFloat;

// Raw storage of kW elements of T: one 16/8/4/2-byte access.
template <int kBytes>
struct RawVec;
template <>
struct RawVec<16> {
  using Type = uint4;
};
template <>
struct RawVec<8> {
  using Type = uint2;
};
template <>
struct RawVec<4> {
  using Type = uint32_t;
};
template <>
struct RawVec<2> {
  using Type = uint16_t;
};

template <typename G, int kW>
__device__ __forceinline__ void StoreVec(G* ptr, const float (&values)[kW]) {
  using Raw = typename RawVec<sizeof(G) * kW>::Type;
  union {
    Raw raw;
    G elements[kW];
  } data;
#pragma unroll
  for (int k = 0; k < kW; ++k) data.elements[k] = FromFloat<G>(values[k]);
  if constexpr (sizeof(Raw) == 16) {
    __stcs(reinterpret_cast<Raw*>(ptr), data.raw);
  } else {
    *reinterpret_cast<Raw*>(ptr) = data.raw;
  }
}

// Partial statistics of a row: max m, rest = sum of exp(z - m) minus one (the
// max's own term, exactly 1, is left out so that lse = m + log1p(rest) keeps
// its precision when one logit dominates: a float 1 + rest would round rest to
// 1e-7), the target's z (0 where the target is elsewhere) and sum of w_j * z_j
// (for label smoothing).
struct RowStats {
  float max;
  float rest;
  float target_logit;
  float weighted_sum;
};

// No elements: max -inf, sum 0 (rest -1).
__device__ __forceinline__ RowStats IdentityStats() {
  return RowStats{NegInf(), -1.0f, 0.0f, 0.0f};
}

// The extras' partial statistics of a thread (kExtras kernels only), relative
// to its RowStats::max: the entropy's sum_j e_j (z_j - max), e_j = exp(z_j -
// max), and the index of its first logit equal to the max (kNoIndex: none;
// in the warp-row kernel's tile loop, the first piece of the tile that holds
// it, AccumulateStreamed). Kept apart from RowStats, whose 16 bytes the
// plain kernels' cluster exchange moves.
struct ExtraStats {
  float centered;
  int argmax;
};

constexpr int kNoIndex = 0x7fffffff;

__device__ __forceinline__ ExtraStats IdentityExtras() {
  return ExtraStats{0.0f, kNoIndex};
}

// A partial's centered sum moved to the max m >= stats.max:
// e^{max - m} (centered + (max - m) S), S = rest + 1.
__device__ __forceinline__ float CenteredAt(const RowStats& stats,
                                            float centered, float m) {
  if (stats.max == NegInf()) return 0.0f;
  const float d = stats.max - m;
  if (d == 0.0f) return centered;
  return __expf(d) * (centered + d * (stats.rest + 1.0f));
}

// The merge of two partials of one thread's elements (call before Combine of
// their RowStats).
__device__ __forceinline__ ExtraStats CombineExtras(const RowStats& a,
                                                    const ExtraStats& ea,
                                                    const RowStats& b,
                                                    const ExtraStats& eb) {
  const float m = fmaxf(a.max, b.max);
  ExtraStats out;
  out.centered = CenteredAt(a, ea.centered, m) + CenteredAt(b, eb.centered, m);
  out.argmax = a.max == b.max  ? min(ea.argmax, eb.argmax)
               : a.max > b.max ? ea.argmax
                               : eb.argmax;
  return out;
}

// The row's extras reduce through the RowStats reductions (WarpReduce,
// ReduceRow, GroupCombine, the cluster exchange) once the row's max m is
// known: `max` carries the argmax as a key that fmaxf orders (a normal
// positive float whose bits fall as the index rises; 0 for a thread without
// the row's max), `target_logit` (a plain sum) the centered sum at m.
constexpr int kIndexKeyBase = 0x00800000 + (1 << 30);

__device__ __forceinline__ RowStats PackExtras(const RowStats& thread,
                                               const ExtraStats& extra,
                                               float row_max) {
  RowStats packed{0.0f, -1.0f, CenteredAt(thread, extra.centered, row_max),
                  0.0f};
  if (thread.max == row_max && extra.argmax != kNoIndex)
    packed.max = __int_as_float(kIndexKeyBase - extra.argmax);
  return packed;
}

// The row's argmax from its reduced PackExtras (0 when no logit equals the
// max: a NaN row).
__device__ __forceinline__ int UnpackArgmax(const RowStats& packed) {
  return packed.max > 0.0f ? kIndexKeyBase - __float_as_int(packed.max) : 0;
}

// The row's extras reduced with its statistics (WarpReduceWithExtras: the
// centered sum already at the row's max) in PackExtras' reduced form, which
// FinishRow reads.
__device__ __forceinline__ RowStats PackReducedExtras(const ExtraStats& row) {
  RowStats packed{0.0f, -1.0f, row.centered, 0.0f};
  if (row.argmax != kNoIndex)
    packed.max = __int_as_float(kIndexKeyBase - row.argmax);
  return packed;
}

// Online-softmax merge with one exponential: the side with the smaller max is
// scaled. Symmetric to the bit (so butterfly reductions give every lane the
// same value).
__device__ __forceinline__ RowStats Combine(const RowStats& a,
                                            const RowStats& b) {
  const float max = fmaxf(a.max, b.max);
  float rest;
  if (a.max == b.max) {
    rest = (a.rest + b.rest) +
           1.0f;  // both sides' max terms: one stays out of rest
  } else {
    const float min = fminf(a.max, b.max);
    const float scale = min == NegInf() ? 0.0f : __expf(min - max);
    rest = a.max > b.max ? a.rest + (b.rest + 1.0f) * scale
                         : b.rest + (a.rest + 1.0f) * scale;
  }
  return RowStats{max, rest, a.target_logit + b.target_logit,
                  a.weighted_sum + b.weighted_sum};
}

// exp2 on the special-function unit (relative error ~2^-22; flushes results
// below 2^-126).
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr float kLog2e = 1.4426950408889634f;

// log2 on the special-function unit (absolute error ~2^-22 near 1; -inf at
// 0, flushing subnormals).
__device__ __forceinline__ float FastLog2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr float kLn2 = 0.6931471805599453f;

// 1 / x on the special-function unit (relative error ~2^-23; flushes
// subnormals).
__device__ __forceinline__ float FastRcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The soft cap z = softcap * tanh(x * inv_cap) (loss/cross_entropy_softcap.h:
// two MUFU ops and about 15 others, no branch, as CUDA's tanhf less its
// saturation test). Monotone non-decreasing over the host test's
// dense sweep (SoftCapTest.ErrorBoundAndMonotone); the kernels that need a
// row's max to equal exactly the cap of its largest logit (the extras' argmax)
// take the max over the capped values themselves.
__device__ __forceinline__ float SoftCap(float x, float softcap,
                                         float inv_cap) {
  return SoftCapWith(
      x, softcap, inv_cap, [](float a) { return FastExp2(a); },
      [](float d) { return FastRcp(d); });
}

// The butterfly sums of WarpReduce (kWeighted: the label-smoothing sum too),
// the same bits in every lane.
template <bool kWeighted>
__device__ __forceinline__ void ButterflySums(float& rest, float& target_logit,
                                              float& weighted_sum) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    rest += __shfl_xor_sync(kFullMask, rest, offset);
    target_logit += __shfl_xor_sync(kFullMask, target_logit, offset);
    if (kWeighted)
      weighted_sum += __shfl_xor_sync(kFullMask, weighted_sum, offset);
  }
}

// The warp's statistics, in every lane: the max first, then each lane's sum
// rescaled to it once (one exponential a lane, not one a shuffle round) and
// summed by a butterfly (the same bits in every lane). Lanes whose max is the
// warp's keep their "rest" and add their exact 1s as a count, so the sum keeps
// its precision when one logit dominates.
// kWeighted: the label-smoothing sum is reduced too (kOpt kernels only).
template <bool kWeighted = true>
__device__ __forceinline__ RowStats WarpReduce(RowStats stats) {
  float max = stats.max;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    max = fmaxf(max, __shfl_xor_sync(kFullMask, max, offset));
  float rest;
  unsigned tie_lanes = 0;
  if (max == NegInf()) {
    rest = stats.rest + 1.0f;  // 0, or NaN from a NaN probe
  } else {
    const bool tie = stats.max == max;
    tie_lanes = __ballot_sync(kFullMask, tie);
    rest = tie ? stats.rest : (stats.rest + 1.0f) * __expf(stats.max - max);
  }
  float target_logit = stats.target_logit, weighted_sum = stats.weighted_sum;
  ButterflySums<kWeighted>(rest, target_logit, weighted_sum);
  return RowStats{max, rest + static_cast<float>(__popc(tie_lanes) - 1),
                  target_logit, weighted_sum};
}

// WarpReduce with a lane's extras (kExtras kernels): the same arithmetic, so
// the same RowStats bits, and in every lane the warp's extras: each lane's
// centered sum moved to the warp's max by the exponential that scales its
// "rest" (a lane without logits adds 0) and summed by the same butterfly, and
// the lowest argmax of the lanes that hold the max (one redux). One reduction
// of the row carries both, where a second one after the max was known cost
// the fused kernels a block and cluster barrier a row.
template <bool kWeighted = true>
__device__ __forceinline__ void WarpReduceWithExtras(RowStats& stats,
                                                     ExtraStats& extra) {
  float max = stats.max;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    max = fmaxf(max, __shfl_xor_sync(kFullMask, max, offset));
  const bool tie = stats.max == max;
  float rest, centered;
  unsigned tie_lanes = 0;
  if (max == NegInf()) {
    rest = stats.rest + 1.0f;  // 0, or NaN from a NaN probe
    centered = 0.0f;
  } else {
    tie_lanes = __ballot_sync(kFullMask, tie);
    const float d = stats.max - max;
    const float scale = __expf(d);
    rest = tie ? stats.rest : (stats.rest + 1.0f) * scale;
    centered = tie ? extra.centered
               : stats.max == NegInf()
                   ? 0.0f
                   : scale * (extra.centered + d * (stats.rest + 1.0f));
  }
  const int argmax = static_cast<int>(__reduce_min_sync(
      kFullMask, static_cast<unsigned>(tie ? extra.argmax : kNoIndex)));
  float target_logit = stats.target_logit, weighted_sum = stats.weighted_sum;
  ButterflySums<kWeighted>(rest, target_logit, weighted_sum);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    centered += __shfl_xor_sync(kFullMask, centered, offset);
  stats = RowStats{max, rest + static_cast<float>(__popc(tie_lanes) - 1),
                   target_logit, weighted_sum};
  extra = ExtraStats{centered, argmax};
}

__device__ __forceinline__ int64_t LoadTarget(const RowArgs& args,
                                              int64_t row) {
  return args.targets_i64 ? static_cast<const int64_t*>(args.targets)[row]
                          : static_cast<const int32_t*>(args.targets)[row];
}

// Per-row scalars of the loss and its gradient (see loss/cross_entropy.h for
// the math):
//   dz_j = coef * p_j - smooth_w * w_j            (j != t)
//   dz_t = coef * expm1(z_t - lse) + (coef - target_coef) - smooth_w * w_t
// Writing dz_t through expm1 keeps p_t - 1 exact when p_t is near 1; far
// from 1 the kernels write coef * p_t - target_coef - smooth_w * w_t
// (TargetGrad), which keeps p_t's digits.
struct RowCoefficients {
  bool ignored;
  bool valid_target;
  int64_t target;
  float target_weight;
  float ce_scale;  // gradient scale of the cross-entropy part (incoming grad /
                   // denominator)
  float z_scale;   // same for the z-loss part
  // Elements of the row's view before its first class (RowView::lead): the
  // target is an index of the view (ViewTarget), the argmax is found in it.
  int lead;
};

// The mean's scales: 1 / denominator in float (1 unless the reduction is kMean;
// 0 for an empty denominator). Kernels form them once, so that rows multiply
// instead of dividing in double.
struct MeanScales {
  float ce_inv = 1.0f;
  float z_inv = 1.0f;
};

__device__ __forceinline__ MeanScales LoadMeanScales(const RowArgs& args) {
  MeanScales m;
  if (args.reduction == kMean) {
    const double ce = args.stats->ce_denominator, z = args.stats->z_denominator;
    m.ce_inv = ce > 0 ? static_cast<float>(1.0 / ce) : 0.0f;
    m.z_inv = z > 0 ? static_cast<float>(1.0 / z) : 0.0f;
  }
  return m;
}

// Programmatic dependent launch (sm_90): a row kernel may start while the
// target scan before it runs. Everything older than the scan is complete when
// the scan starts, so the logits and targets may be read at once; only the
// scan's results wait for griddepcontrol.wait. Without the launch attribute
// (or before sm_90) both instructions do nothing.
__device__ __forceinline__ void WaitForPrerequisiteGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void LetDependentGridsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 to fetch `bytes` (a multiple of 16, from a 16-byte aligned `ptr`)
// ahead of the loads that will read them (sm_90 bulk prefetch, one
// instruction): bytes in flight from HBM without registers, for the fused
// kernel, whose registers hold only the row it works on (and the next). The
// forward's warps measured slower with it: they keep enough loads in flight
// themselves, and the prefetches only add traffic to L2.
__device__ __forceinline__ void PrefetchL2(const void* ptr, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bytes > 0) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr),
                 "r"(bytes)
                 : "memory");
  }
#endif
}

// Bytes of the `vecs_wanted` 16-byte pieces from piece `first` of a row of
// `row_bytes` bytes that lie wholly inside it (the row's partial last piece is
// left to the load).
__device__ __forceinline__ int WholePieceBytes(int64_t first, int vecs_wanted,
                                               int64_t row_bytes) {
  const int64_t whole = row_bytes / 16 - first;
  return whole <= 0
             ? 0
             : 16 * static_cast<int>(whole < vecs_wanted ? whole : vecs_wanted);
}

// The target scan's results a row kernel needs: the mean's scales and the
// class weights' total.
struct ScanResults {
  MeanScales mean;
  float weight_total;
};

__device__ __forceinline__ float WeightTotal(const RowArgs& args);

__device__ __forceinline__ ScanResults LoadScanResults(const RowArgs& args) {
  WaitForPrerequisiteGrids();
  return ScanResults{LoadMeanScales(args), WeightTotal(args)};
}

__device__ __forceinline__ RowCoefficients MakeCoefficients(
    const RowArgs& args, int64_t row, bool with_grad, const MeanScales& mean) {
  RowCoefficients c;
  c.lead = 0;
  c.target = LoadTarget(args, row);
  c.ignored = c.target == args.ignore_index;
  c.valid_target = !c.ignored && c.target >= 0 && c.target < args.vocab;
  c.target_weight = (args.class_weights != nullptr && c.valid_target)
                        ? args.class_weights[c.target]
                        : 1.0f;
  float grad = 1.0f;
  if (with_grad && args.grad_loss != nullptr)
    grad = args.grad_loss[args.grad_loss_per_row ? row : 0];
  c.ce_scale = grad * mean.ce_inv;
  c.z_scale = grad * mean.z_inv;
  return c;
}

// Moves the row's target into its view, `lead` elements early (RowView):
// the target's weight is taken already, from its class. A target that is not
// a class of the row (ignored or out of range) becomes -1, which matches no
// element of the view.
__device__ __forceinline__ void ViewTarget(RowCoefficients& c, int lead) {
  c.lead = lead;
  if (lead != 0) c.target = c.valid_target ? c.target + lead : -1;
}

__device__ __forceinline__ float WeightTotal(const RowArgs& args) {
  return args.class_weights != nullptr
             ? static_cast<float>(args.stats->weight_total)
             : static_cast<float>(args.vocab);
}

// The gradient's per-row constants (see RowCoefficients). p_j = exp((z_j -
// shift) - log_sum) with shift = max and log_sum = log1p(rest) in the fused
// pass (exact for huge logits, where lse = max + log_sum would round), or shift
// = saved lse and log_sum = 0 in the backward.
// With entropy_weight (kOpt kernels), dz_j += ent_coef * p_j * (d_j + H),
// d_j = (z_j - shift) - log_sum = z_j - lse.
struct GradCoefficients {
  float coef;
  float target_coef;
  float smooth_w;
  float inv_cap;  // 1 / softcap, 0 when off
  float shift;
  float log_sum;
  float ent_coef;  // incoming grad * entropy_weight / count; 0 when off
  float entropy;   // H of the row
};

__device__ __forceinline__ GradCoefficients
MakeGradCoefficients(const RowArgs& args, const RowCoefficients& c, float lse,
                     float weight_total, float shift, float log_sum) {
  GradCoefficients g;
  g.shift = shift;
  g.log_sum = log_sum;
  const float s = args.label_smoothing;
  g.target_coef = c.ce_scale * (1.0f - s) * c.target_weight;
  g.smooth_w = c.ce_scale * s / static_cast<float>(args.vocab);
  // The z-loss term only where it is on: 0 * lse would turn an lse of +inf
  // (a +inf logit) into a NaN gradient where PyTorch has 0 and -1.
  g.coef = g.target_coef + g.smooth_w * weight_total +
           (args.z_loss > 0.0f ? 2.0f * c.z_scale * args.z_loss * lse : 0.0f);
  g.inv_cap = args.softcap > 0.0f ? 1.0f / args.softcap : 0.0f;
  g.ent_coef = 0.0f;
  g.entropy = 0.0f;
  return g;
}

// The gradient's coefficients of a backward from the saved lse (shift = lse).
__device__ __forceinline__ GradCoefficients
SavedGradCoefficients(const RowArgs& args, int64_t row,
                      const RowCoefficients& c, float weight_total) {
  const float lse = args.lse[row];
  GradCoefficients g =
      MakeGradCoefficients(args, c, lse, weight_total, lse, 0.0f);
  if (args.entropy_weight != 0.0f && c.valid_target) {
    // The entropy of a statistics pass run before (the saved lse lacks it).
    g.ent_coef = c.z_scale * args.entropy_weight;
    g.entropy = args.entropy[row];
  }
  return g;
}

// Writes the row's loss (scaled for the mean) and lse; one thread per row calls
// it.
__device__ __forceinline__ void WriteRowLoss(const RowArgs& args, int64_t row,
                                             const RowCoefficients& c,
                                             const RowStats& total, float lse,
                                             float weight_total,
                                             const MeanScales& mean,
                                             float entropy = 0.0f) {
  float loss = 0.0f;
  if (!c.ignored) {
    if (!c.valid_target) {
      loss = QuietNaN();
    } else {
      const float s = args.label_smoothing;
      // lse - z_t as (max - z_t) + log1p(rest): small and exact when p_t is
      // near 1.
      const float nll = (total.max - total.target_logit) + log1pf(total.rest);
      const float ce =
          (1.0f - s) * c.target_weight * nll +
          (s > 0.0f ? s / args.vocab * (weight_total * lse - total.weighted_sum)
                    : 0.0f);
      float zl = args.z_loss > 0.0f ? args.z_loss * lse * lse : 0.0f;
      // The entropy term is scaled as the z-loss part (by the count).
      if (args.entropy_weight != 0.0f) zl -= args.entropy_weight * entropy;
      loss = ce * mean.ce_inv + zl * mean.z_inv;
    }
  }
  args.row_loss[row] = loss;
  if (args.lse != nullptr) args.lse[row] = lse;
  // The target's log-probability needs no statistic beyond the loss's, so
  // every forward writes it when asked (HasExtras leaves it out): the linear
  // cross-entropy's two-pass schedule reads it where the f32 lse cannot give
  // p_t - 1.
  if (args.target_logprob != nullptr) {
    args.target_logprob[row] =
        c.valid_target
            ? -((total.max - total.target_logit) + log1pf(total.rest))
            : (c.ignored ? 0.0f : QuietNaN());
  }
}

// Writes the row's extras (one thread a row): predicted, entropy and the
// accuracy's term (WriteRowLoss writes the target's log-probability). The
// scan's results are loaded. `argmax` is an index of the row's view, as
// c.target: one in its lead (-inf, as the logits past the row) is the max
// only of a row of -inf, whose first class, 0, is then its argmax.
__device__ __forceinline__ void WriteRowExtras(const RowArgs& args, int64_t row,
                                               const RowCoefficients& c,
                                               const RowStats& total,
                                               int argmax, float entropy) {
  if (argmax < c.lead) argmax = c.lead;
  const bool hit = c.valid_target && argmax == c.target;
  if (argmax != kNoIndex) argmax -= c.lead;
  if (args.predicted != nullptr) {
    if (args.predicted_i64) {
      static_cast<int64_t*>(args.predicted)[row] = argmax;
    } else {
      static_cast<int32_t*>(args.predicted)[row] = argmax;
    }
  }
  const float fill = c.ignored ? 0.0f : QuietNaN();
  if (args.entropy != nullptr)
    args.entropy[row] = c.valid_target ? entropy : fill;
  if (args.row_hit != nullptr) {
    const double den = args.stats->ce_denominator;
    args.row_hit[row] =
        hit && den > 0 ? c.target_weight * static_cast<float>(1.0 / den) : 0.0f;
  }
}

// Unpacks one 16-byte piece to floats and applies the soft cap. The piece was
// loaded with -inf past the vocabulary (Tile::Load), so only a soft cap, which
// takes -inf to -cap, needs the test for the row's end: a per-piece test in
// every pass over a tile cost the fp32 forward a branch, a barrier pair and
// register copies a piece.
template <typename T, int kW>
__device__ __forceinline__ void UnpackVec(const uint4& raw, int base, int vocab,
                                          float softcap, float inv_cap,
                                          float (&out)[kW]) {
  union {
    uint4 raw;
    T elements[kW];
  } data;
  data.raw = raw;
#pragma unroll
  for (int k = 0; k < kW; ++k) out[k] = ToFloat(data.elements[k]);
  if (inv_cap > 0.0f) {
#pragma unroll
    for (int k = 0; k < kW; ++k) out[k] = SoftCap(out[k], softcap, inv_cap);
  }
  if (inv_cap > 0.0f && base + kW > vocab) {
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      if (base + k >= vocab) out[k] = NegInf();
    }
  }
}

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_ROW_STATS_CUH_
