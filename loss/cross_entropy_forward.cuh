// The cross-entropy forward: WarpRowKernel, a warp-per-row streaming kernel.
// A warp streams each row with 16-byte loads (eight pieces a lane in flight),
// keeps online max/sum per lane and reduces with shuffles: no block barrier, a
// persistent grid, one read of the logits. Long rows are shared by 2 to 8
// warps of a block (WarpGroup), whose totals meet in shared memory. The fast
// exponential sum skips the per-logit tie test; rows whose max holds most of
// the probability (RowNeedsExactPass) are streamed again exactly.
// Instantiated per logits type in cross_entropy_forward_*.cu. Internal to
// //loss.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_FORWARD_CUH_
#define LOSSRT_LOSS_CROSS_ENTROPY_FORWARD_CUH_

#include <cstdint>
#include <type_traits>

#include "loss/cross_entropy_launch.cuh"
#include "loss/cross_entropy_tiles.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace ce {

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
    tile.Load(logits_row, view.vocab, first, 32, view.lead);
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

// Warp-per-row kernel (forward): each warp streams whole rows, 8 pieces per
// lane in flight, with per-lane online statistics; the row reduction is a warp
// shuffle with no block barrier, so a persistent grid of many warps per SM
// keeps HBM busy.
// Blocks per SM: three for fp32 (a fourth makes it spill), four for 16-bit
// logits, whose raw tiles take half the registers. The 16-bit extras' kernel
// (an FFMA a logit for the entropy, its argmax found once a row) takes three,
// where ptxas spills a few bytes outside the tile loop (at four, inside it);
// its option variant takes two, where it does not spill; the fp32 extras'
// kernels take three. The vectorized 16-bit option kernels (soft
// cap, label smoothing) take three: at four (64 registers) ptxas spilled ~200
// bytes a thread, at three (80) ~36, and they issue more than they read, so
// the fourth block's loads in flight matter less. (The scalar kernel of
// unaligned rows, kOpt whatever the options, does not spill at four.)
template <typename T, bool kVec, bool kOpt, bool kExtras = false>
constexpr int WarpRowBlocksPerSm() {
  return sizeof(T) == 2 ? (kExtras ? (kOpt ? 2 : 3) : kVec && kOpt ? 3 : 4) : 3;
}

// A lane's argmax once the row's max is known: the first index of it in the
// tile that AccumulateStreamed recorded (the lane's first tile, `first0`, for
// a lane whose max stayed -inf), read again, where the lane holds the row's
// max (mostly one lane a row); kNoIndex elsewhere. The extras' kernels so
// take no argmax test a logit.
template <typename TileT, int R, bool kOpt, typename T>
__device__ __forceinline__ int LaneArgmax(const T* logits_row,
                                          const RowView& view,
                                          const RowStats& lane_stats,
                                          const ExtraStats& extra, int first0,
                                          float row_max) {
  if (lane_stats.max != row_max) return kNoIndex;
  return FirstIndexOfMaxInTile<TileT, R, kOpt>(
      logits_row, view, extra.argmax != kNoIndex ? extra.argmax : first0,
      row_max);
}

// The row's reduced extras (PackExtras) from a lane's partials once the row's
// max is known: a second warp (and group) reduction.
template <bool kExtras>
__device__ __forceinline__ RowStats WarpRowExtras(
    const RowStats& lane_stats, const ExtraStats& extra, float row_max,
    const WarpGroup& group, GroupSlots& slots, int& parity) {
  if constexpr (kExtras) {
    return GroupCombine(
        WarpReduce<false>(PackExtras(lane_stats, extra, row_max)), group, slots,
        parity);
  } else {
    return RowStats{};
  }
}

// kExtras: the extras' statistics too (HasExtras), from the first pass (the
// exact pass of a dominated row redoes only the sum). kLead: rows may start
// inside a piece (RowView::lead; only where LeadRows allows it).
template <typename T, bool kVec, bool kOpt, bool kFastSum, bool kExtras = false,
          bool kLead = LeadRows<kVec, kOpt>()>
