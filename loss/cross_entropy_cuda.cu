// CUDA kernels of the cross-entropy op, tuned on an H200 (sm_90):
//
// - WarpRowKernel (forward): a warp streams each row with 16-byte loads, eight
//   pieces per lane in flight, online max/sum per lane and a shuffle
//   reduction: no block barriers, a persistent grid, one read of the logits.
//   Long fp32 rows are shared by 2 or 4 warps of a block (WarpGroup), whose
//   totals meet in shared memory behind a named barrier.
//   For fp32 the next tile (of the row or the next row) is loaded before the
//   current one is reduced. 16-bit logits, and fp32 from vocab 32768, take the
//   fast exponential sum (no tie test a logit; RowNeedsExactPass rows, whose
//   max holds over half the probability, are streamed again exactly), with or
//   without options.
// - RowKernel (fused forward+backward): a row is split over a thread-block
//   cluster of C CTAs (C = 1 up to 8) and held in registers; statistics are
//   reduced in the warp, the block and the cluster (distributed shared
//   memory), and the gradient is written from the registers: one read, one
//   write. Rows without a soft cap keep exp(x - thread max), fp32 ones in
//   place of their logits and 16-bit ones in a FloatTile, so the gradient is
//   one multiply a logit (TileStatsKeepExp). Rows longer than a cluster holds
//   are tiled and re-read. For fp32 rows one CTA holds, a variant loads the
//   next row before reducing the current one.
// - PipelinedBackwardKernel / BackwardKernel: gradient from a saved lse, one
//   read, one write.
// - TargetStatsKernel, SumRowsKernel: one-block scans in a fixed order.
//
// Tiles are loaded with -inf past the vocabulary, so that passes over a tile
// test no piece for the row's end.
//
// Every reduction has a fixed shape and order, so results are bitwise
// reproducible. The RowArgs tune_* fields override the automatic launch choices
// for the benchmark's sweep.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "loss/cross_entropy_cuda.h"

namespace cg = cooperative_groups;

namespace lossrt {
namespace ce {
namespace {

constexpr int kMaxThreads = 512;
constexpr int kMaxCluster = 8;  // the portable cluster size
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float NegInf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float QuietNaN() {
  return __int_as_float(0x7fffffff);
}

template <typename T>
__device__ __forceinline__ float ToFloat(T value);
template <>
__device__ __forceinline__ float ToFloat<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half value) {
  return __half2float(value);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float value);
template <>
__device__ __forceinline__ float FromFloat<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float value) {
  return __float2half_rn(value);
}

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
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    rest += __shfl_xor_sync(kFullMask, rest, offset);
    target_logit += __shfl_xor_sync(kFullMask, target_logit, offset);
    if (kWeighted)
      weighted_sum += __shfl_xor_sync(kFullMask, weighted_sum, offset);
  }
  return RowStats{max, rest + static_cast<float>(__popc(tie_lanes) - 1),
                  target_logit, weighted_sum};
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
// Writing dz_t through expm1 keeps p_t - 1 exact when p_t is near 1.
struct RowCoefficients {
  bool ignored;
  bool valid_target;
  int64_t target;
  float target_weight;
  float ce_scale;  // gradient scale of the cross-entropy part (incoming grad /
                   // denominator)
  float z_scale;   // same for the z-loss part
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
// forward's warps lost by it (fp32: 72 -> 81 us at vocab 4096, 1894 -> 2132
// at 131072 on the H200): they keep enough loads in flight themselves, and
// the prefetches only add traffic to L2.
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

__device__ __forceinline__ float WeightTotal(const RowArgs& args) {
  return args.class_weights != nullptr
             ? static_cast<float>(args.stats->weight_total)
             : static_cast<float>(args.vocab);
}

// The gradient's per-row constants (see RowCoefficients). p_j = exp((z_j -
// shift) - log_sum) with shift = max and log_sum = log1p(rest) in the fused
// pass (exact for huge logits, where lse = max + log_sum would round), or shift
// = saved lse and log_sum = 0 in the backward.
struct GradCoefficients {
  float coef;
  float target_coef;
  float smooth_w;
  float inv_cap;  // 1 / softcap, 0 when off
  float shift;
  float log_sum;
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
  return g;
}

// The gradient's coefficients of a backward from the saved lse (shift = lse).
__device__ __forceinline__ GradCoefficients
SavedGradCoefficients(const RowArgs& args, int64_t row,
                      const RowCoefficients& c, float weight_total) {
  const float lse = args.lse[row];
  return MakeGradCoefficients(args, c, lse, weight_total, lse, 0.0f);
}

// Writes the row's loss (scaled for the mean) and lse; one thread per row calls
// it.
__device__ __forceinline__ void WriteRowLoss(const RowArgs& args, int64_t row,
                                             const RowCoefficients& c,
                                             const RowStats& total, float lse,
                                             float weight_total,
                                             const MeanScales& mean) {
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
      const float zl = args.z_loss > 0.0f ? args.z_loss * lse * lse : 0.0f;
      loss = ce * mean.ce_inv + zl * mean.z_inv;
    }
  }
  args.row_loss[row] = loss;
  if (args.lse != nullptr) args.lse[row] = lse;
}

// Unpacks one 16-byte piece to floats, applies the soft cap, and turns elements
// past the vocabulary into -inf. kPadded: the piece was loaded with -inf past
// the vocabulary (Tile::Load), so only a soft cap, which takes -inf to -cap,
// needs the test; else (the zero-filled copies of the pipelined backward)
// every piece takes it. A per-piece test in every pass over a tile cost the
// fp32 forward a branch, a barrier pair and register copies a piece.
template <typename T, int kW, bool kPadded = false>
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
    for (int k = 0; k < kW; ++k) out[k] = softcap * tanhf(out[k] * inv_cap);
  }
  if ((!kPadded || inv_cap > 0.0f) && base + kW > vocab) {
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      if (base + k >= vocab) out[k] = NegInf();
    }
  }
}

// R pieces of a row per thread, `stride` pieces apart, piece r starting at
// vector index first + r * stride. Vectorized tiles keep raw 16-byte pieces and
// unpack them on use, so 16-bit logits keep as many bytes in flight as fp32 for
// the same registers.
template <typename T, int R, bool kVec>
struct Tile;

template <typename T, int R>
struct Tile<T, R, true> {
  static constexpr int kW = 16 / sizeof(T);
  // 16-bit pieces take their max in pairs, before unpacking (PackedMax).
  static constexpr bool kPackedMax = sizeof(T) == 2;
  using Element = T;
  uint4 raw[R];

  __device__ __forceinline__ void Load(const T* row, int vocab, int first,
                                       int stride) {
    const int full_vecs = vocab / kW;
    if (first + (R - 1) * stride < full_vecs) {
      // Every piece is whole (most threads of most tiles): no per-piece tests.
#pragma unroll
      for (int r = 0; r < R; ++r)
        raw[r] =
            __ldcs(reinterpret_cast<const uint4*>(row) + first + r * stride);
      return;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int vec = first + r * stride;
      if (vec < full_vecs) {
        // Streaming load: the logits are read once, keep them from evicting
        // reusable lines.
        raw[r] = __ldcs(reinterpret_cast<const uint4*>(row) + vec);
      } else {
        // The row's partial last piece, or one past the row: -inf past the
        // vocabulary, so that whole-tile passes need no per-piece test.
        union {
          uint4 raw;
          T elements[kW];
        } data;
        const T neg_inf = FromFloat<T>(NegInf());
#pragma unroll
        for (int k = 0; k < kW; ++k) {
          data.elements[k] = vec * kW + k < vocab ? row[vec * kW + k] : neg_inf;
        }
        raw[r] = data.raw;
      }
    }
  }
  __device__ __forceinline__ void Unpack(int r, int base, int vocab,
                                         float softcap, float inv_cap,
                                         float (&x)[kW]) const {
    UnpackVec<T, kW, true>(raw[r], base, vocab, softcap, inv_cap, x);
  }
  // Piece r as four floats, as stored (fp32 tiles only).
  __device__ __forceinline__ void Floats(int r, float (&x)[kW]) const {
    static_assert(sizeof(T) == 4, "only fp32 tiles hold floats");
    x[0] = __uint_as_float(raw[r].x);
    x[1] = __uint_as_float(raw[r].y);
    x[2] = __uint_as_float(raw[r].z);
    x[3] = __uint_as_float(raw[r].w);
  }
  // Overwrites piece r with four floats (fp32 tiles only).
  __device__ __forceinline__ void Store(int r, const float (&x)[kW]) {
    static_assert(sizeof(T) == 4, "only fp32 tiles hold floats");
    raw[r] = make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]),
                        __float_as_uint(x[2]), __float_as_uint(x[3]));
  }
};

template <typename T, int R>
struct Tile<T, R, false> {
  static constexpr int kW = 1;
  static constexpr bool kPackedMax = false;
  using Element = T;
  float value[R];

  __device__ __forceinline__ void Load(const T* row, int vocab, int first,
                                       int stride) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int e = first + r * stride;
      value[r] = e < vocab ? ToFloat(row[e]) : 0.0f;
    }
  }
  __device__ __forceinline__ void Unpack(int r, int base, int vocab,
                                         float softcap, float inv_cap,
                                         float (&x)[1]) const {
    float v = value[r];
    if (inv_cap > 0.0f) v = softcap * tanhf(v * inv_cap);
    x[0] = base < vocab ? v : NegInf();
  }
};

// The row's target as an int when it is a class of the row, else -1: the
// per-piece "does this piece hold the target" test is then one 32-bit
// compare (an ignored or out-of-range target matches no piece; its row's loss
// and gradient do not read the target's logit).
__device__ __forceinline__ int TargetInRow(int64_t target, int vocab) {
  return static_cast<uint64_t>(target) < static_cast<uint64_t>(vocab)
             ? static_cast<int>(target)
             : -1;
}

// Everything a tile pass needs to know about its row.
struct RowView {
  int vocab;
  int first;
  int stride;
  float softcap;
  float inv_cap;
  const float* weights;
};

// Max of two pairs of 16-bit values (one HMNMX2): a max is exact in the
// logits' own type, so 16-bit tiles need not unpack for it. Like fmaxf, a NaN
// loses to a number.
template <typename T>
__device__ __forceinline__ uint32_t PairMax(uint32_t a, uint32_t b) {
  using Pair = typename std::conditional<std::is_same<T, __half>::value,
                                         __half2, __nv_bfloat162>::type;
  union {
    uint32_t bits;
    Pair pair;
  } x, y, m;
  x.bits = a;
  y.bits = b;
  m.pair = __hmax2(x.pair, y.pair);
  return m.bits;
}

