// The row skeleton of the cross-entropy kernels: the passes over a thread's
// tile of 16-byte pieces of a row (loss/cross_entropy_pieces.cuh; loaded with
// -inf past the vocabulary, so that no pass over a tile tests for the row's
// end): max, sum of exponentials, gradient, with or without the options; and
// FinishRow, which every row kernel calls once a row's statistics are
// reduced. Internal to //loss.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_TILES_CUH_
#define LOSSRT_LOSS_CROSS_ENTROPY_TILES_CUH_

#include <climits>
#include <cstdint>
#include <type_traits>

#include "loss/cross_entropy_pieces.cuh"
#include "loss/cross_entropy_row_stats.cuh"

namespace lossrt {
namespace ce {

// Sum of exp(x - ref) over a tile, in four independent accumulators. (x - ref)
// is formed before the scaling by log2(e), so that the largest terms are
// exact. kKeep also writes each exponential to `kept` (over its own logit for
// fp32 tiles, kept == &tile), for a gradient of one multiply a logit. kCap
// applies the soft cap; kSmooth with `smoothing` adds the label-smoothing sum
// of w_j * z_j over the tile to `weighted_sum`. kExtras also adds the
// entropy's centered sum relative to ref (the thread's max) to `extra`: one
// FFMA a logit on the exponentials the sum takes. Its d = x - ref is clamped
// (0 * -inf would be NaN) for fp32 tiles only; 16-bit ones, issue-bound,
// redo a piece whose sum came out NaN (a -inf logit or padding) clamped, one
// test a piece.
// kArgmax (fp32 tiles of the fused kernel, which holds the row) also takes
// the thread's first index of ref (its max when finite; a thread of only
// -inf has none): one test a logit into a bit mask. (16-bit tiles mark
// theirs in pairs first, MarkPairsEqual.)
template <int R, bool kKeep, bool kCap = false, bool kSmooth = false,
          bool kExtras = false, bool kArgmax = false, typename TileT,
          typename KeptT = TileT>
__device__ __forceinline__ float TileExpSum(const TileT& tile,
                                            const RowView& view, float ref,
                                            KeptT* kept = nullptr,
                                            bool smoothing = false,
                                            float* weighted_sum = nullptr,
                                            ExtraStats* extra = nullptr) {
  constexpr int kW = TileT::kW;
  // fp32 tiles clamp: their kKeep overwrites the logits, and their kernels
  // have instructions to spare, not registers for the redo.
  constexpr bool kClamp = sizeof(typename TileT::Element) == 4;
  static_assert(!kArgmax || (!TileT::kPackedMax && R * kW <= 32),
                "one mask bit a logit; 16-bit tiles mark pairs");
  const float softcap = kCap ? view.softcap : 0.0f;
  const float inv_cap = kCap ? view.inv_cap : 0.0f;
  float sum_part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float centered_part[2] = {0.0f, 0.0f};  // kExtras
  unsigned max_mask = 0;                  // kArgmax
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    float x[kW];
    tile.Unpack(r, base, view.vocab, softcap, inv_cap, x);
    if (kSmooth && smoothing)
      AddWeightedSum<kW>(x, base, view.vocab, view.weights, *weighted_sum);
    float piece_centered = 0.0f;  // kExtras && !kClamp
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      const float d = x[j] - ref;
      if constexpr (kArgmax) {
        if (d == 0.0f) max_mask |= 1u << (r * kW + j);
      }
      x[j] = FastExp2(d * kLog2e);
      sum_part[(r * kW + j) % 4] += x[j];
      if constexpr (kExtras && kClamp) {
        centered_part[(r * kW + j) % 2] += x[j] * fmaxf(d, -3.402823466e38f);
      } else if constexpr (kExtras) {
        piece_centered += x[j] * d;
      }
    }
    if constexpr (kExtras && !kClamp) {
      // The test a piece also bounds ptxas's schedule to a piece: across the
      // tile, exponentials ran ahead of their FFMAs, whose d waited in
      // registers that the fused kernel spilled.
      if (piece_centered != piece_centered) {
        float z[kW];
        tile.Unpack(r, base, view.vocab, softcap, inv_cap, z);
        piece_centered = 0.0f;
#pragma unroll
        for (int j = 0; j < kW; ++j)
          piece_centered += x[j] * fmaxf(z[j] - ref, -3.402823466e38f);
      }
      centered_part[r % 2] += piece_centered;
    }
    if constexpr (kKeep) kept->Store(r, x);
  }
  if constexpr (kExtras) extra->centered += centered_part[0] + centered_part[1];
  if constexpr (kArgmax) {
    extra->argmax = min(extra->argmax, FirstMarkedIndex<kW>(max_mask, view));
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
// kExtras: the extras' statistics of the tile go to `extra` (IdentityExtras
// for a tile of only -inf).
template <typename TileT, int R, bool kOpt, bool kFastSum = false,
          bool kExtras = false>
__device__ __forceinline__ RowStats TileStats(const TileT& tile,
                                              const RowView& view,
                                              int64_t target, bool smoothing,
                                              ExtraStats* extra = nullptr) {
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
  // The soft cap is monotone, so the max is taken over the raw logits (in
  // pairs for 16-bit tiles) and only the max is capped, by the same function
  // as every logit below: each pass then caps a logit once. The extras' argmax
  // (a d == 0 test a logit) takes the max over the capped values instead, so
  // that it equals one of them even where the cap's roundings are not
  // monotone.
  const bool cap_each_in_max = kExtras && inv_cap > 0.0f;
  bool packed = false;
  if constexpr (TileT::kPackedMax) packed = !cap_each_in_max;
  if (packed) {
    if constexpr (TileT::kPackedMax) {
      PackedMax<typename TileT::Element, TileT, R>(tile, max_part);
    }
  } else {
    const float max_cap = cap_each_in_max ? softcap : 0.0f;
    const float max_inv_cap = cap_each_in_max ? inv_cap : 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float x[kW];
      tile.Unpack(r, (view.first + r * view.stride) * kW, view.vocab, max_cap,
                  max_inv_cap, x);
#pragma unroll
      for (int j = 0; j < kW; ++j)
        max_part[(r * kW + j) % kParts] =
            fmaxf(max_part[(r * kW + j) % kParts], x[j]);
    }
  }
  RowStats s = IdentityStats();
  s.max =
      fmaxf(fmaxf(max_part[0], max_part[1]), fmaxf(max_part[2], max_part[3]));
  // The capped max: -inf stays for a thread without logits (its pieces all
  // past the row), while a row's -inf logits cap to -softcap.
  if (inv_cap > 0.0f && !cap_each_in_max) {
    s.max = view.first * kW < view.vocab ? SoftCap(s.max, softcap, inv_cap)
                                         : NegInf();
  }
  float nan_probe =
      0.0f;  // fmaxf drops NaN; an all-NaN tile must still poison the sum
  float ties =
      0.0f;  // elements equal to the max: their exact 1s are counted apart
  // kFastSum: the sum with the max's own exact 1 in it, one exponential and
  // one add a logit and no tie test; rest = sum - 1 then loses the low bits of
  // a row whose max dominates, which the caller redoes (RowNeedsExactPass).
  // Label smoothing's sum is taken in the same pass, from the same unpacked
  // (and capped) logits.
  if constexpr (kExtras) *extra = IdentityExtras();
  float centered_part[kParts] = {0.0f, 0.0f, 0.0f, 0.0f};  // kExtras
  if (kFastSum) {
    s.rest = TileExpSum<R, false, kOpt, kOpt, kExtras>(
                 tile, view, ExpReference(s.max), static_cast<TileT*>(nullptr),
                 smoothing, &s.weighted_sum, extra) -
             1.0f;
  } else if (s.max != NegInf()) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int base = (view.first + r * view.stride) * kW;
      float x[kW];
      tile.Unpack(r, base, view.vocab, softcap, inv_cap, x);
      if (smoothing) {
        AddWeightedSum<kW>(x, base, view.vocab, weights, s.weighted_sum);
      }
      // (x - max) first: exact for the largest terms, unlike a fused x*log2e -
      // max*log2e, whose rounding is huge for large logits.
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        const bool tie = x[j] == s.max;
        ties += tie ? 1.0f : 0.0f;
        if constexpr (kExtras) {
          // The ties' terms are 1 * 0. d clamped: a -inf logit adds 0 * -max.
          const float d = x[j] - s.max;
          const float e = tie ? 0.0f : FastExp2(d * kLog2e);
          sum_part[(r * kW + j) % kParts] += e;
          if (tie) extra->argmax = min(extra->argmax, base + j);
          centered_part[(r * kW + j) % kParts] +=
              e * fmaxf(d, -3.402823466e38f);
        } else {
          sum_part[(r * kW + j) % kParts] +=
              tie ? 0.0f : FastExp2((x[j] - s.max) * kLog2e);
        }
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int base = (view.first + r * view.stride) * kW;
      float x[kW];
      tile.Unpack(r, base, view.vocab, softcap, inv_cap, x);
      if (smoothing)
        AddWeightedSum<kW>(x, base, view.vocab, weights, s.weighted_sum);
#pragma unroll
      for (int j = 0; j < kW; ++j) nan_probe += x[j] != x[j] ? x[j] : 0.0f;
    }
  }
  // The target's logit: only its piece is unpacked again.
  const int target_in_row = TargetInRow(target, view.vocab);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    const bool holds_target =
        static_cast<unsigned>(target_in_row - base) < static_cast<unsigned>(kW);
    if (!holds_target) continue;
    float x[kW];
    tile.Unpack(r, base, view.vocab, softcap, inv_cap, x);
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      if (base + j == target_in_row) s.target_logit = x[j];
    }
  }
  if constexpr (kExtras && !kFastSum) {
    extra->centered = (centered_part[0] + centered_part[1]) +
                      (centered_part[2] + centered_part[3]);
  }
  if (!kFastSum) {
    const float others =
        (sum_part[0] + sum_part[1]) + (sum_part[2] + sum_part[3]) + nan_probe;
    s.rest = s.max == NegInf() ? -1.0f + nan_probe : others + (ties - 1.0f);
  }
  return s;
}