__global__ void __launch_bounds__(256,
                                  WarpRowBlocksPerSm<T, kVec, kOpt, kExtras>())
    WarpRowKernel(RowArgs args, int warps_per_row) {
  static_assert(!kLead || LeadRows<kVec, kOpt>());
  constexpr int R = PiecesPerThread<T, kVec>();
  using TileT = Tile<T, R, kVec>;
  constexpr int kW = TileT::kW;
  __shared__ GroupSlots slots;
  const WarpGroup group = MakeWarpGroup(warps_per_row);
  int parity = 0;
  const int vocab = static_cast<int>(args.vocab);
  // The pieces of every row's view (RowView), as the launch counts them.
  const int vecs =
      kLead ? static_cast<int>(ViewPieces(vocab, args.logits_stride, kW, true))
            : (vocab + kW - 1) / kW;
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
  // A row's view and its aligned start (ViewRow).
  auto view_row = [&](int64_t row, RowView& row_view) {
    return ViewRow<kLead>(logits_of(row), vocab, row_view);
  };
  if constexpr (kVec && sizeof(T) == 4) {
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
    // The current row's lead (RowView), whose view starts at
    // logits_of(row) - lead.
    int lead = 0;
    if (row < args.rows) {
      lead = LeadOf<kLead>(logits_of(row));
      current.Load(logits_of(row) - lead, vocab + lead, lane + t * kTileVecs,
                   32, lead);
      c = MakeCoefficients(args, row, false, MeanScales{});
      ViewTarget(c, lead);
    }
    RowStats stats = IdentityStats();
    ExtraStats extra = IdentityExtras();
    while (row < args.rows) {
      int64_t next_row = row;
      int next_t = t + group.size;
      if (next_t >= tiles_per_row) {
        next_row = row + groups;
        next_t = group.rank;
      }
      HalfTile next;
      int next_lead = lead;
      if (next_row < args.rows) {
        if (next_row != row) next_lead = LeadOf<kLead>(logits_of(next_row));
        next.Load(logits_of(next_row) - next_lead, vocab + next_lead,
                  lane + next_t * kTileVecs, 32, next_lead);
      }
      view.vocab = vocab + lead;
      view.lead = lead;
      view.first = lane + t * kTileVecs;
      ExtraStats tile_extra;
      const RowStats tile_stats =
          TileStats<HalfTile, kHalf, kOpt, kFastSum, kExtras>(
              current, view, c.target, smoothing, &tile_extra);
      AccumulateStreamed<kExtras>(stats, extra, tile_stats, tile_extra,
                                  view.first);
      if (next_row != row) {
        RowStats total =
            GroupCombine(WarpReduce<kOpt>(stats), group, slots, parity);
        if (kFastSum && RowNeedsExactPass(total)) {
          total = GroupCombine(
              ExactWarpRowStats<HalfTile, kHalf, kOpt>(
                  logits_of(row) - lead, view, c.target, smoothing,
                  lane + group.rank * kTileVecs, group.size * kTileVecs),
              group, slots, parity);
        }
        if constexpr (kExtras) {
          extra.argmax = LaneArgmax<HalfTile, kHalf, kOpt>(
              logits_of(row) - lead, view, stats, extra,
              lane + group.rank * kTileVecs, total.max);
        }
        const RowStats extras = WarpRowExtras<kExtras>(stats, extra, total.max,
                                                       group, slots, parity);
        FinishRow<kExtras>(args, row, c, total, writer, scan, extras);
        stats = IdentityStats();
        extra = IdentityExtras();
        if (next_row < args.rows) {
          c = MakeCoefficients(args, next_row, false, MeanScales{});
          ViewTarget(c, next_lead);
        }
      }
      current = next;
      lead = next_lead;
      row = next_row;
      t = next_t;
    }
  } else {
    const int first0 = lane + group.rank * 32 * R;
    const int step = group.size * 32 * R;
    for (int64_t row = first_row; row < args.rows; row += groups) {
      const T* logits_row = view_row(row, view);
      RowCoefficients c = MakeCoefficients(args, row, false, MeanScales{});
      ViewTarget(c, view.lead);
      RowStats stats = IdentityStats();
      ExtraStats extra = IdentityExtras();
      for (int first = first0; first < vecs; first += step) {
        TileT tile;
        view.first = first;
        tile.Load(logits_row, view.vocab, first, 32, view.lead);
        ExtraStats tile_extra;
        const RowStats tile_stats =
            TileStats<TileT, R, kOpt, kFastSum, kExtras>(
                tile, view, c.target, smoothing, &tile_extra);
        AccumulateStreamed<kExtras>(stats, extra, tile_stats, tile_extra,
                                    first);
      }
      RowStats total =
          GroupCombine(WarpReduce<kOpt>(stats), group, slots, parity);
      if (kFastSum && RowNeedsExactPass(total)) {
        total = GroupCombine(
            ExactWarpRowStats<TileT, R, kOpt>(logits_row, view, c.target,
                                              smoothing, first0, step),
            group, slots, parity);
      }
      if constexpr (kExtras) {
        extra.argmax = LaneArgmax<TileT, R, kOpt>(logits_row, view, stats,
                                                  extra, first0, total.max);
      }
      const RowStats extras =
          WarpRowExtras<kExtras>(stats, extra, total.max, group, slots, parity);
      FinishRow<kExtras>(args, row, c, total, writer, scan, extras);
    }
  }
}