// A pair of -inf in T.
template <typename T>
__device__ constexpr uint32_t PairNegInf() {
  return std::is_same<T, __half>::value ? 0xfc00fc00u : 0xff80ff80u;
}

// This thread's max over R 16-byte pieces of 16-bit logits, in four partial
// maxima, taken in pairs (Tile::Load pads the row's end with -inf).
template <typename T, typename TileT, int R>
__device__ __forceinline__ void PackedMax(const TileT& tile,
                                          float (&max_part)[4]) {
  uint32_t pairs[4] = {PairNegInf<T>(), PairNegInf<T>(), PairNegInf<T>(),
                       PairNegInf<T>()};
#pragma unroll
  for (int r = 0; r < R; ++r) {
    pairs[0] = PairMax<T>(pairs[0], tile.raw[r].x);
    pairs[1] = PairMax<T>(pairs[1], tile.raw[r].y);
    pairs[2] = PairMax<T>(pairs[2], tile.raw[r].z);
    pairs[3] = PairMax<T>(pairs[3], tile.raw[r].w);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    union {
      uint32_t bits;
      T elements[2];
    } pair;
    pair.bits = pairs[i];
    max_part[i] = fmaxf(max_part[i], fmaxf(ToFloat(pair.elements[0]),
                                           ToFloat(pair.elements[1])));
  }
}

// The reference a thread's fast exponential sum is taken against: its max,
// 0 for a thread of only -inf (its terms are then 0, or NaN from a NaN), and
// the largest float for one holding +inf (whose term is then +inf: its row's
// lse is +inf, as the exact pass has it).
__device__ __forceinline__ float ExpReference(float thread_max) {
  return thread_max == NegInf() ? 0.0f : fminf(thread_max, 3.402823466e38f);
}

// A fast sum (the max's 1 included) gives rest = sum - 1 to within a few
// float roundings of 1 + rest: precise while rest >= 1. Below that one logit
// holds more than half of the row's probability, and the row takes the exact
// pass, which leaves the max's 1 out. The same in every thread of the row.
__device__ __forceinline__ bool RowNeedsExactPass(const RowStats& total) {
  return !(total.rest >= 1.0f);
}

// Label smoothing's w_j (1 without class weights); `index` past the row is
// clamped to its last class, whose weight a masked element never uses.
__device__ __forceinline__ float SmoothingWeight(const float* weights,
                                                 int index, int vocab) {
  return weights != nullptr ? weights[min(index, vocab - 1)] : 1.0f;
}

// Adds label smoothing's w_j * z_j over the piece at `base` to `sum`, elements
// past the vocabulary left out.
template <int kW>
__device__ __forceinline__ void AddWeightedSum(const float (&x)[kW], int base,
                                               int vocab, const float* weights,
                                               float& sum) {
#pragma unroll
  for (int j = 0; j < kW; ++j) {
    if (base + j < vocab)
      sum += weights != nullptr ? weights[base + j] * x[j] : x[j];
  }
}

// Sum of exp(x - ref) over a tile, in four independent accumulators. (x - ref)
// is formed before the scaling by log2(e), so that the largest terms are
// exact. kKeep also writes each exponential to `kept` (over its own logit for
// fp32 tiles, kept == &tile), for a gradient of one multiply a logit. kCap
// applies the soft cap; kSmooth with `smoothing` adds the label-smoothing sum
// of w_j * z_j over the tile to `weighted_sum`.
template <int R, bool kKeep, bool kCap = false, bool kSmooth = false,
          typename TileT, typename KeptT = TileT>
__device__ __forceinline__ float TileExpSum(const TileT& tile,
                                            const RowView& view, float ref,
                                            KeptT* kept = nullptr,
                                            bool smoothing = false,
                                            float* weighted_sum = nullptr) {
  constexpr int kW = TileT::kW;
  const float softcap = kCap ? view.softcap : 0.0f;
  const float inv_cap = kCap ? view.inv_cap : 0.0f;
  float sum_part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    float x[kW];
    tile.Unpack(r, base, view.vocab, softcap, inv_cap, x);
    if (kSmooth && smoothing)
      AddWeightedSum<kW>(x, base, view.vocab, view.weights, *weighted_sum);
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      x[j] = FastExp2((x[j] - ref) * kLog2e);
      sum_part[(r * kW + j) % 4] += x[j];
    }
    if constexpr (kKeep) kept->Store(r, x);
  }
  return (sum_part[0] + sum_part[1]) + (sum_part[2] + sum_part[3]);
}

// This thread's statistics of one tile: its max, then the sum of exp relative
// to it. Four independent accumulators break the dependency chains (a 16-bit
// tile holds 64 values).
// kOpt: soft cap, label smoothing or class weights may be on; without it they
// are compiled out of the common case.
// kFastSum: the exponential sum without a tie test a logit; rows whose max
// dominates then need the exact pass (RowNeedsExactPass).
template <typename TileT, int R, bool kOpt, bool kFastSum = false>
__device__ __forceinline__ RowStats TileStats(const TileT& tile,
                                              const RowView& view,
                                              int64_t target, bool smoothing) {
  constexpr int kW = TileT::kW;
  const float softcap = kOpt ? view.softcap : 0.0f;
  const float inv_cap = kOpt ? view.inv_cap : 0.0f;
  const float* weights = kOpt ? view.weights : nullptr;
  smoothing = kOpt && smoothing;
  constexpr int kParts = 4;
  float max_part[kParts], sum_part[kParts];
#pragma unroll
  for (int i = 0; i < kParts; ++i) {
    max_part[i] = NegInf();
    sum_part[i] = 0.0f;
  }
  // A soft cap is applied on unpacking, so its tiles take the max after it.
  bool packed = false;
  if constexpr (TileT::kPackedMax) packed = inv_cap == 0.0f;
  if (packed) {
    if constexpr (TileT::kPackedMax) {
      PackedMax<typename TileT::Element, TileT, R>(tile, max_part);
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float x[kW];
      tile.Unpack(r, (view.first + r * view.stride) * kW, view.vocab, softcap,
                  inv_cap, x);
#pragma unroll
      for (int j = 0; j < kW; ++j)
        max_part[(r * kW + j) % kParts] =
            fmaxf(max_part[(r * kW + j) % kParts], x[j]);
    }
  }
  RowStats s = IdentityStats();
  s.max =
      fmaxf(fmaxf(max_part[0], max_part[1]), fmaxf(max_part[2], max_part[3]));
  float nan_probe =
      0.0f;  // fmaxf drops NaN; an all-NaN tile must still poison the sum
  float ties =
      0.0f;  // elements equal to the max: their exact 1s are counted apart
  // kFastSum: the sum with the max's own exact 1 in it, one exponential and
  // one add a logit and no tie test; rest = sum - 1 then loses the low bits of
  // a row whose max dominates, which the caller redoes (RowNeedsExactPass).
  if (kFastSum) {
    s.rest = TileExpSum<R, false, kOpt>(tile, view, ExpReference(s.max)) - 1.0f;
  } else if (s.max != NegInf()) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float x[kW];
      tile.Unpack(r, (view.first + r * view.stride) * kW, view.vocab, softcap,
                  inv_cap, x);
      // (x - max) first: exact for the largest terms, unlike a fused x*log2e -
      // max*log2e, whose rounding is huge for large logits.
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        const bool tie = x[j] == s.max;
        ties += tie ? 1.0f : 0.0f;
        sum_part[(r * kW + j) % kParts] +=
            tie ? 0.0f : FastExp2((x[j] - s.max) * kLog2e);
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float x[kW];
      tile.Unpack(r, (view.first + r * view.stride) * kW, view.vocab, softcap,
                  inv_cap, x);
#pragma unroll
      for (int j = 0; j < kW; ++j) nan_probe += x[j] != x[j] ? x[j] : 0.0f;
    }
  }
  const int target_in_row = TargetInRow(target, view.vocab);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    const bool holds_target =
        static_cast<unsigned>(target_in_row - base) < static_cast<unsigned>(kW);
    if (!holds_target && !smoothing) continue;
    float x[kW];
    tile.Unpack(r, base, view.vocab, softcap, inv_cap, x);
    if (holds_target) {
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        if (base + j == target_in_row) s.target_logit = x[j];
      }
    }
    if (smoothing)
      AddWeightedSum<kW>(x, base, view.vocab, weights, s.weighted_sum);
  }
  if (!kFastSum) {
    const float others =
        (sum_part[0] + sum_part[1]) + (sum_part[2] + sum_part[3]) + nan_probe;
    s.rest = s.max == NegInf() ? -1.0f + nan_probe : others + (ties - 1.0f);
  }
  return s;
}

// Stores the gradient of the piece at `base` (whole or the row's partial last
// one). Ignored rows get zeros; an unvalidated out-of-range target poisons its
// row (its loss is NaN too), as on the CPU.
template <typename G, int kW>
__device__ __forceinline__ void StorePieceGrad(G* grad_row, int base, int vocab,
                                               const RowCoefficients& c,
                                               float (&g)[kW]) {
  if (!c.valid_target) {
    const float fill = c.ignored ? 0.0f : QuietNaN();
#pragma unroll
    for (int j = 0; j < kW; ++j) g[j] = fill;
  }
  if (base + kW <= vocab) {
    StoreVec<G, kW>(grad_row + base, g);
  } else {
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      if (base + j < vocab) grad_row[base + j] = FromFloat<G>(g[j]);
    }
  }
}