// Stores the gradient of the piece at `base` of the row's view (whole, or the
// partial first piece of a row with a lead, or its partial last one: the
// other elements belong to the rows beside it). Ignored rows get zeros; an
// unvalidated out-of-range target poisons its row (its loss is NaN too), as
// on the CPU. kLead: rows may have a lead (LeadRows); without, the kernel
// keeps no lead test.
template <typename G, int kW, bool kLead>
__device__ __forceinline__ void StorePieceGrad(G* grad_row, int base, int vocab,
                                               int lead,
                                               const RowCoefficients& c,
                                               float (&g)[kW]) {
  if (!c.valid_target) {
    const float fill = c.ignored ? 0.0f : QuietNaN();
#pragma unroll
    for (int j = 0; j < kW; ++j) g[j] = fill;
  }
  // The view's lead elements belong to the row before (RowView::lead).
  const int first_stored = kLead ? lead : INT_MIN;
  if (base + kW <= vocab && base >= first_stored) {
    StoreVec<G, kW>(grad_row + base, g);
  } else {
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      if (base + j < vocab && base + j >= first_stored)
        grad_row[base + j] = FromFloat<G>(g[j]);
    }
  }
}

// The target's dz_t before smoothing's -smooth_w * w_t, from d = z_t - lse
// (RowCoefficients has the math). Near p_t = 1 (d > -1) as coef * expm1(d) +
// (coef - target_coef), which keeps p_t - 1 exact; below, as coef * p_t -
// target_coef, which keeps p_t's own digits: the first form adds coef * p_t
// to -coef in f32 and loses them, all of them where target_coef is small next
// to coef (a target of weight 0 under label smoothing or z-loss).
__device__ __forceinline__ float TargetGrad(float d,
                                            const GradCoefficients& gc) {
  return d > -1.0f ? gc.coef * expm1f(d) + (gc.coef - gc.target_coef)
                   : gc.coef * expf(d) - gc.target_coef;
}

