// The fused forward+backward kernel (RowKernel) and its launch: a row is split
// over a thread-block cluster of 1 to 8 CTAs and held in registers between its
// reduction (warp, block, then the cluster through distributed shared memory)
// and its gradient, so it is read once and written once. Rows without a soft
// cap keep exp(x - thread max) in place of their logits, so the gradient is
// one multiply a logit. Rows longer than a cluster holds are tiled and re-read.
// For fp32 rows one CTA holds, a variant loads the next row before it reduces
// the current one. Instantiated per logits type in cross_entropy_fused_*.cu.
// Internal to //loss.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_FUSED_CUH_
#define LOSSRT_LOSS_CROSS_ENTROPY_FUSED_CUH_

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "loss/cross_entropy_launch.cuh"
#include "loss/cross_entropy_tiles.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace ce {

namespace cg = cooperative_groups;

struct RowShared {
  RowStats warp_stats[kMaxThreads / 32];
  RowStats cluster_slot[2];  // this CTA's partial, double-buffered by the
                             // parity of the reduction
  RowStats row_final;
  // The mbarrier exchange (use_mbarrier): every CTA of the cluster writes its
  // partial of a row into slot [parity][its rank] of every CTA with st.async,
  // and each waits on its own mbarrier [parity] for the cluster's bytes, so
  // no CTA waits for the others to arrive at a barrier, only for their data.
  RowStats peer_slots[2][kMaxCluster];
  uint64_t peer_arrived[2];
  unsigned phase_bits;  // the phase of each mbarrier [parity] to wait for
  bool use_mbarrier;
};

__device__ __forceinline__ uint32_t SharedAddress(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Sets up the mbarrier exchange of a cluster's CTAs; every thread of the CTA
// calls it before the first row. Ends with a cluster barrier, so that no CTA
// writes into a peer whose mbarriers are not set up yet.
__device__ __forceinline__ void InitRowExchange(RowShared& shared,
                                                int cluster_size,
                                                bool use_mbarrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    shared.use_mbarrier = use_mbarrier && cluster_size > 1;
    shared.phase_bits = 0;
    if (shared.use_mbarrier) {
      for (int p = 0; p < 2; ++p) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
                         SharedAddress(&shared.peer_arrived[p]))
                     : "memory");
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
  }
  if (cluster_size > 1) {
    cg::this_cluster().sync();
  } else {
    __syncthreads();
  }
#else
  if (threadIdx.x == 0) shared.use_mbarrier = false;
  __syncthreads();
#endif
}

// This CTA's shared `address` in the CTA of cluster rank `rank` (mapa).
__device__ __forceinline__ uint32_t PeerAddress(uint32_t address, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(address), "r"(rank));
  return remote;
}

// Arrives on this CTA's mbarrier at `barrier`, expecting `bytes` of
// st.async (StoreStatsToPeer) before its phase completes.
__device__ __forceinline__ void ArriveExpectingBytes(uint32_t barrier,
                                                     int bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier),
      "r"(bytes)
      : "memory");
}

// st.async of `stats` to a peer's slot (PeerAddress), completing 16 bytes
// on the peer's mbarrier `remote_barrier`.
__device__ __forceinline__ void StoreStatsToPeer(uint32_t remote_slot,
                                                 const RowStats& stats,
                                                 uint32_t remote_barrier) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], "
      "{%1, %2, %3, %4}, [%5];" ::"r"(remote_slot),
      "r"(__float_as_uint(stats.max)), "r"(__float_as_uint(stats.rest)),
      "r"(__float_as_uint(stats.target_logit)),
      "r"(__float_as_uint(stats.weighted_sum)), "r"(remote_barrier)
      : "memory");
}

// Waits until the mbarrier at `barrier` completes its phase `phase`
// (acquiring the cluster's writes).
__device__ __forceinline__ void WaitPhase(uint32_t barrier, unsigned phase) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
        "%2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(barrier), "r"(phase)
        : "memory");
  }
}