// The gradient of one tile, written once in G.
template <typename G, typename TileT, int R, bool kOpt>
__device__ __forceinline__ void TileGrad(const TileT& tile, const RowView& view,
                                         G* grad_row,
                                         const GradCoefficients& gc,
                                         const RowCoefficients& c) {
  constexpr int kW = TileT::kW;
  const float softcap = kOpt ? view.softcap : 0.0f;
  const float inv_cap = kOpt ? view.inv_cap : 0.0f;
  const float* weights = kOpt ? view.weights : nullptr;
  const float smooth_w = kOpt ? gc.smooth_w : 0.0f;
  const int target_in_row = TargetInRow(c.target, view.vocab);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    if (base >= view.vocab) continue;
    float x[kW], g[kW];
    tile.Unpack(r, base, view.vocab, softcap, inv_cap, x);
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      // The argument is formed before the scaling by log2(e): exact for the
      // large p.
      g[j] = gc.coef * FastExp2(((x[j] - gc.shift) - gc.log_sum) * kLog2e);
      if (kOpt)
        g[j] -= smooth_w * SmoothingWeight(weights, base + j, view.vocab);
    }
    if (static_cast<unsigned>(target_in_row - base) <
        static_cast<unsigned>(kW)) {
      // The target's p - 1 through expm1, exact when p is near 1 (one element a
      // row).
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        if (base + j == target_in_row) {
          g[j] = gc.coef * expm1f((x[j] - gc.shift) - gc.log_sum) +
                 (gc.coef - gc.target_coef) -
                 smooth_w * SmoothingWeight(weights, base + j, view.vocab);
        }
      }
    }
    if (inv_cap > 0.0f) {
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        const float t = x[j] * inv_cap;  // d z / d x = 1 - tanh^2
        g[j] *= 1.0f - t * t;
      }
    }
    StorePieceGrad<G, kW>(grad_row, base, view.vocab, c, g);
  }
}

// The fused pass without a soft cap, in one exponential a logit: each logit's
// e = exp(x - ref) (ref: the thread's max) is kept in registers, and the
// gradient is then p = e * exp(ref - lse), one multiply a logit. fp32 tiles
// keep e over their own logits; 16-bit tiles unpack into a FloatTile of
// floats (the registers an fp32 tile of the same elements takes), so their
// gradient is rounded once, from the float p. A row whose max dominates
// (RowNeedsExactPass) takes its exact "rest" (the sum without the max's own
// 1) from the kept e (ExactRestFromExp). Non-finite logits give what the
// exact pass gives (TileStats and TileGrad).
struct ExpTileStats {
  RowStats stats;
  float ref;  // the thread's max (-inf: its e are all 0)
};

// R pieces of kW floats in the layout of the 16-bit tile they came from: the
// kept exponentials of the pass without a soft cap, or the unpacked (and soft
// capped) logits of the pass with one, so that a row is unpacked once
// (unpacking a raw tile on each use spilled that kernel by a kilobyte).
// Elements past the vocabulary hold -inf. Unpack ignores its soft cap, applied
// on filling.
template <int R, int kWidth>
struct FloatTile {
  static constexpr int kW = kWidth;
  static constexpr bool kPackedMax = false;
  using Element = float;
  float v[R][kW];

  template <typename TileT>
  __device__ __forceinline__ void Fill(const TileT& tile, const RowView& view) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      tile.Unpack(r, (view.first + r * view.stride) * kW, view.vocab,
                  view.softcap, view.inv_cap, v[r]);
  }
  __device__ __forceinline__ void Unpack(int r, int, int, float, float,
                                         float (&x)[kW]) const {
    Floats(r, x);
  }
  __device__ __forceinline__ void Floats(int r, float (&x)[kW]) const {
#pragma unroll
    for (int j = 0; j < kW; ++j) x[j] = v[r][j];
  }
  __device__ __forceinline__ void Store(int r, const float (&x)[kW]) {
#pragma unroll
    for (int j = 0; j < kW; ++j) v[r][j] = x[j];
  }
};

// The tile's statistics, its e written to `kept` (which may be the fp32 tile
// itself: piece r is read before it is overwritten). kOpt: class weights or
// label smoothing may be on, a soft cap may not (its gradient needs the capped
// logits, which the kept e replace).
template <typename TileT, int R, bool kOpt, typename KeptT>
__device__ __forceinline__ ExpTileStats TileStatsKeepExp(const TileT& tile,
                                                         const RowView& view,
                                                         int64_t target,
                                                         bool smoothing,
                                                         KeptT& kept) {
  constexpr int kW = TileT::kW;
  static_assert(KeptT::kW == kW, "kept pieces match the tile's");
  float max_part[4] = {NegInf(), NegInf(), NegInf(), NegInf()};
  float target_logit = 0.0f;
  const int target_in_row = TargetInRow(target, view.vocab);
  if constexpr (TileT::kPackedMax) {
    PackedMax<typename TileT::Element, TileT, R>(tile, max_part);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    const bool holds_target =
        static_cast<unsigned>(target_in_row - base) < static_cast<unsigned>(kW);
    if (TileT::kPackedMax && !holds_target) continue;
    float x[kW];
    tile.Unpack(r, base, view.vocab, 0.0f, 0.0f, x);
    if constexpr (!TileT::kPackedMax) {
#pragma unroll
      for (int j = 0; j < kW; ++j)
        max_part[j % 4] = fmaxf(max_part[j % 4], x[j]);
    }
    // The target's logit, before the exponentials replace it.
    if (holds_target) {
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        if (base + j == target_in_row) target_logit = x[j];
      }
    }
  }
  ExpTileStats out;
  out.stats = IdentityStats();
  out.stats.max =
      fmaxf(fmaxf(max_part[0], max_part[1]), fmaxf(max_part[2], max_part[3]));
  out.stats.target_logit = target_logit;
  out.ref = out.stats.max;
  float weighted_sum = 0.0f;
  out.stats.rest =
      TileExpSum<R, true, false, kOpt>(tile, view, ExpReference(out.stats.max),
                                       &kept, smoothing, &weighted_sum) -
      1.0f;
  out.stats.weighted_sum = weighted_sum;
  return out;
}

// The exact "rest" of a thread whose tile holds e = exp(x - ref): the max's
// term is the e that is exactly 1 (exp2 of an exact 0), and it and its ties
// are counted apart from the others.
template <typename TileT, int R>
__device__ __forceinline__ float ExactRestFromExp(const TileT& tile,
                                                  float thread_max) {
  constexpr int kW = TileT::kW;
  float others = 0.0f, ties = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float e[kW];
    tile.Floats(r, e);
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      const bool tie = e[j] == 1.0f;
      ties += tie ? 1.0f : 0.0f;
      others += tie ? 0.0f : e[j];
    }
  }
  // A thread of only -inf has no max term (others is 0, or NaN from a NaN).
  return thread_max == NegInf() ? others - 1.0f : others + (ties - 1.0f);
}

// The gradient of a tile whose logits were replaced by e = exp(x - ref).
template <typename G, typename TileT, int R, bool kOpt>
__device__ __forceinline__ void TileGradFromExp(
    const TileT& tile, const RowView& view, float ref, G* grad_row,
    const GradCoefficients& gc, const RowCoefficients& c, float target_logit) {
  constexpr int kW = TileT::kW;
  const float* weights = kOpt ? view.weights : nullptr;
  const float smooth_w = kOpt ? gc.smooth_w : 0.0f;
  // p = e * exp((ref - max) - log_sum), as the exact pass has it for every
  // row: a thread with only -inf logits has e = 0 and p = 0, unless the row's
  // sum is NaN or all of it is -inf (p NaN); in a row with +inf logits, scale
  // is 0, so p is NaN where e is +inf (the +inf logits) and 0 elsewhere.
  float scale;
  if (ref == NegInf()) {
    scale =
        gc.shift == NegInf() || gc.log_sum != gc.log_sum ? QuietNaN() : 0.0f;
  } else {
    scale = gc.coef *
            FastExp2(((ExpReference(ref) - gc.shift) - gc.log_sum) * kLog2e);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    if (base >= view.vocab) continue;
    float g[kW];
    tile.Floats(r, g);
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      g[j] *= scale;
      if (kOpt)
        g[j] -= smooth_w * SmoothingWeight(weights, base + j, view.vocab);
    }
    StorePieceGrad<G, kW>(grad_row, base, view.vocab, c, g);
  }
  // The target's element again, from its logit: p - 1 through expm1, exact
  // when p is near 1. The thread that stored its piece above writes it, so
  // the two stores are ordered.
  if (c.valid_target) {
    const int piece = static_cast<int>(c.target) / kW - view.first;
    if (piece >= 0 && piece % view.stride == 0 && piece / view.stride < R) {
      grad_row[c.target] = FromFloat<G>(
          gc.coef * expm1f((target_logit - gc.shift) - gc.log_sum) +
          (gc.coef - gc.target_coef) -
          smooth_w *
              SmoothingWeight(weights, static_cast<int>(c.target), view.vocab));
    }
  }
}

// What a row kernel does once a row's statistics are reduced: reads the scan's
// results at the first row (so that the first row's statistics overlap the
// scan), scales the row's coefficients for the mean, writes the loss and lse
// (`writer`: one thread a row) and returns the gradient's coefficients.
struct ScanState {
  ScanResults results{};
  bool loaded = false;
};

__device__ __forceinline__ GradCoefficients
FinishRow(const RowArgs& args, int64_t row, RowCoefficients& c,
          const RowStats& total, bool writer, ScanState& scan) {
  if (!scan.loaded) {
    scan.results = LoadScanResults(args);
    scan.loaded = true;
  }
  const ScanResults& r = scan.results;
  c.ce_scale *= r.mean.ce_inv;
  c.z_scale *= r.mean.z_inv;
  const float log_sum = log1pf(total.rest);
  const float lse = total.max + log_sum;
  if (writer) WriteRowLoss(args, row, c, total, lse, r.weight_total, r.mean);
  return MakeGradCoefficients(args, c, lse, r.weight_total, total.max, log_sum);
}

struct RowShared {
  RowStats warp_stats[kMaxThreads / 32];
  RowStats cluster_slot[2];  // this CTA's partial, double-buffered by the
                             // parity of the reduction
  RowStats row_final;
};