// The gradient of one tile, written once in G. The view's soft cap is applied
// on unpacking (none where the tile already holds capped logits); the cap's
// chain rule is that of the row (gc.inv_cap).
template <typename G, typename TileT, int R, bool kOpt>
__device__ __forceinline__ void TileGrad(const TileT& tile, const RowView& view,
                                         G* grad_row,
                                         const GradCoefficients& gc,
                                         const RowCoefficients& c) {
  constexpr int kW = TileT::kW;
  const float softcap = kOpt ? view.softcap : 0.0f;
  const float inv_cap = kOpt ? gc.inv_cap : 0.0f;
  const float unpack_inv_cap = kOpt ? view.inv_cap : 0.0f;
  const float* weights = kOpt ? view.weights : nullptr;
  const float smooth_w = kOpt ? gc.smooth_w : 0.0f;
  // The entropy's gradient (kOpt kernels): p_j (d_j + H) times ent_coef.
  const float ent_coef = kOpt ? gc.ent_coef : 0.0f;
  const int target_in_row = TargetInRow(c.target, view.vocab);
  bool holds_target = false;
  float target_z = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    if (base >= view.vocab) continue;
    float x[kW], g[kW], p[kW];
    tile.Unpack(r, base, view.vocab, softcap, unpack_inv_cap, x);
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      // The argument is formed before the scaling by log2(e): exact for the
      // large p.
      const float d = (x[j] - gc.shift) - gc.log_sum;
      p[j] = FastExp2(d * kLog2e);
      g[j] = gc.coef * p[j];
    }
    if (kOpt) {
      SubtractSmoothing<kW>(weights, base, view.vocab, smooth_w, g);
      // The entropy's term in a loop of its own (one uniform test a piece).
      if (ent_coef != 0.0f) {
#pragma unroll
        for (int j = 0; j < kW; ++j) {
          const float d = (x[j] - gc.shift) - gc.log_sum;
          // (0, not 0 * -inf, where p is 0)
          if (p[j] > 0.0f) g[j] += ent_coef * p[j] * (d + gc.entropy);
        }
      }
    }
    // The target's z, for its element below.
    if (static_cast<unsigned>(target_in_row - base) <
        static_cast<unsigned>(kW)) {
      holds_target = true;
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        if (base + j == target_in_row) target_z = x[j];
      }
    }
    if (inv_cap > 0.0f) {
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        const float t = x[j] * inv_cap;  // d z / d x = 1 - tanh^2
        g[j] *= 1.0f - t * t;
      }
    }
    StorePieceGrad<G, kW, LeadRows<(kW > 1), kOpt>()>(
        grad_row, base, view.vocab, view.lead, c, g);
  }
  // The target's element again (one a row), TargetGrad's way. The thread that
  // stored its piece above writes it, so the two stores are ordered. Out of
  // the piece loop, expm1f is inlined once, not once a logit of the unrolled
  // loop, whose registers it spilled.
  if (holds_target && c.valid_target) {
    const float d = (target_z - gc.shift) - gc.log_sum;
    float g = TargetGrad(d, gc) -
              smooth_w * SmoothingWeight(weights, target_in_row, view.vocab);
    if (kOpt && ent_coef != 0.0f && __expf(d) > 0.0f)
      g += ent_coef * __expf(d) * (d + gc.entropy);
    if (inv_cap > 0.0f) {
      const float t = target_z * inv_cap;
      g *= 1.0f - t * t;
    }
    grad_row[target_in_row] = FromFloat<G>(g);
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
// logits, which the kept e replace; the entropy's takes its d_j from e_j).
// kExtras: the extras' statistics to `extra`.
template <typename TileT, int R, bool kOpt, bool kExtras = false,
          typename KeptT>
__device__ __forceinline__ ExpTileStats
TileStatsKeepExp(const TileT& tile, const RowView& view, int64_t target,
                 bool smoothing, KeptT& kept, ExtraStats* extra = nullptr) {
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
  if constexpr (!kExtras) {
    out.stats.rest = TileExpSum<R, true, false, kOpt>(
                         tile, view, ExpReference(out.stats.max), &kept,
                         smoothing, &weighted_sum) -
                     1.0f;
  } else {
    float ref = ExpReference(out.stats.max);
    *extra = IdentityExtras();
    if constexpr (TileT::kPackedMax) {
      // 16-bit tiles find their max's first index in pairs before the sum.
      unsigned found = 0;
      const uint32_t max_pair = PairOf<typename TileT::Element>(ref);
#pragma unroll
      for (int r = 0; r < R; ++r)
        MarkPairsEqual<typename TileT::Element>(tile.raw[r], r, max_pair,
                                                found);
      extra->argmax = FirstMarkedPairIndex<kW>(found, view);
      // The sum waits for the search (no pair equals the max only where ref
      // is 0, a thread of only -inf, or the max is NaN): without this data
      // dependency ptxas ran the search after the sum, which kept every raw
      // piece live beside the kept exponentials and spilled them.
      ref = found == 0 ? 0.0f : ref;
    }
    out.stats.rest =
        TileExpSum<R, true, false, kOpt, true, !TileT::kPackedMax>(
            tile, view, ref, &kept, smoothing, &weighted_sum, extra) -
        1.0f;
  }
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
  // The entropy's term (kOpt, entropy_weight on): ent_coef * p_j * (d_j + H)
  // with p_j = e_j * p_scale and d_j = z_j - lse = ln e_j + d_ref, the log
  // on the special-function unit (one MUFU op a logit, as the exact pass's
  // second exponential). A thread of only -inf logits adds nothing (its p are
  // 0), nor does an element whose p is 0 (0, not 0 * -inf).
  const float ent_coef = kOpt ? gc.ent_coef : 0.0f;
  const bool entropy = ent_coef != 0.0f && ref != NegInf();
  const float d_ref =
      entropy ? (ExpReference(ref) - gc.shift) - gc.log_sum : 0.0f;
  const float p_scale = entropy ? FastExp2(d_ref * kLog2e) : 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int base = (view.first + r * view.stride) * kW;
    if (base >= view.vocab) continue;
    float e[kW], g[kW];
    tile.Floats(r, e);
#pragma unroll
    for (int j = 0; j < kW; ++j) g[j] = e[j] * scale;
    if (kOpt) {
      SubtractSmoothing<kW>(weights, base, view.vocab, smooth_w, g);
      if (entropy) {
#pragma unroll
        for (int j = 0; j < kW; ++j) {
          const float p = e[j] * p_scale;
          const float d = FastLog2(e[j]) * kLn2 + d_ref;
          if (p > 0.0f) g[j] += ent_coef * p * (d + gc.entropy);
        }
      }
    }
    StorePieceGrad<G, kW, LeadRows<(kW > 1), kOpt>()>(
        grad_row, base, view.vocab, view.lead, c, g);
  }
  // The target's element again, from its logit, TargetGrad's way. The thread
  // that stored its piece above writes it, so the two stores are ordered.
  if (c.valid_target) {
    const int piece = static_cast<int>(c.target) / kW - view.first;
    if (piece >= 0 && piece % view.stride == 0 && piece / view.stride < R) {
      const float d = (target_logit - gc.shift) - gc.log_sum;
      float g = TargetGrad(d, gc) -
                smooth_w * SmoothingWeight(weights, static_cast<int>(c.target),
                                           view.vocab);
      if (kOpt && ent_coef != 0.0f && __expf(d) > 0.0f)
        g += ent_coef * __expf(d) * (d + gc.entropy);
      grad_row[c.target] = FromFloat<G>(g);
    }
  }
}

