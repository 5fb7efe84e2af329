// A thread's tile of a cross-entropy row and the per-piece helpers of the
// passes over it (loss/cross_entropy_tiles.cuh): the tile of 16-byte pieces,
// loaded with -inf past the vocabulary; packed 16-bit maxima; label
// smoothing's per-piece sums; the argmax's index marks. Internal to //loss.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_PIECES_CUH_
#define LOSSRT_LOSS_CROSS_ENTROPY_PIECES_CUH_

#include <cstdint>
#include <type_traits>

#include "loss/cross_entropy_row_stats.cuh"

namespace lossrt {
namespace ce {
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

  // `row` is 16-byte aligned; its first `lead` elements (those of a row
  // viewed from the piece it starts in, RowView::lead) load as -inf.
  __device__ __forceinline__ void Load(const T* row, int vocab, int first,
                                       int stride, int lead = 0) {
    LoadPieces(row, vocab, first, stride);
    if (lead != 0 && first == 0) {
      union {
        uint4 raw;
        T elements[kW];
      } data;
      data.raw = raw[0];
      const T neg_inf = FromFloat<T>(NegInf());
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        if (k < lead) data.elements[k] = neg_inf;
      }
      raw[0] = data.raw;
    }
  }
  __device__ __forceinline__ void LoadPieces(const T* row, int vocab, int first,
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
    UnpackVec<T, kW>(raw[r], base, vocab, softcap, inv_cap, x);
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

  // Scalar rows are never viewed from a piece (lead is 0).
  __device__ __forceinline__ void Load(const T* row, int vocab, int first,
                                       int stride, int /*lead*/ = 0) {
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
    if (inv_cap > 0.0f) v = SoftCap(v, softcap, inv_cap);
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

// Everything a tile pass needs to know about its row. A row that starts
// inside a 16-byte piece (a contiguous [tokens, 50257] tensor: every row but
// one in four of fp32, one in eight of 16-bit logits) is viewed from the start
// of that piece: `lead` elements of the row before it (-inf on loading, never
// stored) come first, and `vocab` counts them. Indices in a tile pass are of
// the view; only the plain kernels (LeadRows) take such rows.
struct RowView {
  int vocab;
  int first;
  int stride;
  float softcap;
  float inv_cap;
  const float* weights;
  int lead = 0;
};

// Whether a kernel takes rows that start inside a 16-byte piece: the plain
// vectorized ones (without options, whose per-class terms would need the
// lead too).
template <bool kVec, bool kOpt>
__host__ __device__ constexpr bool LeadRows() {
  return kVec && !kOpt;
}

// Elements of the row at `row` before it in its 16-byte piece (RowView::lead);
// kLead off: the row is aligned (0).
template <bool kLead, typename T>
__device__ __forceinline__ int LeadOf(const T* row) {
  if constexpr (kLead) {
    return static_cast<int>((reinterpret_cast<uintptr_t>(row) & 15) /
                            sizeof(T));
  } else {
    return 0;
  }
}

// The view of a row of `vocab` classes at `row` (RowView: `lead`, `vocab`)
// and the 16-byte aligned start of its piece. kLead off: `view` is left as it
// is (an aligned row's view is the row), so those kernels compile as before.
template <bool kLead, typename T>
__device__ __forceinline__ const T* ViewRow(const T* row, int vocab,
                                            RowView& view) {
  if constexpr (kLead) {
    const int lead = LeadOf<kLead>(row);
    view.lead = lead;
    view.vocab = vocab + lead;
    return row - lead;
  } else {
    return row;
  }
}

// Pieces of a row's view (RowView) that a launch covers: one more where rows
// may start inside a piece (a stride that is not a whole number of pieces;
// the first row is aligned).
__host__ __device__ __forceinline__ int64_t ViewPieces(int64_t vocab,
                                                       int64_t stride, int w,
                                                       bool lead_rows) {
  const int64_t max_lead = lead_rows && stride % w != 0 ? w - 1 : 0;
  return (vocab + max_lead + w - 1) / w;
}

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

// Sum of v[0..kN) as a balanced tree: a dependency chain of log2(kN) adds.
template <int kN>
__device__ __forceinline__ float PairwiseSum(const float* v) {
  if constexpr (kN == 1) {
    return v[0];
  } else {
    return PairwiseSum<kN / 2>(v) + PairwiseSum<kN - kN / 2>(v + kN / 2);
  }
}

// Adds label smoothing's w_j * z_j over the piece at `base` to `sum`, elements
// past the vocabulary left out. A whole piece adds its own tree sum, so that
// the running sum's chain grows by one add a piece, not one a logit (a chain
// of a logit's adds made the smoothing forward latency-bound).
// Without class weights (the common case) the piece's sum is of the logits
// alone: the weights' test is one uniform branch a piece, not a select and a
// predicated load a logit.
template <int kW>
__device__ __forceinline__ void AddWeightedSum(const float (&x)[kW], int base,
                                               int vocab, const float* weights,
                                               float& sum) {
  if (base + kW <= vocab) {
    float terms[kW];
    if (weights == nullptr) {
#pragma unroll
      for (int j = 0; j < kW; ++j) terms[j] = x[j];
    } else {
#pragma unroll
      for (int j = 0; j < kW; ++j) terms[j] = weights[base + j] * x[j];
    }
    sum += PairwiseSum<kW>(terms);
    return;
  }
#pragma unroll
  for (int j = 0; j < kW; ++j) {
    if (base + j < vocab)
      sum += weights != nullptr ? weights[base + j] * x[j] : x[j];
  }
}

// Subtracts label smoothing's smooth_w * w_j from a piece's gradient (w_j = 1
// without class weights; elements past the row take the last class's weight,
// unused). One uniform branch a piece: a select and a predicated load a logit
// cost the smoothing kernels a third of their time at 16 bits. Without class
// weights and with smooth_w = 0 nothing changes (g - 0 is g), so it is
// skipped.
template <int kW>
__device__ __forceinline__ void SubtractSmoothing(const float* weights,
                                                  int base, int vocab,
                                                  float smooth_w,
                                                  float (&g)[kW]) {
  if (weights == nullptr) {
    if (smooth_w == 0.0f) return;
#pragma unroll
    for (int j = 0; j < kW; ++j) g[j] -= smooth_w;
  } else {
#pragma unroll
    for (int j = 0; j < kW; ++j)
      g[j] -= smooth_w * weights[min(base + j, vocab - 1)];
  }
}

// The index of the thread's first element that `mask` marks (bit r * kW + j:
// piece r, element j), kNoIndex for none.
template <int kW>
__device__ __forceinline__ int FirstMarkedIndex(unsigned mask,
                                                const RowView& view) {
  if (mask == 0) return kNoIndex;
  const int k = __ffs(mask) - 1;
  return (view.first + (k / kW) * view.stride) * kW + k % kW;
}

// Marks in `found` the elements of 16-bit piece r (raw 16 bytes) equal to
// `max_pair` (the max in both halves), two logits an HSET2 and one LOP3 a
// word: bit q for the low (first) element of the thread's word q, bit 16 + q
// for its high one.
template <typename T>
__device__ __forceinline__ void MarkPairsEqual(const uint4& raw, int r,
                                               uint32_t max_pair,
                                               unsigned& found) {
  using Pair = typename std::conditional<std::is_same<T, __half>::value,
                                         __half2, __nv_bfloat162>::type;
  union {
    uint32_t bits;
    Pair pair;
  } word, max;
  max.bits = max_pair;
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const int q = r * 4 + w;
    word.bits = words[w];
    found |= __heq2_mask(word.pair, max.pair) & ((1u << q) | (1u << (16 + q)));
  }
}

// The index of the thread's first element that MarkPairsEqual marked
// (element 2q + h of its pieces of kW), kNoIndex for none.
template <int kW>
__device__ __forceinline__ int FirstMarkedPairIndex(unsigned found,
                                                    const RowView& view) {
  if (found == 0) return kNoIndex;
  const unsigned low = found & 0xffffu, high = found >> 16;
  const int k_low = low != 0 ? 2 * (__ffs(low) - 1) : 64;
  const int k_high = high != 0 ? 2 * (__ffs(high) - 1) + 1 : 64;
  const int k = min(k_low, k_high);
  return (view.first + (k / kW) * view.stride) * kW + k % kW;
}

// `value` (a 16-bit logit, or +-inf) in both halves of a word of T.
template <typename T>
__device__ __forceinline__ uint32_t PairOf(float value) {
  union {
    T element;
    uint16_t bits;
  } half;
  half.element = FromFloat<T>(value);
  return static_cast<uint32_t>(half.bits) * 0x10001u;
}

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_PIECES_CUH_