// Block (and cluster) reduction of per-thread stats; every thread gets the
// row's stats.
template <bool kWeighted>
__device__ __forceinline__ RowStats ReduceRow(RowStats stats, RowShared& shared,
                                              int cluster_size, int& parity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5,
            warps = blockDim.x >> 5;
  stats = WarpReduce<kWeighted>(stats);
  if (lane == 0) shared.warp_stats[warp] = stats;
  __syncthreads();
  if (warp == 0) {
    RowStats block = lane < warps ? shared.warp_stats[lane] : IdentityStats();
    block = WarpReduce<kWeighted>(block);
    if (cluster_size == 1) {
      if (lane == 0) shared.row_final = block;
    } else {
      if (lane == 0) shared.cluster_slot[parity] = block;
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster_size > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every CTA's partial of this row is in its slot
    if (warp == 0) {
      RowStats part = IdentityStats();
      if (lane < cluster_size)
        part = *cluster.map_shared_rank(&shared.cluster_slot[parity], lane);
      part = WarpReduce<kWeighted>(part);
      if (lane == 0) shared.row_final = part;
    }
  }
#endif
  __syncthreads();
  parity ^= 1;
  return shared.row_final;
}

// One row in one exponential a logit (TileStatsKeepExp): statistics into
// `kept`, the exact redo where the max dominates, the loss, and the gradient
// from the kept exponentials.
template <typename G, typename TileT, typename KeptT, int R, bool kOpt>
__device__ __forceinline__ void RowFromKeptExp(
    const RowArgs& args, int64_t row, const TileT& tile, KeptT& kept,
    const RowView& view, RowCoefficients& c, bool smoothing, RowShared& shared,
    int cluster_size, int& parity, bool writer, ScanState& scan) {
  ExpTileStats part =
      TileStatsKeepExp<TileT, R, kOpt>(tile, view, c.target, smoothing, kept);
  RowStats total = ReduceRow<kOpt>(part.stats, shared, cluster_size, parity);
  if (RowNeedsExactPass(total)) {
    part.stats.rest = ExactRestFromExp<KeptT, R>(kept, part.ref);
    total = ReduceRow<kOpt>(part.stats, shared, cluster_size, parity);
  }
  const GradCoefficients gc = FinishRow(args, row, c, total, writer, scan);
  G* grad_row = static_cast<G*>(args.grad) + row * args.grad_stride;
  TileGradFromExp<G, KeptT, R, kOpt>(kept, view, part.ref, grad_row, gc, c,
                                     total.target_logit);
}

// One row in the exact pass: the statistics of `tile`, the loss and (kGrad)
// the gradient, with a second exponential a logit.
template <typename G, typename TileT, int R, bool kGrad, bool kOpt>
__device__ __forceinline__ void RowFromExactPass(
    const RowArgs& args, int64_t row, const TileT& tile, const RowView& view,
    RowCoefficients& c, bool smoothing, RowShared& shared, int cluster_size,
    int& parity, bool writer, ScanState& scan) {
  const RowStats total = ReduceRow<kOpt>(
      TileStats<TileT, R, kOpt>(tile, view, c.target, smoothing), shared,
      cluster_size, parity);
  const GradCoefficients gc = FinishRow(args, row, c, total, writer, scan);
  if constexpr (kGrad) {
    G* grad_row = static_cast<G*>(args.grad) + row * args.grad_stride;
    TileGrad<G, TileT, R, kOpt>(tile, view, grad_row, gc, c);
  }
}

// One row of a register kernel whose tile holds the whole row (tiles == 1):
// statistics, loss and gradient from the registers. Vectorized rows without
// a soft cap take one exponential a logit (RowFromKeptExp).
template <typename G, typename TileT, int R, bool kGrad, bool kOpt,
          bool kSoftcap>
__device__ __forceinline__ void RowFromRegisters(
    const RowArgs& args, int64_t row, TileT& tile, const RowView& view,
    RowCoefficients& c, bool smoothing, RowShared& shared, int cluster_size,
    int& parity, bool writer, ScanState& scan) {
  using FloatTileT = FloatTile<R, TileT::kW>;
  constexpr bool k16BitVec =
      TileT::kW > 1 && sizeof(typename TileT::Element) == 2;
  // Vectorized rows without a soft cap take one exponential a logit: fp32
  // tiles keep e in place, 16-bit ones in a float tile beside their raw
  // pieces. (The soft cap's kernels are apart: both passes in one kernel
  // spill it by kilobytes.)
  if constexpr (kGrad && TileT::kW > 1 && !kSoftcap) {
    if constexpr (!k16BitVec) {
      RowFromKeptExp<G, TileT, TileT, R, kOpt>(args, row, tile, tile, view, c,
                                               smoothing, shared, cluster_size,
                                               parity, writer, scan);
    } else {
      FloatTileT kept;
      RowFromKeptExp<G, TileT, FloatTileT, R, kOpt>(
          args, row, tile, kept, view, c, smoothing, shared, cluster_size,
          parity, writer, scan);
    }
    return;
  }
  // Soft-capped (and scalar) rows keep the exact sum and a second exponential
  // in the gradient; 16-bit ones unpack once, into floats.
  if constexpr (kGrad && kOpt && k16BitVec) {
    FloatTileT floats;
    floats.Fill(tile, view);
    RowFromExactPass<G, FloatTileT, R, kGrad, kOpt>(
        args, row, floats, view, c, smoothing, shared, cluster_size, parity,
        writer, scan);
  } else {
    RowFromExactPass<G, TileT, R, kGrad, kOpt>(args, row, tile, view, c,
                                               smoothing, shared, cluster_size,
                                               parity, writer, scan);
  }
}

// Rows longer than the cluster's registers hold: tiles of each are read for the
// statistics, then again for the gradient (the last one still in registers).
// (RowKernel's kRowsTiled mode.)
template <typename T, typename G, typename TileT, int R, bool kGrad, bool kOpt>
__device__ __forceinline__ void MultiTileRows(const RowArgs& args, RowView view,
                                              RowShared& shared,
                                              int cluster_size, int tiles,
                                              int rank, ScanState& scan) {
  const int64_t cluster_id = blockIdx.x / cluster_size;
  const int64_t clusters = gridDim.x / cluster_size;
  const int first0 = rank * blockDim.x + threadIdx.x;
  const int tile_pieces = view.stride * R;
  const bool smoothing = args.label_smoothing > 0.0f;
  const bool writer = rank == 0 && threadIdx.x == 0;
  int parity = 0;
  for (int64_t row = cluster_id; row < args.rows; row += clusters) {
    const T* logits_row =
        static_cast<const T*>(args.logits) + row * args.logits_stride;
    RowCoefficients c = MakeCoefficients(args, row, kGrad, MeanScales{});
    TileT tile;
    RowStats stats = IdentityStats();
    for (int t = 0; t < tiles; ++t) {
      view.first = t * tile_pieces + first0;
      tile.Load(logits_row, view.vocab, view.first, view.stride);
      stats = Combine(
          stats, TileStats<TileT, R, kOpt>(tile, view, c.target, smoothing));
    }
    const RowStats total = ReduceRow<kOpt>(stats, shared, cluster_size, parity);
    const GradCoefficients gc = FinishRow(args, row, c, total, writer, scan);
    if constexpr (kGrad) {
      G* grad_row = static_cast<G*>(args.grad) + row * args.grad_stride;
      // Tiles are revisited last-first so that the tile still in registers
      // goes first.
      for (int t = tiles - 1; t >= 0; --t) {
        view.first = t * tile_pieces + first0;
        if (t != tiles - 1)
          tile.Load(logits_row, view.vocab, view.first, view.stride);
        TileGrad<G, TileT, R, kOpt>(tile, view, grad_row, gc, c);
      }
    }
  }
}

// Register kernel (fused forward+backward): one row per cluster at a time, held
// in the registers of the cluster's threads (kPieces 16-byte pieces each)
// between the reduction and the gradient, so it is read once. `tiles` > 1 only
// for rows longer than the cluster holds (those are read twice).
// kMode: kRowsOneTile (the row fits, tiles == 1), kRowsTiled (it does not),
// or kRowsPrefetch (tiles == 1: each thread holds two rows' pieces and loads
// the cluster's next row before it reduces the current one, so the loads of
// a CTA never wait for its reductions, barriers and stores). One kernel each,
// so that no mode's registers weigh on another's.
enum RowMode { kRowsOneTile = 0, kRowsTiled = 1, kRowsPrefetch = 2 };

// kSoftcap (vectorized kOpt kernels only): the soft cap is on, so the row
// keeps its logits and takes the exact pass (RowFromRegisters).
template <typename T, typename G, int R, bool kVec, bool kGrad, bool kOpt,
          int kMode, bool kSoftcap = false>
__global__ void __launch_bounds__(kMaxThreads, 2)
    RowKernel(RowArgs args, int cluster_size, int tiles, bool prefetch_l2) {
  using TileT = Tile<T, R, kVec>;
  __shared__ RowShared shared;
  const int rank =
      cluster_size > 1 ? static_cast<int>(blockIdx.x % cluster_size) : 0;
  const int64_t cluster_id = blockIdx.x / cluster_size;
  const int64_t clusters = gridDim.x / cluster_size;
  const int stride =
      cluster_size * blockDim.x;  // pieces between a thread's registers
  const bool smoothing = args.label_smoothing > 0.0f;
  // The scan's results are read after the first row's statistics, which so
  // overlap the scan; a dependent (the final sum) may launch now.
  LetDependentGridsLaunch();
  RowView view{static_cast<int>(args.vocab),
               0,
               stride,
               args.softcap,
               args.softcap > 0.0f ? 1.0f / args.softcap : 0.0f,
               args.class_weights};
  const int first0 = rank * blockDim.x + threadIdx.x;
  int parity = 0;
  ScanState scan;
  auto logits_of = [&](int64_t row) {
    return static_cast<const T*>(args.logits) + row * args.logits_stride;
  };

  // With prefetch_l2, threads r < R ask L2 for this CTA's piece r of a row
  // ahead of the one in registers (its blockDim.x pieces are contiguous).
  const int64_t row_bytes = args.vocab * int64_t{sizeof(T)};
  auto prefetch_row = [&](int64_t row) {
    if (kVec && prefetch_l2 && threadIdx.x < R && row < args.rows) {
      const int64_t first =
          rank * blockDim.x + threadIdx.x * static_cast<int64_t>(stride);
      PrefetchL2(reinterpret_cast<const uint4*>(logits_of(row)) + first,
                 WholePieceBytes(first, blockDim.x, row_bytes));
    }
  };
  if constexpr (kMode == kRowsPrefetch) {
    TileT current;
    if (cluster_id < args.rows)
      current.Load(logits_of(cluster_id), view.vocab, first0, stride);
    for (int64_t row = cluster_id; row < args.rows; row += clusters) {
      // The cluster's next row is on its way before this one is reduced, and
      // L2 fetches the one after.
      TileT next;
      if (row + clusters < args.rows)
        next.Load(logits_of(row + clusters), view.vocab, first0, stride);
      prefetch_row(row + 2 * clusters);
      RowCoefficients c = MakeCoefficients(args, row, kGrad, MeanScales{});
      view.first = first0;
      RowFromRegisters<G, TileT, R, kGrad, kOpt, kSoftcap>(
          args, row, current, view, c, smoothing, shared, cluster_size, parity,
          rank == 0 && threadIdx.x == 0, scan);
      current = next;
    }
  } else if constexpr (kMode == kRowsTiled) {
    MultiTileRows<T, G, TileT, R, kGrad, kOpt>(args, view, shared, cluster_size,
                                               tiles, rank, scan);
  } else {
    for (int64_t row = cluster_id; row < args.rows; row += clusters) {
      const T* logits_row = logits_of(row);
      RowCoefficients c = MakeCoefficients(args, row, kGrad, MeanScales{});
      TileT tile;
      view.first = first0;
      tile.Load(logits_row, view.vocab, view.first, stride);
      prefetch_row(row + clusters);
      RowFromRegisters<G, TileT, R, kGrad, kOpt, kSoftcap>(
          args, row, tile, view, c, smoothing, shared, cluster_size, parity,
          rank == 0 && threadIdx.x == 0, scan);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // No CTA may leave while another can still read its shared memory.
  if (cluster_size > 1) cg::this_cluster().sync();
#endif
}

// Gradient from a saved lse, streaming (one read, one write); used past 128 KiB
// rows.
template <typename T, typename G, bool kVec, bool kOpt>
__global__ void __launch_bounds__(256) BackwardKernel(RowArgs args) {
  constexpr int R = 8;
  using TileT = Tile<T, R, kVec>;
  constexpr int kW = TileT::kW;
  const int vocab = static_cast<int>(args.vocab);
  const int vecs = (vocab + kW - 1) / kW;
  WaitForPrerequisiteGrids();  // the target scan's results, below
  const float weight_total = WeightTotal(args);
  const MeanScales mean = LoadMeanScales(args);
  RowView view{vocab,
               0,
               static_cast<int>(blockDim.x),
               args.softcap,
               args.softcap > 0.0f ? 1.0f / args.softcap : 0.0f,
               args.class_weights};
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    const RowCoefficients c = MakeCoefficients(args, row, true, mean);
    const GradCoefficients gc =
        SavedGradCoefficients(args, row, c, weight_total);
    const T* logits_row =
        static_cast<const T*>(args.logits) + row * args.logits_stride;
    G* grad_row = static_cast<G*>(args.grad) + row * args.grad_stride;
    for (int first = threadIdx.x; first < vecs; first += R * blockDim.x) {
      TileT tile;
      view.first = first;
      tile.Load(logits_row, vocab, first, blockDim.x);
      TileGrad<G, TileT, R, kOpt>(tile, view, grad_row, gc, c);
    }
  }
}

// The exact statistics of a row that a warp streams again: for rows whose
// max dominates, after the fast sum (RowNeedsExactPass). Such rows were just
// read, so this read mostly hits L2.
// A warp of a group (WarpGroup) streams its own tiles: pieces from `first0`,
// `step` apart.
template <typename TileT, int R, bool kOpt, typename T>
__device__ __forceinline__ RowStats ExactWarpRowStats(const T* logits_row,
                                                      RowView view,
                                                      int64_t target,
                                                      bool smoothing,
                                                      int first0, int step) {
  constexpr int kW = TileT::kW;
  const int vecs = (view.vocab + kW - 1) / kW;
  view.stride = 32;
  RowStats stats = IdentityStats();
  for (int first = first0; first < vecs; first += step) {
    TileT tile;
    view.first = first;
    tile.Load(logits_row, view.vocab, first, 32);
    stats = Combine(stats,
                    TileStats<TileT, R, kOpt>(tile, view, target, smoothing));
  }
  return WarpReduce<kOpt>(stats);
}

// The warps of a block that share a row (1, 2, 4 or all 8 of its 256
// threads' warps): each streams every size-th tile of the row, and their
// totals are combined through shared memory. Sharing rows makes the unit of
// work smaller, so that a persistent grid ends evenly when there are only a
// few rows a warp (16384 rows of 4096 classes on 3168 warps: 5.2 a warp, so a
// sixth of the warps take a sixth row while the rest idle).
struct WarpGroup {
  int size;     // warps a row
  int rank;     // this warp's place in the group
  int barrier;  // the group's named barrier (1 + its index in the block)
};

__device__ __forceinline__ WarpGroup MakeWarpGroup(int size) {
  const int warp_in_block = threadIdx.x >> 5;
  return WarpGroup{size, warp_in_block % size, 1 + warp_in_block / size};
}

// Shared slots of the group reduction: one RowStats a warp, double-buffered.
struct GroupSlots {
  RowStats stats[2][8];
};

// The row's statistics from its group's warp totals (each the same in every
// lane of its warp), combined in the warps' order so that every warp gets the
// same bits. A warp writes a row's slot only after the barrier of the row
// before, which every warp passes after it has read the slots of the row
// before that: two buffers suffice.
__device__ __forceinline__ RowStats GroupCombine(const RowStats& warp_total,
                                                 const WarpGroup& group,
                                                 GroupSlots& slots,
                                                 int& parity) {
  if (group.size == 1) return warp_total;
  const int first_warp = (threadIdx.x >> 5) - group.rank;
  RowStats* buffer = slots.stats[parity];
  if ((threadIdx.x & 31) == 0) buffer[first_warp + group.rank] = warp_total;
  asm volatile("bar.sync %0, %1;" ::"r"(group.barrier), "r"(group.size * 32)
               : "memory");
  RowStats total = buffer[first_warp];
  for (int w = 1; w < group.size; ++w)
    total = Combine(total, buffer[first_warp + w]);
  parity ^= 1;
  return total;
}

// 16-byte pieces of a row a thread holds in the warp-per-row and register
// kernels: 8 of fp32 (or 8 scalars), 4 of 16-bit logits, whose unpacked
// floats would otherwise spill under the 64-register bound: 32 values.
template <typename T, bool kVec>
__host__ __device__ constexpr int PiecesPerThread() {
  return kVec && sizeof(T) == 2 ? 4 : 8;
}

// Warp-per-row kernel (forward): each warp streams whole rows, 8 pieces per
// lane in flight, with per-lane online statistics; the row reduction is a warp
// shuffle with no block barrier, so a persistent grid of many warps per SM
// keeps HBM busy. With kGrad the row is streamed a second time for the gradient
// (kept for comparison in the benchmark's sweep).
// Blocks per SM: three for fp32 (four spill it: 93 against 76 us at vocab
// 4096 on the H200), four for 16-bit logits, whose raw tiles take half the
// registers (1092 against 1156 us at 131072, 87 against 93 us at 8192).
template <typename T>
constexpr int WarpRowBlocksPerSm() {
  return sizeof(T) == 2 ? 4 : 3;
}

template <typename T, typename G, bool kVec, bool kGrad, bool kOpt,
          bool kFastSum>
__global__ void __launch_bounds__(256, WarpRowBlocksPerSm<T>())
    WarpRowKernel(RowArgs args, int warps_per_row) {
  constexpr int R = PiecesPerThread<T, kVec>();
  using TileT = Tile<T, R, kVec>;
  constexpr int kW = TileT::kW;
  __shared__ GroupSlots slots;
  const WarpGroup group = MakeWarpGroup(warps_per_row);
  int parity = 0;
  const int vocab = static_cast<int>(args.vocab);
  const int vecs = (vocab + kW - 1) / kW;
  const int lane = threadIdx.x & 31;
  // Groups (rows in flight) of the grid, and this warp's; 256-thread blocks.
  const int64_t first_row =
      (static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5)) / group.size;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * 8 / group.size;
  const bool writer = lane == 0 && group.rank == 0;
  const bool smoothing = args.label_smoothing > 0.0f;
  // The scan's results are read after the first row's statistics, which so
  // overlap the scan; a dependent (the final sum) may launch now.
  LetDependentGridsLaunch();
  ScanState scan;
  RowView view{vocab,
               0,
               32,
               args.softcap,
               args.softcap > 0.0f ? 1.0f / args.softcap : 0.0f,
               args.class_weights};
  auto logits_of = [&](int64_t row) {
    return static_cast<const T*>(args.logits) + row * args.logits_stride;
  };
  if constexpr (!kGrad && kVec && sizeof(T) == 4) {
    // The fp32 forward walks a warp's tiles of its rows as one sequence of
    // tiles of half the pieces, and loads the next tile (of this row or of the
    // next one) before it reduces the current one: HBM keeps streaming through
    // each row's reductions and loss, which matter most for short rows. The
    // launch gives every warp of a group at least one tile a row.
    constexpr int kHalf = R / 2;
    using HalfTile = Tile<T, kHalf, true>;
    constexpr int kTileVecs = 32 * kHalf;
    const int tiles_per_row = (vecs + kTileVecs - 1) / kTileVecs;
    int64_t row = first_row;
    int t = group.rank;  // the current tile of the row, the same in every lane
    HalfTile current;
    RowCoefficients c{};
    if (row < args.rows) {
      current.Load(logits_of(row), vocab, lane + t * kTileVecs, 32);
      c = MakeCoefficients(args, row, false, MeanScales{});
    }
    RowStats stats = IdentityStats();
    while (row < args.rows) {
      int64_t next_row = row;
      int next_t = t + group.size;
      if (next_t >= tiles_per_row) {
        next_row = row + groups;
        next_t = group.rank;
      }
      HalfTile next;
      if (next_row < args.rows)
        next.Load(logits_of(next_row), vocab, lane + next_t * kTileVecs, 32);
      view.first = lane + t * kTileVecs;
      stats = Combine(stats, TileStats<HalfTile, kHalf, kOpt, kFastSum>(
                                 current, view, c.target, smoothing));
      if (next_row != row) {
        RowStats total =
            GroupCombine(WarpReduce<kOpt>(stats), group, slots, parity);
        if (kFastSum && RowNeedsExactPass(total)) {
          total = GroupCombine(
              ExactWarpRowStats<HalfTile, kHalf, kOpt>(
                  logits_of(row), view, c.target, smoothing,
                  lane + group.rank * kTileVecs, group.size * kTileVecs),
              group, slots, parity);
        }
        FinishRow(args, row, c, total, writer, scan);
        stats = IdentityStats();
        if (next_row < args.rows)
          c = MakeCoefficients(args, next_row, false, MeanScales{});
      }
      current = next;
      row = next_row;
      t = next_t;
    }
  } else {
    const int first0 = lane + group.rank * 32 * R;
    const int step = group.size * 32 * R;
    for (int64_t row = first_row; row < args.rows; row += groups) {
      const T* logits_row = logits_of(row);
      RowCoefficients c = MakeCoefficients(args, row, kGrad, MeanScales{});
      RowStats stats = IdentityStats();
      for (int first = first0; first < vecs; first += step) {
        TileT tile;
        view.first = first;
        tile.Load(logits_row, vocab, first, 32);
        stats = Combine(stats, TileStats<TileT, R, kOpt, kFastSum>(
                                   tile, view, c.target, smoothing));
      }
      RowStats total =
          GroupCombine(WarpReduce<kOpt>(stats), group, slots, parity);
      if (kFastSum && RowNeedsExactPass(total)) {
        total = GroupCombine(
            ExactWarpRowStats<TileT, R, kOpt>(logits_row, view, c.target,
                                              smoothing, first0, step),
            group, slots, parity);
      }
      const GradCoefficients gc = FinishRow(args, row, c, total, writer, scan);
      if constexpr (kGrad) {
        G* grad_row = static_cast<G*>(args.grad) + row * args.grad_stride;
        for (int first = first0; first < vecs; first += step) {
          TileT tile;
          view.first = first;
          tile.Load(logits_row, vocab, first, 32);
          TileGrad<G, TileT, R, kOpt>(tile, view, grad_row, gc, c);
        }
      }
    }
  }
}

// RowArgs::tune_kernel values: automatic, the register/cluster kernel (and the
// streaming backward), the pipelined backward, the warp-per-row kernel.
enum KernelChoice {
  kKernelAuto = 0,
  kKernelCluster = 1,
  kKernelPipelined = 2,
  kKernelWarp = 3
};

// Pipelined backward for 16-byte aligned rows: each thread copies its 16-byte
// pieces of the next rows into shared memory with cp.async (`stages` - 1 rows
// ahead), so HBM stays busy while the current row's gradient is computed and
// written. A thread only ever reads the pieces it copied itself, so a stage can
// be refilled without a block barrier.

__device__ __forceinline__ void CpAsync16(void* shared_dst,
                                          const void* global_src,
                                          int src_bytes) {
  const unsigned dst =
      static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  // Bytes past src_bytes are filled with zeros (the row's partial last vector).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(global_src), "r"(src_bytes));
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most `pending` of this thread's copy groups are in flight.
__device__ __forceinline__ void CpAsyncWait(int pending) {
  switch (pending) {
    case 0:
      asm volatile("cp.async.wait_group 0;\n" ::);
      break;
    case 1:
      asm volatile("cp.async.wait_group 1;\n" ::);
      break;
    case 2:
      asm volatile("cp.async.wait_group 2;\n" ::);
      break;
    default:
      asm volatile("cp.async.wait_group 3;\n" ::);
      break;
  }
}

// Eight 16-byte pieces per thread in a shared-memory stage, read like a Tile.
template <typename T>
struct StagedTile {
  static constexpr int kW = 16 / sizeof(T);
  static constexpr bool kPackedMax = false;
  const uint4*
      pieces;  // this thread's first piece; piece r is r * blockDim.x further
  __device__ __forceinline__ void Unpack(int r, int base, int vocab,
                                         float softcap, float inv_cap,
                                         float (&x)[kW]) const {
    UnpackVec<T, kW>(pieces[r * blockDim.x], base, vocab, softcap, inv_cap, x);
  }
};

constexpr int kStagedPieces = 8;

template <typename T, typename G, bool kOpt>
__global__ void __launch_bounds__(kMaxThreads)
    PipelinedBackwardKernel(RowArgs args, int group_size, int stages) {
  constexpr int kW = 16 / sizeof(T);
  extern __shared__ uint4
      stage_memory[];  // [stages][kStagedPieces][blockDim.x] 16-byte pieces
  const int vocab = static_cast<int>(args.vocab);
  const int vecs = (vocab + kW - 1) / kW;
  // A row is split over `group_size` blocks; unlike the fused pass they need
  // not talk.
  const int rank = static_cast<int>(blockIdx.x % group_size);
  const int64_t group = blockIdx.x / group_size;
  const int64_t groups = gridDim.x / group_size;
  const int stride = group_size * blockDim.x;
  const int first = rank * blockDim.x + threadIdx.x;
  const int stage_size = kStagedPieces * blockDim.x;
  WaitForPrerequisiteGrids();  // the target scan's results, below
  const float weight_total = WeightTotal(args);
  const MeanScales mean = LoadMeanScales(args);
  const RowView view{vocab,
                     first,
                     stride,
                     args.softcap,
                     args.softcap > 0.0f ? 1.0f / args.softcap : 0.0f,
                     args.class_weights};
  const int64_t rows = args.rows;

  auto issue = [&](int64_t row, int stage) {
    if (row < rows) {
      const T* src =
          static_cast<const T*>(args.logits) + row * args.logits_stride;
      uint4* dst = stage_memory + stage * stage_size + threadIdx.x;
#pragma unroll
      for (int r = 0; r < kStagedPieces; ++r) {
        const int vec = first + r * stride;
        if (vec < vecs) {
          const int bytes =
              min(kW, vocab - vec * kW) * static_cast<int>(sizeof(T));
          CpAsync16(dst + r * blockDim.x, src + static_cast<int64_t>(vec) * kW,
                    bytes);
        }
      }
    }
    CpAsyncCommit();  // an empty group past the last row keeps the group count
                      // uniform
  };

  for (int s = 0; s < stages - 1; ++s) issue(group + s * groups, s);
  for (int64_t k = 0;; ++k) {
    const int64_t row = group + k * groups;
    if (row >= rows) break;
    issue(row + (stages - 1) * groups,
          static_cast<int>((k + stages - 1) % stages));
    CpAsyncWait(stages - 1);  // this thread's pieces of `row` have landed
    const uint4* pieces =
        stage_memory + static_cast<int>(k % stages) * stage_size + threadIdx.x;
    const RowCoefficients c = MakeCoefficients(args, row, true, mean);
    const GradCoefficients gc =
        SavedGradCoefficients(args, row, c, weight_total);
    G* grad_row = static_cast<G*>(args.grad) + row * args.grad_stride;
    // One piece at a time: shared memory holds the row, so nothing gains from
    // unrolling.
#pragma unroll 1
    for (int r = 0; r < kStagedPieces; ++r) {
      RowView piece_view = view;
      piece_view.first = first + r * stride;
      TileGrad<G, StagedTile<T>, 1, kOpt>(
          StagedTile<T>{pieces + r * blockDim.x}, piece_view, grad_row, gc, c);
    }
  }
  CpAsyncWait(0);
}

// The target scan's per-thread totals, reduced together in one block sum.
struct ScanSums {
  double weight_sum = 0.0;    // sum of w[t] over counted targets
  double weight_total = 0.0;  // sum of the class weights
  long long counted = 0, invalid = 0, negative = 0;
};

__device__ __forceinline__ ScanSums& operator+=(ScanSums& a,
                                                const ScanSums& b) {
  a.weight_sum += b.weight_sum;
  a.weight_total += b.weight_total;
  a.counted += b.counted;
  a.invalid += b.invalid;
  a.negative += b.negative;
  return a;
}

template <typename V>
__device__ __forceinline__ V ShuffleDown(const V& value, int offset) {
  return __shfl_down_sync(kFullMask, value, offset);
}

template <>
__device__ __forceinline__ ScanSums ShuffleDown(const ScanSums& value,
                                                int offset) {
  ScanSums out;
  out.weight_sum = __shfl_down_sync(kFullMask, value.weight_sum, offset);
  out.weight_total = __shfl_down_sync(kFullMask, value.weight_total, offset);
  out.counted = __shfl_down_sync(kFullMask, value.counted, offset);
  out.invalid = __shfl_down_sync(kFullMask, value.invalid, offset);
  out.negative = __shfl_down_sync(kFullMask, value.negative, offset);
  return out;
}

// Block-wide sum in a fixed tree order; the result is valid in thread 0.
template <typename V>
__device__ V BlockSum(V value, V* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    value += ShuffleDown(value, offset);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = threadIdx.x < (blockDim.x >> 5) ? scratch[threadIdx.x] : V{};
  if (warp == 0) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      value += ShuffleDown(value, offset);
  }
  __syncthreads();
  return value;
}

// The one-block scans read kScanLoads values a thread before using any, so
// that their loads are in flight together: a scan is latency-bound, and it
// sits on the critical path (the target scan before a row kernel's first
// statistics, the loss sum after its last row). On the H200 the earlier
// loop-carried scans took 10 and 8 us at 16384 rows.
constexpr int kScanThreads = 1024;
constexpr int kScanLoads = 16;

// This thread's kScanLoads values of a scan's chunk at `base`: value k is
// load(i) for i = base + k * blockDim.x + threadIdx.x, or `fill` from `count`.
template <typename V, typename Load>
__device__ __forceinline__ void LoadScanChunk(int64_t base, int64_t count,
                                              V fill, Load load,
                                              V (&out)[kScanLoads]) {
#pragma unroll
  for (int k = 0; k < kScanLoads; ++k) {
    const int64_t i = base + int64_t{k} * blockDim.x + threadIdx.x;
    out[k] = i < count ? load(i) : fill;
  }
}

__global__ void __launch_bounds__(kScanThreads)
    TargetStatsKernel(const void* targets, bool targets_i64, int64_t rows,
                      int64_t vocab, int64_t ignore_index, const float* weights,
                      TargetStats* stats) {
  LetDependentGridsLaunch();  // the row kernel may start on the logits now
  __shared__ ScanSums scratch[32];
  ScanSums sums;
  for (int64_t base = 0; base < rows;
       base += int64_t{kScanLoads} * blockDim.x) {
    int64_t t[kScanLoads];
    LoadScanChunk(
        base, rows, ignore_index,
        [&](int64_t i) -> int64_t {
          return targets_i64 ? static_cast<const int64_t*>(targets)[i]
                             : static_cast<const int32_t*>(targets)[i];
        },
        t);
    float w[kScanLoads];
#pragma unroll
    for (int k = 0; k < kScanLoads; ++k) {
      const bool valid = t[k] != ignore_index && t[k] >= 0 && t[k] < vocab;
      w[k] = weights != nullptr && valid ? weights[t[k]] : 1.0f;
    }
#pragma unroll
    for (int k = 0; k < kScanLoads; ++k) {
      if (t[k] == ignore_index) continue;
      if (t[k] < 0 || t[k] >= vocab) {
        ++sums.invalid;
        continue;
      }
      ++sums.counted;
      sums.weight_sum += static_cast<double>(w[k]);
    }
  }
  if (weights != nullptr) {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float w = weights[j];
      if (!(w >= 0.0f)) ++sums.negative;
      sums.weight_total += w;
    }
  }
  sums = BlockSum(sums, scratch);
  if (threadIdx.x == 0) {
    stats->ce_denominator = weights != nullptr
                                ? sums.weight_sum
                                : static_cast<double>(sums.counted);
    stats->z_denominator = static_cast<double>(sums.counted);
    stats->weight_total =
        weights != nullptr ? sums.weight_total : static_cast<double>(vocab);
    stats->invalid = sums.invalid;
    stats->negative_weights = sums.negative;
  }
}