// 16-byte pieces of a row a thread holds in the warp-per-row and register
// kernels: 8 of fp32 (or 8 scalars), 4 of 16-bit logits, whose unpacked
// floats would otherwise spill under the 64-register bound: 32 values.
template <typename T, bool kVec>
__host__ __device__ constexpr int PiecesPerThread() {
  return kVec && sizeof(T) == 2 ? 4 : 8;
}

// What a row kernel does once a row's statistics are reduced: reads the scan's
// results at the first row (so that the first row's statistics overlap the
// scan), scales the row's coefficients for the mean, writes the loss and lse
// (`writer`: one thread a row) and returns the gradient's coefficients.
struct ScanState {
  ScanResults results{};
  bool loaded = false;
};

// kExtras: `extras` is the row's reduced PackExtras; the extras are written
// and the entropy's gradient set up.
template <bool kExtras = false>
__device__ __forceinline__ GradCoefficients FinishRow(
    const RowArgs& args, int64_t row, RowCoefficients& c, const RowStats& total,
    bool writer, ScanState& scan, const RowStats& extras = RowStats{}) {
  if (!scan.loaded) {
    scan.results = LoadScanResults(args);
    scan.loaded = true;
  }
  const ScanResults& r = scan.results;
  c.ce_scale *= r.mean.ce_inv;
  c.z_scale *= r.mean.z_inv;
  const float log_sum = log1pf(total.rest);
  const float lse = total.max + log_sum;
  // H = log S - centered / S: two terms >= 0.
  const float entropy =
      kExtras ? log_sum - extras.target_logit / (total.rest + 1.0f) : 0.0f;
  if (writer) {
    WriteRowLoss(args, row, c, total, lse, r.weight_total, r.mean, entropy);
    if constexpr (kExtras)
      WriteRowExtras(args, row, c, total, UnpackArgmax(extras), entropy);
  }
  GradCoefficients gc =
      MakeGradCoefficients(args, c, lse, r.weight_total, total.max, log_sum);
  if (kExtras && args.entropy_weight != 0.0f && c.valid_target) {
    gc.ent_coef = c.z_scale * args.entropy_weight;
    gc.entropy = entropy;
  }
  return gc;
}