// The cluster's partials of a row through the mbarrier exchange (warp 0 of
// each CTA; `block` is this CTA's partial in every lane): the row's stats, the
// same bits in every CTA (each combines the slots in rank order).
template <bool kWeighted>
__device__ __forceinline__ RowStats ExchangeRowStats(const RowStats& block,
                                                     RowShared& shared,
                                                     int cluster_size,
                                                     int parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & 31;
  const uint32_t barrier = SharedAddress(&shared.peer_arrived[parity]);
  const unsigned phase = (shared.phase_bits >> parity) & 1u;
  const unsigned rank = cg::this_cluster().block_rank();
  if (lane == 0)
    ArriveExpectingBytes(barrier,
                         cluster_size * static_cast<int>(sizeof(RowStats)));
  if (lane < cluster_size) {
    const uint32_t remote_slot =
        PeerAddress(SharedAddress(&shared.peer_slots[parity][rank]), lane);
    const uint32_t remote_barrier = PeerAddress(barrier, lane);
    StoreStatsToPeer(remote_slot, block, remote_barrier);
  }
  WaitPhase(barrier, phase);
  RowStats part =
      lane < cluster_size ? shared.peer_slots[parity][lane] : IdentityStats();
  __syncwarp();
  if (lane == 0) shared.phase_bits ^= 1u << parity;
  return WarpReduce<kWeighted>(part);
#else
  return block;
#endif
}

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
    } else if (shared.use_mbarrier) {
      const RowStats total =
          ExchangeRowStats<kWeighted>(block, shared, cluster_size, parity);
      if (lane == 0) shared.row_final = total;
    } else {
      if (lane == 0) shared.cluster_slot[parity] = block;
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster_size > 1 && !shared.use_mbarrier) {
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

// The extras' slots beside RowShared's (kExtras kernels only, so that the
// plain kernels' shared memory stays as it was): the same layout, of
// ExtraStats.
struct ExtrasShared {
  ExtraStats warp_extras[kMaxThreads / 32];
  ExtraStats cluster_slot[2];
  ExtraStats row_final;
  ExtraStats peer_slots[2][kMaxCluster];
};

__device__ __forceinline__ ExtrasShared& ExtrasSlots() {
  __shared__ ExtrasShared slots;
  return slots;
}

// ExchangeRowStats with the partials' extras: each CTA's 16 bytes of stats
// and 8 of extras go to every CTA on the same mbarrier, which waits for 24
// bytes a CTA.
template <bool kWeighted>
__device__ __forceinline__ RowStats ExchangeRowStatsWithExtras(
    const RowStats& block, ExtraStats& block_extra, RowShared& shared,
    ExtrasShared& xs, int cluster_size, int parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & 31;
  const uint32_t barrier = SharedAddress(&shared.peer_arrived[parity]);
  const unsigned phase = (shared.phase_bits >> parity) & 1u;
  const unsigned rank = cg::this_cluster().block_rank();
  if (lane == 0) {
    ArriveExpectingBytes(
        barrier,
        cluster_size * static_cast<int>(sizeof(RowStats) + sizeof(ExtraStats)));
  }
  if (lane < cluster_size) {
    const uint32_t remote_slot =
        PeerAddress(SharedAddress(&shared.peer_slots[parity][rank]), lane);
    const uint32_t remote_extra =
        PeerAddress(SharedAddress(&xs.peer_slots[parity][rank]), lane);
    const uint32_t remote_barrier = PeerAddress(barrier, lane);
    StoreStatsToPeer(remote_slot, block, remote_barrier);
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], "
        "{%1, %2}, [%3];" ::"r"(remote_extra),
        "r"(__float_as_uint(block_extra.centered)),
        "r"(static_cast<uint32_t>(block_extra.argmax)), "r"(remote_barrier)
        : "memory");
  }
  WaitPhase(barrier, phase);
  RowStats part =
      lane < cluster_size ? shared.peer_slots[parity][lane] : IdentityStats();
  block_extra =
      lane < cluster_size ? xs.peer_slots[parity][lane] : IdentityExtras();
  __syncwarp();
  if (lane == 0) shared.phase_bits ^= 1u << parity;
  WarpReduceWithExtras<kWeighted>(part, block_extra);
  return part;
#else
  return block;
#endif
}