__global__ void __launch_bounds__(kScanThreads)
    SumRowsKernel(const float* row_loss, int64_t rows, float* loss) {
  WaitForPrerequisiteGrids();  // the row kernel's losses
  __shared__ double scratch[32];
  double sum = 0.0;
  for (int64_t base = 0; base < rows;
       base += int64_t{kScanLoads} * blockDim.x) {
    float value[kScanLoads];
    LoadScanChunk(
        base, rows, 0.0f, [&](int64_t i) { return row_loss[i]; }, value);
#pragma unroll
    for (int k = 0; k < kScanLoads; ++k) sum += value[k];
  }
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(sum);
}

bool Aligned(const void* ptr, int bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

int DeviceMajor() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major;
}

// Launches a kernel; with `programmatic` (its predecessor on the stream is
// the kernel whose results it reads behind griddepcontrol.wait: the target
// scan, or the row kernel for the final sum) and sm_90, with programmatic
// stream serialization, so that it may start while that kernel still runs.
// `cluster` > 1 adds the cluster dimension.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(bool programmatic, void (*kernel)(Params...),
                            unsigned grid, unsigned block, size_t shared_bytes,
                            int cluster, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(block);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (programmatic && DeviceMajor() >= 9) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// Chooses the cluster size, threads and tiles for a row of `vecs` vectors, R