// Adds a tile's statistics (and, kExtras, its extras) to a thread's running
// ones; the tile's elements come after the running ones'.
template <bool kExtras>
__device__ __forceinline__ void Accumulate(RowStats& stats, ExtraStats& extra,
                                           const RowStats& tile,
                                           const ExtraStats& tile_extra) {
  if constexpr (kExtras) extra = CombineExtras(stats, extra, tile, tile_extra);
  stats = Combine(stats, tile);
}

// Accumulate for the warp-row kernel, whose tiles take no argmax a logit:
// the tile's centered sum (tile_extra.centered) is merged by the exponential
// that Combine scales the smaller side's sum with, and extra.argmax records
// `tile_first`, the first piece of the tile, when the tile's max beats the
// running one. A lane's tiles come in index order, so the recorded tile is
// the first that holds the lane's max, where FirstIndexOfMaxInTile finds it
// once the row's max is known (one reload of a tile a row).
template <bool kExtras>
__device__ __forceinline__ void AccumulateStreamed(RowStats& stats,
                                                   ExtraStats& extra,
                                                   const RowStats& tile,
                                                   const ExtraStats& tile_extra,
                                                   int tile_first) {
  if constexpr (kExtras) {
    const float max = fmaxf(stats.max, tile.max);
    const float min = fminf(stats.max, tile.max);
    const float d = min - max;
    const float scale = min == NegInf() ? 0.0f : __expf(d);
    const bool tile_larger = tile.max > stats.max;
    // The smaller side's centered sum moved to the larger max (CenteredAt).
    const float small_centered =
        tile_larger ? extra.centered : tile_extra.centered;
    const float small_sum = (tile_larger ? stats.rest : tile.rest) + 1.0f;
    const float large_centered =
        tile_larger ? tile_extra.centered : extra.centered;
    extra.centered =
        large_centered +
        (min == NegInf() ? 0.0f : scale * (small_centered + d * small_sum));
    if (tile_larger) extra.argmax = tile_first;
  }
  stats = Combine(stats, tile);
}

// The first index of `row_max` in a lane's tile of the row at piece
// `first` (stride 32; kNoIndex if none), the tile read again: the warp-row
// kernel's argmax, for the lanes whose max is the row's. The logits are
// unpacked (and soft-capped) as TileStats takes the extras' max, so the max
// equals one of them.
template <typename TileT, int R, bool kOpt, typename T>
__device__ __forceinline__ int FirstIndexOfMaxInTile(const T* logits_row,
                                                     RowView view, int first,
                                                     float row_max) {
  constexpr int kW = TileT::kW;
  const float softcap = kOpt ? view.softcap : 0.0f;
  const float inv_cap = kOpt ? view.inv_cap : 0.0f;
  TileT tile;
  tile.Load(logits_row, view.vocab, first, 32, view.lead);
  int index = kNoIndex;
#pragma unroll
  for (int r = R - 1; r >= 0; --r) {
    const int base = (first + r * 32) * kW;
    float x[kW];
    tile.Unpack(r, base, view.vocab, softcap, inv_cap, x);
#pragma unroll
    for (int j = kW - 1; j >= 0; --j) {
      if (x[j] == row_max && base + j < view.vocab) index = base + j;
    }
  }
  return index;
}

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_TILES_CUH_