// ReduceRow of a thread's stats with its extras (the centered sum relative to
// its max, the first index of its max) in the same reduction: every thread
// gets the row's stats (the same bits as ReduceRow's) and, in `extra`, the
// row's centered sum at its max and its argmax. Same barriers and slots as
// ReduceRow, so the parity alternates with it.
template <bool kWeighted>
__device__ __forceinline__ RowStats ReduceRowWithExtras(RowStats stats,
                                                        ExtraStats& extra,
                                                        RowShared& shared,
                                                        int cluster_size,
                                                        int& parity) {
  ExtrasShared& xs = ExtrasSlots();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5,
            warps = blockDim.x >> 5;
  WarpReduceWithExtras<kWeighted>(stats, extra);
  if (lane == 0) {
    shared.warp_stats[warp] = stats;
    xs.warp_extras[warp] = extra;
  }
  __syncthreads();
  if (warp == 0) {
    RowStats block = lane < warps ? shared.warp_stats[lane] : IdentityStats();
    ExtraStats block_extra =
        lane < warps ? xs.warp_extras[lane] : IdentityExtras();
    WarpReduceWithExtras<kWeighted>(block, block_extra);
    if (cluster_size == 1) {
      if (lane == 0) {
        shared.row_final = block;
        xs.row_final = block_extra;
      }
    } else if (shared.use_mbarrier) {
      const RowStats total = ExchangeRowStatsWithExtras<kWeighted>(
          block, block_extra, shared, xs, cluster_size, parity);
      if (lane == 0) {
        shared.row_final = total;
        xs.row_final = block_extra;
      }
    } else {
      if (lane == 0) {
        shared.cluster_slot[parity] = block;
        xs.cluster_slot[parity] = block_extra;
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster_size > 1 && !shared.use_mbarrier) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every CTA's partial of this row is in its slot
    if (warp == 0) {
      RowStats part = IdentityStats();
      ExtraStats part_extra = IdentityExtras();
      if (lane < cluster_size) {
        part = *cluster.map_shared_rank(&shared.cluster_slot[parity], lane);
        part_extra = *cluster.map_shared_rank(&xs.cluster_slot[parity], lane);
      }
      WarpReduceWithExtras<kWeighted>(part, part_extra);
      if (lane == 0) {
        shared.row_final = part;
        xs.row_final = part_extra;
      }
    }
  }
#endif
  __syncthreads();
  parity ^= 1;
  extra = xs.row_final;
  return shared.row_final;
}

// The row's stats from a thread's partials (ReduceRow) and, kExtras, its
// extras reduced with them (ReduceRowWithExtras) into `extra`.
template <bool kOpt, bool kExtras>
__device__ __forceinline__ RowStats ReduceRowAndExtras(const RowStats& part,
                                                       ExtraStats* extra,
                                                       RowShared& shared,
                                                       int cluster_size,
                                                       int& parity) {
  if constexpr (kExtras) {
    return ReduceRowWithExtras<kOpt>(part, *extra, shared, cluster_size,
                                     parity);
  } else {
    return ReduceRow<kOpt>(part, shared, cluster_size, parity);
  }
}

// The row's extras from ReduceRowAndExtras in PackExtras' reduced form, for
// FinishRow.
template <bool kExtras>
__device__ __forceinline__ RowStats ReducedExtras(const ExtraStats& row) {
  if constexpr (kExtras) {
    return PackReducedExtras(row);
  } else {
    return RowStats{};
  }
}

// One row in one exponential a logit (TileStatsKeepExp): statistics into
// `kept`, the exact redo where the max dominates, the loss, and the gradient
// from the kept exponentials.
// kExtras: the extras too, and with entropy_weight the entropy's gradient
// term (TileGradFromExp takes d_j from the kept e_j through a log).
template <typename G, typename TileT, typename KeptT, int R, bool kOpt,
          bool kExtras>
__device__ __forceinline__ void RowFromKeptExp(
    const RowArgs& args, int64_t row, const TileT& tile, KeptT& kept,
    const RowView& view, RowCoefficients& c, bool smoothing, RowShared& shared,
    int cluster_size, int& parity, bool writer, ScanState& scan) {
  ExtraStats extra;
  ExpTileStats part = TileStatsKeepExp<TileT, R, kOpt, kExtras>(
      tile, view, c.target, smoothing, kept, &extra);
  RowStats total = ReduceRowAndExtras<kOpt, kExtras>(part.stats, &extra, shared,
                                                     cluster_size, parity);
  if (RowNeedsExactPass(total)) {
    // (The extras keep the first reduction's: the fast sum's rest + 1 is
    // precise as the sum their centered sum is moved with.)
    part.stats.rest = ExactRestFromExp<KeptT, R>(kept, part.ref);
    total = ReduceRow<kOpt>(part.stats, shared, cluster_size, parity);
  }
  const RowStats extras = ReducedExtras<kExtras>(extra);
  const GradCoefficients gc =
      FinishRow<kExtras>(args, row, c, total, writer, scan, extras);
  // The gradient's row viewed as the logits' (the launch checked that its
  // lead is theirs).
  G* grad_row = static_cast<G*>(args.grad) + row * args.grad_stride - view.lead;
  TileGradFromExp<G, KeptT, R, kOpt>(kept, view, part.ref, grad_row, gc, c,
                                     total.target_logit);
}

// One row in the exact pass: the statistics of `tile`, the loss and (kGrad)
// the gradient, with a second exponential a logit.
template <typename G, typename TileT, int R, bool kGrad, bool kOpt,
          bool kExtras>
__device__ __forceinline__ void RowFromExactPass(
    const RowArgs& args, int64_t row, const TileT& tile, const RowView& view,
    RowCoefficients& c, bool smoothing, RowShared& shared, int cluster_size,
    int& parity, bool writer, ScanState& scan) {
  ExtraStats extra;
  const RowStats part = TileStats<TileT, R, kOpt, false, kExtras>(
      tile, view, c.target, smoothing, &extra);
  const RowStats total = ReduceRowAndExtras<kOpt, kExtras>(
      part, &extra, shared, cluster_size, parity);
  const RowStats extras = ReducedExtras<kExtras>(extra);
  const GradCoefficients gc =
      FinishRow<kExtras>(args, row, c, total, writer, scan, extras);
  if constexpr (kGrad) {
    G* grad_row =
        static_cast<G*>(args.grad) + row * args.grad_stride - view.lead;
    TileGrad<G, TileT, R, kOpt>(tile, view, grad_row, gc, c);
  }
}

// One row of a register kernel whose tile holds the whole row (tiles == 1):
// statistics, loss and gradient from the registers. Vectorized rows without
// a soft cap take one exponential a logit (RowFromKeptExp).
template <typename G, typename TileT, int R, bool kGrad, bool kOpt,
          bool kSoftcap, bool kExtras>
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
      RowFromKeptExp<G, TileT, TileT, R, kOpt, kExtras>(
          args, row, tile, tile, view, c, smoothing, shared, cluster_size,
          parity, writer, scan);
    } else {
      FloatTileT kept;
      RowFromKeptExp<G, TileT, FloatTileT, R, kOpt, kExtras>(
          args, row, tile, kept, view, c, smoothing, shared, cluster_size,
          parity, writer, scan);
    }
    return;
  }
  // Soft-capped (and scalar) rows keep the exact sum and a second exponential
  // in the gradient. Vectorized rows are capped once, first: 16-bit ones
  // unpack into floats, fp32 ones are capped in place; their passes then see
  // a view without the cap (the gradient's chain rule is the row's).
  RowView capped_view = view;
  capped_view.softcap = 0.0f;
  capped_view.inv_cap = 0.0f;
  if constexpr (kGrad && kOpt && k16BitVec) {
    FloatTileT floats;
    floats.Fill(tile, view);
    RowFromExactPass<G, FloatTileT, R, kGrad, kOpt, kExtras>(
        args, row, floats, capped_view, c, smoothing, shared, cluster_size,
        parity, writer, scan);
  } else if constexpr (kGrad && kOpt && TileT::kW > 1) {
    if (view.inv_cap > 0.0f) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float z[TileT::kW];
        tile.Unpack(r, (view.first + r * view.stride) * TileT::kW, view.vocab,
                    view.softcap, view.inv_cap, z);
        tile.Store(r, z);
      }
    }
    RowFromExactPass<G, TileT, R, kGrad, kOpt, kExtras>(
        args, row, tile, capped_view, c, smoothing, shared, cluster_size,
        parity, writer, scan);
  } else {
    RowFromExactPass<G, TileT, R, kGrad, kOpt, kExtras>(
        args, row, tile, view, c, smoothing, shared, cluster_size, parity,
        writer, scan);
  }
}