// per thread: the smallest cluster whose registers hold the row (so it is read
// once), up to 8 CTAs.
struct RowLaunch {
  int cluster_size;
  int threads;
  int tiles;
};

RowLaunch ChooseRowLaunch(int64_t vecs, int per_thread, bool clusters_allowed) {
  RowLaunch launch{1, kMaxThreads, 1};
  const int64_t per_cta_capacity = int64_t{kMaxThreads} * per_thread;
  while (clusters_allowed && launch.cluster_size < kMaxCluster &&
         (vecs + launch.cluster_size - 1) / launch.cluster_size >
             per_cta_capacity) {
    launch.cluster_size *= 2;
  }
  const int64_t per_cta =
      (vecs + launch.cluster_size - 1) / launch.cluster_size;
  launch.tiles =
      static_cast<int>((per_cta + per_cta_capacity - 1) / per_cta_capacity);
  if (launch.tiles == 1) {
    const int64_t threads = (per_cta + per_thread - 1) / per_thread;
    launch.threads = static_cast<int>((threads + 31) / 32 * 32);
  }
  return launch;
}

template <typename T, typename G, bool kVec, bool kGrad, bool kOpt,
          bool kSoftcap>
cudaError_t LaunchRowKernelOf(const RowArgs& args, int num_sms,
                              cudaStream_t stream) {
  constexpr int kW = kVec ? 16 / sizeof(T) : 1;
  constexpr int R = PiecesPerThread<T, kVec>();
  const int64_t vecs = (args.vocab + kW - 1) / kW;
  // The prefetching variant holds two tiles of half as many pieces: the same
  // registers for two rows. On the H200 it pays for fp32 rows that one CTA
  // holds (fused, vocab 4096: 77 against 73% of copy; 8192: 79 against 78%)
  // and loses where it doubles the cluster (32768: 65 against 78%) or for
  // 16-bit logits. The bench's "cluster" variant keeps the other kernel.
  constexpr bool kCanPrefetch = kVec && kGrad && sizeof(T) == 4;
  constexpr int kPrefetchR = R / 2;
  const RowLaunch prefetch_launch =
      ChooseRowLaunch(vecs, kPrefetchR, DeviceMajor() >= 9);
  const bool prefetch = kCanPrefetch && prefetch_launch.tiles == 1 &&
                        prefetch_launch.cluster_size == 1 &&
                        args.tune_kernel != kKernelCluster;
  const RowLaunch launch =
      prefetch ? prefetch_launch : ChooseRowLaunch(vecs, R, DeviceMajor() >= 9);
  auto kernel = prefetch ? RowKernel < T, G, kCanPrefetch ? kPrefetchR : R,
       kVec, kGrad, kOpt, kCanPrefetch ? kRowsPrefetch : kRowsOneTile,
       kSoftcap >
      : launch.tiles > 1
        ? RowKernel<T, G, R, kVec, kGrad, kOpt, kRowsTiled>
        : RowKernel<T, G, R, kVec, kGrad, kOpt, kRowsOneTile, kSoftcap>;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(launch.threads);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  int64_t max_clusters = 0;
  if (launch.cluster_size > 1) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = launch.cluster_size;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    config.gridDim = dim3(launch.cluster_size * num_sms);
    int active = 0;
    cudaError_t error =
        cudaOccupancyMaxActiveClusters(&active, kernel, &config);
    if (error != cudaSuccess) return error;
    max_clusters = active > 0 ? active : 1;
  } else {
    int per_sm = 0;
    cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, kernel, launch.threads, 0);
    if (error != cudaSuccess) return error;
    max_clusters = int64_t{per_sm > 0 ? per_sm : 1} * num_sms;
  }
  const int64_t clusters = args.rows < max_clusters ? args.rows : max_clusters;
  // L2 prefetch of a row ahead (RowArgs::tune_l2_prefetch: -1 off, 1 on), for
  // 16-bit rows and fp32 rows on one CTA or a full cluster. Same-run A/B on
  // the H200, fused us: bf16 84 -> 82, 711 -> 656, 3167 -> 2931 at vocab
  // 4096, 32768, 131072; fp32 157 -> 150 at 4096, 586 -> 578 at 16384, 5042
  // -> 4929 at 131072, but 1172 -> 1190 and 2395 -> 2440 at 32768 and 65536
  // (clusters of 2 and 4 CTAs).
  const bool prefetch_l2 =
      launch.tiles == 1 && (args.tune_l2_prefetch == 0
                                ? sizeof(T) == 2 || launch.cluster_size == 1 ||
                                      launch.cluster_size == kMaxCluster
                                : args.tune_l2_prefetch > 0);
  return LaunchDependent(args.follows_scan, kernel,
                         static_cast<unsigned>(clusters * launch.cluster_size),
                         launch.threads, 0, launch.cluster_size, stream, args,
                         launch.cluster_size, launch.tiles, prefetch_l2);
}

