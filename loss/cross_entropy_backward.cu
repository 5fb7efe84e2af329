// The cross-entropy backward from a saved lse: one read of the logits, one
// write of the gradient, by BackwardKernel over chunks of the rows.
#include <cstdint>

#include "loss/cross_entropy_launch.cuh"
#include "loss/cross_entropy_tiles.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace ce {
namespace {

// Gradient from a saved lse, one read and one write: the rows are cut into
// chunks of R pieces a thread, blockDim.x threads a chunk, and each CTA takes
// whole chunks: all R loads of a thread are in flight before its first
// store, and with a grid of one chunk a CTA (the default) the hardware keeps
// as many chunks in flight as fit, with no loop-carried wait. The chunks need
// not talk: the row's statistics are the saved lse.
template <typename T, typename G, bool kVec, bool kOpt, int R>
__global__ void __launch_bounds__(256)
    BackwardKernel(RowArgs args, int chunks_per_row) {
  using TileT = Tile<T, R, kVec>;
  constexpr bool kLead = LeadRows<kVec, kOpt>();
  const int vocab = static_cast<int>(args.vocab);
  const int chunk_pieces = R * static_cast<int>(blockDim.x);
  const int64_t items = args.rows * chunks_per_row;
  const RowView base_view{vocab,
                          0,
                          static_cast<int>(blockDim.x),
                          args.softcap,
                          args.softcap > 0.0f ? 1.0f / args.softcap : 0.0f,
                          args.class_weights};
  bool scanned = false;
  float weight_total = 0.0f;
  MeanScales mean;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / chunks_per_row;
    const int first =
        static_cast<int>(item % chunks_per_row) * chunk_pieces + threadIdx.x;
    RowView view = base_view;
    view.first = first;
    const T* logits_row = ViewRow<kLead>(
        static_cast<const T*>(args.logits) + row * args.logits_stride, vocab,
        view);
    // The logits are older than the target scan, so they load before it ends.
    TileT tile;
    tile.Load(logits_row, view.vocab, first, blockDim.x, view.lead);
    if (!scanned) {
      WaitForPrerequisiteGrids();  // the target scan's results
      weight_total = WeightTotal(args);
      mean = LoadMeanScales(args);
      scanned = true;
    }
    RowCoefficients c = MakeCoefficients(args, row, true, mean);
    const GradCoefficients gc =
        SavedGradCoefficients(args, row, c, weight_total);
    ViewTarget(c, view.lead);
    // The gradient's row viewed as the logits' (the launch checked that its
    // lead is theirs).
    TileGrad<G, TileT, R, kOpt>(
        tile, view,
        static_cast<G*>(args.grad) + row * args.grad_stride - view.lead, gc, c);
  }
}

// The chunked backward: blocks of up to 256 threads, as few as cover a row's
// pieces R a thread, and a grid of one chunk a CTA (or, with
// LaunchTuning::one_row_per_group == -1, what fits on the device at once).
template <typename T, typename G, bool kVec, bool kOpt, int R>
cudaError_t LaunchChunkBackward(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream) {
  constexpr int kW = kVec ? 16 / sizeof(T) : 1;
  const int64_t vecs =
      ViewPieces(args.vocab, args.logits_stride, kW, LeadRows<kVec, kOpt>());
  int64_t threads = RoundUp(CeilDiv(vecs, int64_t{R}), int64_t{32});
  if (threads > 256) threads = 256;
  const int64_t chunks = CeilDiv(vecs, R * threads);
  auto kernel = BackwardKernel<T, G, kVec, kOpt, R>;
  int64_t grid = args.rows * chunks;
  if (tuning.one_row_per_group < 0) {
    int per_sm = 0;
    cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, kernel, static_cast<int>(threads), 0);
    if (error != cudaSuccess) return error;
    const int64_t resident = int64_t{per_sm > 0 ? per_sm : 1} * num_sms;
    if (grid > resident) grid = resident;
  }
  if (grid > (int64_t{1} << 30)) grid = int64_t{1} << 30;
  return LaunchDependent(args.follows_scan, kernel, static_cast<unsigned>(grid),
                         static_cast<unsigned>(threads), 0, 1, stream, args,
                         static_cast<int>(chunks));
}

// Backward: the chunked kernel, 16 pieces a thread for fp32 and 8 for 16-bit
// logits (the same logits a thread); rows that are not 16-byte aligned (kVec
// false) take 8 scalars a thread.
template <typename T, typename G, bool kVec, bool kOpt>
cudaError_t LaunchBackwardTyped(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream) {
  constexpr int kPieces = kVec && sizeof(T) == 4 ? 16 : 8;
  return LaunchChunkBackward<T, G, kVec, kOpt, kPieces>(args, tuning, num_sms,
                                                        stream);
}

}  // namespace

cudaError_t LaunchBackwardRows(const RowArgs& args, const LaunchTuning& tuning,
                               int num_sms, cudaStream_t stream) {
  return DispatchRowKernels<true>(
      args, [&](auto logits_tag, auto grad_tag, auto vec, auto opt) {
        using T = typename decltype(logits_tag)::Type;
        using G = typename decltype(grad_tag)::Type;
        return LaunchBackwardTyped<T, G, decltype(vec)::value,
                                   decltype(opt)::value>(args, tuning, num_sms,
                                                         stream);
      });
}

}  // namespace ce
}  // namespace lossrt