// The forward takes the fast exponential sum (one exponential and add a
// logit, no tie test; rows whose max dominates are streamed again for the
// exact pass), with or without options: 16-bit logits always (they are
// issue-bound on two logits a 32-bit word), fp32 from vocab 32768 (below it
// the tie test costs less than the fast sum's extra instructions).
constexpr int64_t kFastSumF32Vocab = 32768;

// Warps that share a row of the warp-per-row kernel (WarpGroup) when the
// caller does not choose (LaunchTuning::warps_per_row), by the row's tiles
// (of 512 floats in the fp32 forward's walk, 1024 16-bit logits otherwise),
// as measured on the H200 (bench/RESULTS.md): fp32 two warps a row from 16
// tiles and four from 32, bf16 two from 64. Shorter rows (the barrier waits
// outweigh the even end) and the options' kernels keep one.
inline int AutoWarpsPerRow(bool fp32_walk, bool sixteen_bit, bool options,
                           int64_t tiles_per_row) {
  if (options) return 1;
  if (fp32_walk) return tiles_per_row >= 32 ? 4 : tiles_per_row >= 16 ? 2 : 1;
  return sixteen_bit && tiles_per_row >= 64 ? 2 : 1;
}

template <typename T, bool kVec, bool kOpt>
cudaError_t LaunchWarpRowKernel(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream) {
  // 16-bit rows always take the fast sum, so they have no exact-sum kernel;
  // fp32 rows take it from kFastSumF32Vocab (LaunchTuning::fast_sum overrides
  // that for fp32 only).
  constexpr bool kHasExactSum = sizeof(T) == 4;
  if (!kHasExactSum && tuning.fast_sum == 1) return cudaErrorInvalidValue;
  const bool fast_sum = tuning.fast_sum == 0 ? args.vocab >= kFastSumF32Vocab
                                             : tuning.fast_sum == 2;
  constexpr bool kWalk = kVec && sizeof(T) == 4;  // half tiles
  constexpr int kW = kVec ? 16 / sizeof(T) : 1;
  // The extras' kernel always takes the fast sum (one instantiation a type
  // pair; a dominated row's exact pass keeps the sum exact).
  auto kernel_of = [&](auto lead) {
    constexpr bool kLead = decltype(lead)::value;
    auto kernel = WarpRowKernel<T, kVec, kOpt, true, false, kLead>;
    if (HasExtras(args)) {
      kernel = WarpRowKernel<T, kVec, kOpt, true, true, kLead>;
    } else if constexpr (kHasExactSum) {
      if (!fast_sum) kernel = WarpRowKernel<T, kVec, kOpt, false, false, kLead>;
    }
    return kernel;
  };
  auto kernel = kernel_of(std::bool_constant<LeadRows<kVec, kOpt>()>{});
  if constexpr (LeadRows<kVec, kOpt>()) {
    // Aligned rows take the kernel without leads: the lead-capable walk's
    // per-row work costs short aligned rows a few percent (bench/RESULTS.md).
    if (args.logits_stride % kW == 0) kernel = kernel_of(std::false_type{});
  }
  int per_sm = 0;
  cudaError_t error =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0);
  if (error != cudaSuccess) return error;
  if (tuning.blocks_per_sm > 0 && tuning.blocks_per_sm < per_sm)
    per_sm = tuning.blocks_per_sm;
  // Warps a row (WarpGroup), at most one a tile of the row.
  constexpr int kR = PiecesPerThread<T, kVec>();
  constexpr int kTileVecs = 32 * (kWalk ? kR / 2 : kR);
  const int64_t vecs =
      ViewPieces(args.vocab, args.logits_stride, kW, LeadRows<kVec, kOpt>());
  const int64_t tiles_per_row = CeilDiv(vecs, int64_t{kTileVecs});
  int warps_per_row =
      tuning.warps_per_row > 0
          ? tuning.warps_per_row
          : AutoWarpsPerRow(kWalk, kVec && sizeof(T) == 2, kOpt, tiles_per_row);
  if (warps_per_row != 1 && warps_per_row != 2 && warps_per_row != 4 &&
      warps_per_row != 8) {
    return cudaErrorInvalidValue;
  }
  while (warps_per_row > 1 && warps_per_row > tiles_per_row) warps_per_row /= 2;
  // A full grid leaves rows % warps warps one row more than the rest (16384
  // rows on 3168 warps: 544 warps take a sixth row, on a device otherwise
  // idle). From 128 KiB rows, where that last row is long, the grid is the
  // fewest warps that take the same most rows a warp, so that the rows
  // spread evenly. Shorter rows keep the full grid, whose extra warps in
  // flight are worth more there, and so do the options' kernels, which issue
  // more than they read.
  const int64_t max_groups =
      int64_t{per_sm > 0 ? per_sm : 1} * num_sms * 8 / warps_per_row;
  int64_t groups = args.rows < max_groups ? args.rows : max_groups;
  if (!kOpt && args.vocab * int64_t{sizeof(T)} >= (128 << 10)) {
    const int64_t rows_per_group = CeilDiv(args.rows, max_groups);
    groups = CeilDiv(args.rows, rows_per_group);
  }
  if (tuning.one_row_per_group > 0) groups = args.rows;
  const int64_t blocks = (groups * warps_per_row + 7) / 8;
  return LaunchDependent(args.follows_scan, kernel,
                         static_cast<unsigned>(blocks), 256, 0, 1, stream, args,
                         warps_per_row);
}

// LaunchWarpRowKernel where the rows' logits type is one of Ts, else
// cudaErrorInvalidValue: each cross_entropy_forward_*.cu instantiates its own
// type, so that nvcc compiles them in parallel.
template <typename... Ts>
cudaError_t LaunchForwardRowsOf(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream) {
  return DispatchRowKernels<false>(
      args, [&](auto logits_tag, auto, auto vec, auto opt) -> cudaError_t {
        using T = typename decltype(logits_tag)::Type;
        if constexpr ((std::is_same_v<T, Ts> || ...)) {
          return LaunchWarpRowKernel<T, decltype(vec)::value,
                                     decltype(opt)::value>(args, tuning,
                                                           num_sms, stream);
        } else {
          return cudaErrorInvalidValue;
        }
      });
}

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_FORWARD_CUH_