template <typename T, typename G, bool kVec, bool kGrad, bool kOpt>
cudaError_t LaunchRowKernel(const RowArgs& args, int num_sms,
                            cudaStream_t stream) {
  if constexpr (kVec && kGrad && kOpt) {
    if (args.softcap > 0.0f)
      return LaunchRowKernelOf<T, G, kVec, kGrad, kOpt, true>(args, num_sms,
                                                              stream);
  }
  return LaunchRowKernelOf<T, G, kVec, kGrad, kOpt, false>(args, num_sms,
                                                           stream);
}

// Launch of the pipelined backward: blocks of up to 512 threads with 8 pieces
// each (32 KiB per stage and block), as many blocks per row as that takes, and
// `stages` rows in flight.
struct PipelineLaunch {
  int group_size;
  int threads;
  int stages;
  int shared_bytes;
};

PipelineLaunch ChoosePipelineLaunch(int64_t vecs, const RowArgs& args) {
  PipelineLaunch launch;
  const int64_t max_per_block = int64_t{kMaxThreads / 2} * kStagedPieces;
  launch.group_size =
      static_cast<int>((vecs + max_per_block - 1) / max_per_block);
  const int64_t per_block = (vecs + launch.group_size - 1) / launch.group_size;
  int64_t threads =
      ((per_block + kStagedPieces - 1) / kStagedPieces + 31) / 32 * 32;
  launch.threads = static_cast<int>(threads < 32 ? 32 : threads);
  launch.stages = args.tune_stages > 0 ? args.tune_stages : 2;
  launch.shared_bytes = launch.stages * launch.threads * kStagedPieces * 16;
  return launch;
}

template <typename T, typename G, bool kOpt>
cudaError_t LaunchPipelinedBackward(const RowArgs& args, int num_sms,
                                    cudaStream_t stream) {
  constexpr int kW = 16 / sizeof(T);
  const PipelineLaunch launch =
      ChoosePipelineLaunch((args.vocab + kW - 1) / kW, args);
  auto kernel = PipelinedBackwardKernel<T, G, kOpt>;
  cudaError_t error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, launch.shared_bytes);
  if (error != cudaSuccess) return error;
  int per_sm = 0;
  error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, kernel, launch.threads, launch.shared_bytes);
  if (error != cudaSuccess) return error;
  int64_t groups =
      int64_t{per_sm > 0 ? per_sm : 1} * num_sms / launch.group_size;
  if (groups < 1) groups = 1;
  if (groups > args.rows) groups = args.rows;
  return LaunchDependent(args.follows_scan, kernel,
                         static_cast<unsigned>(groups * launch.group_size),
                         launch.threads, launch.shared_bytes, 1, stream, args,
                         launch.group_size, launch.stages);
}

bool RowsVectorizable(const RowArgs& args, int element_bytes, int grad_bytes,
                      bool with_grad) {
  const int w = 16 / element_bytes;
  bool ok = Aligned(args.logits, 16) && args.logits_stride % w == 0;
  if (with_grad)
    ok = ok && Aligned(args.grad, w * grad_bytes) && args.grad_stride % w == 0;
  return ok;
}

// The forward takes the fast exponential sum (one exponential and add a
// logit, no tie test; rows whose max dominates are streamed again for the
// exact pass), with or without options: 16-bit logits always (issue-bound on
// two logits a 32-bit word: 75 -> 87% of copy at vocab 131072 on the H200),
// fp32 from vocab 32768 (0.8% faster there, but 4-5% slower at 4096 and 8192).
constexpr int64_t kFastSumF32Vocab = 32768;