// Rows longer than the cluster's registers hold: tiles of each are read for the
// statistics, then again for the gradient (the last one still in registers).
// (RowKernel's kRowsTiled mode.)
template <typename T, typename G, typename TileT, int R, bool kGrad, bool kOpt,
          bool kExtras, bool kLead>
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
    const T* logits_row = ViewRow<kLead>(
        static_cast<const T*>(args.logits) + row * args.logits_stride,
        static_cast<int>(args.vocab), view);
    RowCoefficients c = MakeCoefficients(args, row, kGrad, MeanScales{});
    ViewTarget(c, view.lead);
    TileT tile;
    RowStats stats = IdentityStats();
    ExtraStats extra = IdentityExtras();
    for (int t = 0; t < tiles; ++t) {
      view.first = t * tile_pieces + first0;
      tile.Load(logits_row, view.vocab, view.first, view.stride, view.lead);
      ExtraStats tile_extra;
      const RowStats tile_stats = TileStats<TileT, R, kOpt, false, kExtras>(
          tile, view, c.target, smoothing, &tile_extra);
      Accumulate<kExtras>(stats, extra, tile_stats, tile_extra);
    }
    const RowStats total = ReduceRowAndExtras<kOpt, kExtras>(
        stats, &extra, shared, cluster_size, parity);
    const RowStats extras = ReducedExtras<kExtras>(extra);
    const GradCoefficients gc =
        FinishRow<kExtras>(args, row, c, total, writer, scan, extras);
    if constexpr (kGrad) {
      G* grad_row =
          static_cast<G*>(args.grad) + row * args.grad_stride - view.lead;
      // Tiles are revisited last-first so that the tile still in registers
      // goes first.
      for (int t = tiles - 1; t >= 0; --t) {
        view.first = t * tile_pieces + first0;
        if (t != tiles - 1)
          tile.Load(logits_row, view.vocab, view.first, view.stride, view.lead);
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
// keeps its (capped) logits and takes the exact pass (RowFromRegisters).
// kExtras: the extras' statistics too (HasExtras).
template <typename T, typename G, int R, bool kVec, bool kGrad, bool kOpt,
          int kMode, bool kSoftcap = false, bool kExtras = false>
// Two CTAs an SM (64 registers a thread at kMaxThreads). The extras' kernels
// spill a few bytes more than the plain ones there (one CTA of 128 registers
// measured slower).
__global__ void __launch_bounds__(kMaxThreads, 2)
    RowKernel(RowArgs args, int cluster_size, int tiles, bool prefetch_l2,
              bool mbarrier_exchange) {
  using TileT = Tile<T, R, kVec>;
  constexpr bool kLead = LeadRows<kVec, kOpt>();
  __shared__ RowShared shared;
  InitRowExchange(shared, cluster_size, mbarrier_exchange);
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
  const int vocab = static_cast<int>(args.vocab);
  // A row's view (ViewRow) and its aligned start.
  auto view_row = [&](int64_t row, RowView& row_view) {
    return ViewRow<kLead>(
        static_cast<const T*>(args.logits) + row * args.logits_stride, vocab,
        row_view);
  };

  // With prefetch_l2, threads r < R ask L2 for this CTA's piece r of a row
  // ahead of the one in registers (its blockDim.x pieces are contiguous):
  // the whole pieces of the row's view.
  auto prefetch_row = [&](int64_t row) {
    if (kVec && prefetch_l2 && threadIdx.x < R && row < args.rows) {
      RowView ahead = view;
      const T* start = view_row(row, ahead);
      const int64_t first =
          rank * blockDim.x + threadIdx.x * static_cast<int64_t>(stride);
      const int64_t row_bytes =
          (kLead ? ahead.vocab : args.vocab) * int64_t{sizeof(T)};
      PrefetchL2(reinterpret_cast<const uint4*>(start) + first,
                 WholePieceBytes(first, blockDim.x, row_bytes));
    }
  };
  if constexpr (kMode == kRowsPrefetch) {
    TileT current;
    RowView next_view = view;
    if (cluster_id < args.rows) {
      const T* start = view_row(cluster_id, next_view);
      current.Load(start, next_view.vocab, first0, stride, next_view.lead);
    }
    for (int64_t row = cluster_id; row < args.rows; row += clusters) {
      // `current` holds this row, in next_view's view.
      view.vocab = next_view.vocab;
      view.lead = next_view.lead;
      // The cluster's next row is on its way before this one is reduced, and
      // L2 fetches the one after.
      TileT next;
      if (row + clusters < args.rows) {
        const T* start = view_row(row + clusters, next_view);
        next.Load(start, next_view.vocab, first0, stride, next_view.lead);
      }
      prefetch_row(row + 2 * clusters);
      RowCoefficients c = MakeCoefficients(args, row, kGrad, MeanScales{});
      ViewTarget(c, view.lead);
      view.first = first0;
      RowFromRegisters<G, TileT, R, kGrad, kOpt, kSoftcap, kExtras>(
          args, row, current, view, c, smoothing, shared, cluster_size, parity,
          rank == 0 && threadIdx.x == 0, scan);
      current = next;
    }
  } else if constexpr (kMode == kRowsTiled) {
    MultiTileRows<T, G, TileT, R, kGrad, kOpt, kExtras, kLead>(
        args, view, shared, cluster_size, tiles, rank, scan);
  } else {
    for (int64_t row = cluster_id; row < args.rows; row += clusters) {
      const T* logits_row = view_row(row, view);
      RowCoefficients c = MakeCoefficients(args, row, kGrad, MeanScales{});
      ViewTarget(c, view.lead);
      TileT tile;
      view.first = first0;
      tile.Load(logits_row, view.vocab, view.first, stride, view.lead);
      prefetch_row(row + clusters);
      RowFromRegisters<G, TileT, R, kGrad, kOpt, kSoftcap, kExtras>(
          args, row, tile, view, c, smoothing, shared, cluster_size, parity,
          rank == 0 && threadIdx.x == 0, scan);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // No CTA may leave while another can still read its shared memory.
  if (cluster_size > 1) cg::this_cluster().sync();
#endif
}

// Chooses the cluster size, threads and tiles for a row of `vecs` vectors, R
// per thread: the smallest cluster whose registers hold the row (so it is read
// once), up to 8 CTAs.
struct RowLaunch {
  int cluster_size;
  int threads;
  int tiles;
};

inline RowLaunch ChooseRowLaunch(int64_t vecs, int per_thread,
                                 bool clusters_allowed) {
  RowLaunch launch{1, kMaxThreads, 1};
  const int64_t per_cta_capacity = int64_t{kMaxThreads} * per_thread;
  while (clusters_allowed && launch.cluster_size < kMaxCluster &&
         CeilDiv(vecs, int64_t{launch.cluster_size}) > per_cta_capacity) {
    launch.cluster_size *= 2;
  }
  const int64_t per_cta = CeilDiv(vecs, int64_t{launch.cluster_size});
  launch.tiles = static_cast<int>(CeilDiv(per_cta, per_cta_capacity));
  if (launch.tiles == 1) {
    const int64_t threads = CeilDiv(per_cta, int64_t{per_thread});
    launch.threads = static_cast<int>((threads + 31) / 32 * 32);
  }
  return launch;
}

template <typename T, typename G, bool kVec, bool kGrad, bool kOpt,
          bool kSoftcap, bool kExtras>
cudaError_t LaunchRowKernelOf(const RowArgs& args, const LaunchTuning& tuning,
                              int num_sms, cudaStream_t stream) {
  constexpr int kW = kVec ? 16 / sizeof(T) : 1;
  constexpr int R = PiecesPerThread<T, kVec>();
  const int64_t vecs =
      ViewPieces(args.vocab, args.logits_stride, kW, LeadRows<kVec, kOpt>());
  // The prefetching variant holds two tiles of half as many pieces: the same
  // registers for two rows. On the H200 it pays for fp32 rows that one CTA
  // holds, and loses where it would double the cluster or for 16-bit logits
  // (bench/RESULTS.md). KernelChoice::kCluster keeps the other kernel. The
  // extras keep to the other kernel (fewer instantiations), and so do fp32
  // rows with 16-bit gradients: the linear cross-entropy's chunks, whose
  // vocabularies are rarely as short as one CTA's half registers.
  constexpr bool kCanPrefetch =
      kVec && kGrad && sizeof(T) == 4 && sizeof(G) == 4 && !kExtras;
  constexpr int kPrefetchR = R / 2;
  const RowLaunch prefetch_launch =
      ChooseRowLaunch(vecs, kPrefetchR, DeviceMajor() >= 9);
  const bool prefetch = kCanPrefetch && prefetch_launch.tiles == 1 &&
                        prefetch_launch.cluster_size == 1 &&
                        tuning.kernel != KernelChoice::kCluster &&
                        tuning.one_row_per_group <= 0;
  const RowLaunch launch =
      prefetch ? prefetch_launch : ChooseRowLaunch(vecs, R, DeviceMajor() >= 9);
  auto kernel = prefetch ? RowKernel < T, G, kCanPrefetch ? kPrefetchR : R,
       kVec, kGrad, kOpt, kCanPrefetch ? kRowsPrefetch : kRowsOneTile, kSoftcap,
       kExtras >
      : launch.tiles > 1
        ? RowKernel<T, G, R, kVec, kGrad, kOpt, kRowsTiled, false, kExtras>
        : RowKernel<T, G, R, kVec, kGrad, kOpt, kRowsOneTile, kSoftcap,
                    kExtras>;
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
  const int64_t clusters =
      args.rows < max_clusters || tuning.one_row_per_group > 0 ? args.rows
                                                               : max_clusters;
  // L2 prefetch of a row ahead (LaunchTuning::l2_prefetch: -1 off, 1 on), for
  // 16-bit rows and fp32 rows on one CTA or a full cluster: in same-run A/Bs
  // on the H200 it paid there and lost on fp32 clusters of 2 and 4 CTAs,
  // whose rows are already many bytes in flight.
  const bool prefetch_l2 =
      launch.tiles == 1 &&
      (tuning.l2_prefetch == 0 ? sizeof(T) == 2 || launch.cluster_size == 1 ||
                                     launch.cluster_size == kMaxCluster
                               : tuning.l2_prefetch > 0);
  return LaunchDependent(args.follows_scan, kernel,
                         static_cast<unsigned>(clusters * launch.cluster_size),
                         launch.threads, 0, launch.cluster_size, stream, args,
                         launch.cluster_size, launch.tiles, prefetch_l2,
                         tuning.exchange >= 0);
}

// The fused kernel for (T, G) rows, with the soft-capped variant where the cap
// is on, and the extras' variants where they (or entropy_weight) are asked
// for.
template <typename T, typename G, bool kVec, bool kOpt, bool kExtras>
cudaError_t LaunchFusedRowKernelOf(const RowArgs& args,
                                   const LaunchTuning& tuning, int num_sms,
                                   cudaStream_t stream) {
  if constexpr (kVec && kOpt) {
    if (args.softcap > 0.0f)
      return LaunchRowKernelOf<T, G, kVec, true, kOpt, true, kExtras>(
          args, tuning, num_sms, stream);
  }
  return LaunchRowKernelOf<T, G, kVec, true, kOpt, false, kExtras>(
      args, tuning, num_sms, stream);
}

template <typename T, typename G, bool kVec, bool kOpt>
cudaError_t LaunchFusedRowKernel(const RowArgs& args,
                                 const LaunchTuning& tuning, int num_sms,
                                 cudaStream_t stream) {
  return HasExtras(args) ? LaunchFusedRowKernelOf<T, G, kVec, kOpt, true>(
                               args, tuning, num_sms, stream)
                         : LaunchFusedRowKernelOf<T, G, kVec, kOpt, false>(
                               args, tuning, num_sms, stream);
}

// LaunchFusedRowKernel where the rows' (logits, gradient) types are one of
// Pairs (std::pair<T, G>), else cudaErrorInvalidValue: each
// cross_entropy_fused_*.cu instantiates its own pairs, so that nvcc compiles
// them in parallel.
template <typename... Pairs>
cudaError_t LaunchFusedRowsOf(const RowArgs& args, const LaunchTuning& tuning,
                              int num_sms, cudaStream_t stream) {
  return DispatchRowKernels<true>(
      args,
      [&](auto logits_tag, auto grad_tag, auto vec, auto opt) -> cudaError_t {
        using T = typename decltype(logits_tag)::Type;
        using G = typename decltype(grad_tag)::Type;
        if constexpr ((std::is_same_v<std::pair<T, G>, Pairs> || ...)) {
          return LaunchFusedRowKernel<T, G, decltype(vec)::value,
                                      decltype(opt)::value>(args, tuning,
                                                            num_sms, stream);
        } else {
          return cudaErrorInvalidValue;
        }
      });
}

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_FUSED_CUH_
