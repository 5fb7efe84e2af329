// The cross-entropy backward from a saved lse: one read of the logits, one
// write of the gradient. PipelinedBackwardKernel (rows up to 128 KiB) copies
// the next rows into shared memory with cp.async while the current one is
// written; BackwardKernel streams longer rows.
#include <cstdint>

#include "loss/cross_entropy_launch.cuh"
#include "loss/cross_entropy_tiles.cuh"

namespace lossrt {
namespace ce {
namespace {

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
  // This thread's first piece; piece r is r * blockDim.x further.
  const uint4* pieces;
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

// Launch of the pipelined backward: blocks of up to 512 threads with 8 pieces
// each (32 KiB per stage and block), as many blocks per row as that takes, and
// `stages` rows in flight.
struct PipelineLaunch {
  int group_size;
  int threads;
  int stages;
  int shared_bytes;
};

PipelineLaunch ChoosePipelineLaunch(int64_t vecs, const LaunchTuning& tuning) {
  PipelineLaunch launch;
  const int64_t max_per_block = int64_t{kMaxThreads / 2} * kStagedPieces;
  launch.group_size =
      static_cast<int>((vecs + max_per_block - 1) / max_per_block);
  const int64_t per_block = (vecs + launch.group_size - 1) / launch.group_size;
  int64_t threads =
      ((per_block + kStagedPieces - 1) / kStagedPieces + 31) / 32 * 32;
  launch.threads = static_cast<int>(threads < 32 ? 32 : threads);
  launch.stages = tuning.stages > 0 ? tuning.stages : 2;
  launch.shared_bytes = launch.stages * launch.threads * kStagedPieces * 16;
  return launch;
}

template <typename T, typename G, bool kOpt>
cudaError_t LaunchPipelinedBackward(const RowArgs& args,
                                    const LaunchTuning& tuning, int num_sms,
                                    cudaStream_t stream) {
  constexpr int kW = 16 / sizeof(T);
  const PipelineLaunch launch =
      ChoosePipelineLaunch((args.vocab + kW - 1) / kW, tuning);
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

// Backward: the pipelined kernel up to 128 KiB rows, the streaming one above
// (measured on the H200: each wins on its side). Rows that are not 16-byte
// aligned (kVec false) stream.
template <typename T, typename G, bool kVec, bool kOpt>
cudaError_t LaunchBackwardTyped(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream) {
  if constexpr (kVec) {
    const bool pipelined = tuning.kernel == KernelChoice::kPipelined ||
                           (tuning.kernel == KernelChoice::kAuto &&
                            args.vocab * int64_t{sizeof(T)} <= (128 << 10));
    if (pipelined)
      return LaunchPipelinedBackward<T, G, kOpt>(args, tuning, num_sms, stream);
  }
  auto kernel = BackwardKernel<T, G, kVec, kOpt>;
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