// Warps that share a row of the warp-per-row kernel (WarpGroup) when the
// caller does not choose (RowArgs::tune_warps_per_row), by the row's tiles
// (of 512 floats in the fp32 forward's walk, 1024 16-bit logits otherwise).
// Measured on the H200 (16384 rows, kernel alone, us): fp32, two warps a row
// at 8192 classes (130 -> 127), four from 16384 (256 -> 246; 32768: 506 ->
// 478; 131072: 1925 -> 1881); bf16, two from 65536 (531 -> 519; 131072: 1028
// -> 1017). Shorter rows (the barrier waits outweigh the even end) and the
// options' kernels keep one.
int AutoWarpsPerRow(bool fp32_walk, bool sixteen_bit, bool options,
                    int64_t tiles_per_row) {
  if (options) return 1;
  if (fp32_walk) return tiles_per_row >= 32 ? 4 : tiles_per_row >= 16 ? 2 : 1;
  return sixteen_bit && tiles_per_row >= 64 ? 2 : 1;
}

template <typename T, typename G, bool kVec, bool kGrad, bool kOpt>
cudaError_t LaunchWarpRowKernel(const RowArgs& args, int num_sms,
                                cudaStream_t stream) {
  constexpr bool kCanFastSum = !kGrad;
  const bool fast_sum =
      kCanFastSum && (args.tune_fast_sum == 0
                          ? sizeof(T) == 2 || args.vocab >= kFastSumF32Vocab
                          : args.tune_fast_sum == 2);
  auto kernel = fast_sum ? WarpRowKernel<T, G, kVec, kGrad, kOpt, kCanFastSum>
                         : WarpRowKernel<T, G, kVec, kGrad, kOpt, false>;
  int per_sm = 0;
  cudaError_t error =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0);
  if (error != cudaSuccess) return error;
  if (args.tune_blocks_per_sm > 0 && args.tune_blocks_per_sm < per_sm)
    per_sm = args.tune_blocks_per_sm;
  // Warps a row (WarpGroup), at most one a tile of the row.
  constexpr int kR = PiecesPerThread<T, kVec>();
  constexpr bool kWalk = !kGrad && kVec && sizeof(T) == 4;  // half tiles
  constexpr int kTileVecs = 32 * (kWalk ? kR / 2 : kR);
  constexpr int kW = kVec ? 16 / sizeof(T) : 1;
  const int64_t vecs = (args.vocab + kW - 1) / kW;
  const int64_t tiles_per_row = (vecs + kTileVecs - 1) / kTileVecs;
  int warps_per_row =
      args.tune_warps_per_row > 0
          ? args.tune_warps_per_row
          : AutoWarpsPerRow(kWalk, kVec && sizeof(T) == 2 && !kGrad, kOpt,
                            tiles_per_row);
  if (warps_per_row != 1 && warps_per_row != 2 && warps_per_row != 4 &&
      warps_per_row != 8) {
    return cudaErrorInvalidValue;
  }
  while (warps_per_row > 1 && warps_per_row > tiles_per_row) warps_per_row /= 2;
  // A full grid leaves rows % warps warps one row more than the rest (16384
  // rows on 3168 warps: 544 warps take a sixth row, on a device otherwise
  // idle). From 128 KiB rows, where that last row is long, the grid is the
  // fewest warps that take the same most rows a warp, so that the rows
  // spread evenly (H200, fp32: 528 -> 508 us at vocab 32768, 2000 -> 1923 us
  // at 131072). Shorter rows keep the full grid, whose extra warps in flight
  // are worth more there (fp32 4096: 74 against 77 us), and so do the
  // options' kernels, which issue more than they read (fp32, label smoothing:
  // 734 against 852 us at 32768).
  const int64_t max_groups =
      int64_t{per_sm > 0 ? per_sm : 1} * num_sms * 8 / warps_per_row;
  int64_t groups = args.rows < max_groups ? args.rows : max_groups;
  if (!kOpt && args.vocab * int64_t{sizeof(T)} >= (128 << 10)) {
    const int64_t rows_per_group = (args.rows + max_groups - 1) / max_groups;
    groups = (args.rows + rows_per_group - 1) / rows_per_group;
  }
  const int64_t blocks = (groups * warps_per_row + 7) / 8;
  return LaunchDependent(args.follows_scan, kernel,
                         static_cast<unsigned>(blocks), 256, 0, 1, stream, args,
                         warps_per_row);
}

// Forward: the warp-per-row kernel (a read-only stream). Fused: the
// register/cluster kernel, which keeps each row on chip between its reduction
// and its gradient.
template <typename T, typename G, bool kGrad, bool kOpt>
cudaError_t LaunchRowsTyped(const RowArgs& args, int num_sms,
                            cudaStream_t stream) {
  const bool vectorized = RowsVectorizable(args, sizeof(T), sizeof(G), kGrad);
  const bool warp = args.tune_kernel == kKernelWarp ||
                    (args.tune_kernel == kKernelAuto && !kGrad);
  if (warp) {
    return vectorized ? LaunchWarpRowKernel<T, G, true, kGrad, kOpt>(
                            args, num_sms, stream)
                      : LaunchWarpRowKernel<T, G, false, kGrad, kOpt>(
                            args, num_sms, stream);
  }
  return vectorized
             ? LaunchRowKernel<T, G, true, kGrad, kOpt>(args, num_sms, stream)
             : LaunchRowKernel<T, G, false, kGrad, kOpt>(args, num_sms, stream);
}

// Backward: the pipelined kernel up to 128 KiB rows, the streaming one above
// (measured on the H200: each wins on its side).
template <typename T, typename G, bool kOpt>
cudaError_t LaunchBackwardTyped(const RowArgs& args, int num_sms,
                                cudaStream_t stream) {
  const bool vectorized = RowsVectorizable(args, sizeof(T), sizeof(G), true);
  const bool pipelined = args.tune_kernel == kKernelPipelined ||
                         (args.tune_kernel == kKernelAuto &&
                          args.vocab * int64_t{sizeof(T)} <= (128 << 10));
  if (vectorized && pipelined)
    return LaunchPipelinedBackward<T, G, kOpt>(args, num_sms, stream);
  auto kernel = vectorized ? BackwardKernel<T, G, true, kOpt>
                           : BackwardKernel<T, G, false, kOpt>;
  int per_sm = 0;
  cudaError_t error =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0);
  if (error != cudaSuccess) return error;
  const int64_t max_blocks = int64_t{per_sm > 0 ? per_sm : 1} * num_sms;
  const int64_t blocks = args.rows < max_blocks ? args.rows : max_blocks;
  return LaunchDependent(args.follows_scan, kernel,
                         static_cast<unsigned>(blocks), 256, 0, 1, stream,
                         args);
}

// Calls fn.template operator()<T, G>() for the (logits, grad) element types of
// args.
template <bool kGrad, typename Fn>
cudaError_t DispatchTypes(const RowArgs& args, Fn&& fn) {
  const int grad_type = kGrad ? args.grad_type : args.logits_type;
  switch (args.logits_type) {
    case kF32:
      if (grad_type == kF32) return fn.template operator()<float, float>();
      // fp32 logits with 16-bit gradients: the linear cross-entropy's in-place
      // chunks.
      if constexpr (kGrad) {
        if (grad_type == kBF16)
          return fn.template operator()<float, __nv_bfloat16>();
        if (grad_type == kF16) return fn.template operator()<float, __half>();
      }
      break;
    case kBF16:
      if (grad_type == kBF16)
        return fn.template operator()<__nv_bfloat16, __nv_bfloat16>();
      break;
    case kF16:
      if (grad_type == kF16) return fn.template operator()<__half, __half>();
      break;
  }
  return cudaErrorInvalidValue;
}

// Whether a soft cap, label smoothing or class weights are on: the kernels
// without them (kOpt false) leave their code out.
bool HasOptions(const RowArgs& args) {
  return args.softcap > 0.0f || args.label_smoothing > 0.0f ||
         args.class_weights != nullptr;
}

template <bool kGrad>
struct RowsLauncher {
  const RowArgs& args;
  int num_sms;
  cudaStream_t stream;
  template <typename T, typename G>
  cudaError_t operator()() {
    return HasOptions(args)
               ? LaunchRowsTyped<T, G, kGrad, true>(args, num_sms, stream)
               : LaunchRowsTyped<T, G, kGrad, false>(args, num_sms, stream);
  }
};

struct BackwardLauncher {
  const RowArgs& args;
  int num_sms;
  cudaStream_t stream;
  template <typename T, typename G>
  cudaError_t operator()() {
    return HasOptions(args)
               ? LaunchBackwardTyped<T, G, true>(args, num_sms, stream)
               : LaunchBackwardTyped<T, G, false>(args, num_sms, stream);
  }
};

}  // namespace

cudaError_t LaunchTargetStats(const void* targets, bool targets_i64,
                              int64_t rows, int64_t vocab, int64_t ignore_index,
                              const float* class_weights, TargetStats* stats,
                              cudaStream_t stream) {
  TargetStatsKernel<<<1, kScanThreads, 0, stream>>>(
      targets, targets_i64, rows, vocab, ignore_index, class_weights, stats);
  return cudaGetLastError();
}

cudaError_t LaunchRows(const RowArgs& args, int num_sms, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.vocab <= 0 || args.vocab > INT32_MAX / 2)
    return cudaErrorInvalidValue;
  if (args.grad == nullptr)
    return DispatchTypes<false>(args,
                                RowsLauncher<false>{args, num_sms, stream});
  return DispatchTypes<true>(args, RowsLauncher<true>{args, num_sms, stream});
}

cudaError_t LaunchBackward(const RowArgs& args, int num_sms,
                           cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.vocab <= 0 || args.vocab > INT32_MAX / 2 || args.lse == nullptr ||
      args.grad == nullptr) {
    return cudaErrorInvalidValue;
  }
  return DispatchTypes<true>(args, BackwardLauncher{args, num_sms, stream});
}

cudaError_t LaunchSumRows(const float* row_loss, int64_t rows, float* loss,
                          cudaStream_t stream, bool follows_rows) {
  return LaunchDependent(follows_rows, SumRowsKernel, 1, kScanThreads, 0, 1,
                         stream, row_loss, rows, loss);
}

}  // namespace ce
}  // namespace lossrt
