// Probe (issue 18): can a cross-entropy row kernel that stages its rows in
// shared memory through the Hopper bulk-copy engine (cp.async.bulk, completed
// on an mbarrier) reach the copy rate that loss/cross_entropy_fused.cuh's
// register kernel does not? The register kernel holds a row in registers, so a
// SM keeps only one or two rows in flight and its loads stall while it reduces
// and writes. Here a row is split over a cluster of C CTAs whose slices are at
// most 64 KiB of shared memory, so three CTAs share a SM and one's loads
// overlap another's reduction and stores; the threads never hold the row, the
// gradient is written in place in shared memory and stored by one bulk copy.
//
// For f32 and bf16 logits [tokens, vocab] with random targets and the mean
// reduction it times the forward (loss and lse) and the one pass (loss, lse and
// gradient) with CUDA events (median of 20 after 3 warm-up), checks 16 rows
// against a double-precision CPU reference, and prints each time against the
// copy (device-to-device memcpy) and read (vectorized sum) rates measured in
// the same run. Not used by the library. Run on a GPU machine:
//   tools/ce_staged_probe [tokens] [vocab,vocab,...]
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cg = cooperative_groups;

namespace {

#define PROBE_CHECK(call)                                     \
  do {                                                        \
    const cudaError_t probe_error = (call);                   \
    if (probe_error != cudaSuccess) {                         \
      std::printf("%s failed: %s (line %d)\n", #call,         \
                  cudaGetErrorString(probe_error), __LINE__); \
      std::exit(1);                                           \
    }                                                         \
  } while (false)

constexpr int kThreads = 256;
constexpr int kMaxSliceBytes = 64 << 10;

// The device code needs clusters and bulk copies (sm_90); other targets of the
// build compile an empty kernel.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define PROBE_SM90 1
#else
#define PROBE_SM90 0
#endif
#if PROBE_SM90
constexpr int kChunks = 4;  // bulk copies a slice, each on its own mbarrier
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ int64_t Min(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void WaitParity(uint32_t barrier, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  }
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A vector of 16 bytes of T as floats, and back.
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int kWidth = 4;
  static __device__ __forceinline__ void Load(const void* at, float* out) {
    const float4 v = *static_cast<const float4*>(at);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
  static __device__ __forceinline__ void Store(void* at, const float* in) {
    *static_cast<float4*>(at) = make_float4(in[0], in[1], in[2], in[3]);
  }
};
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int kWidth = 8;
  static __device__ __forceinline__ void Load(const void* at, float* out) {
    const uint4 v = *static_cast<const uint4*>(at);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
  static __device__ __forceinline__ void Store(void* at, const float* in) {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 pair =
          __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
      words[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *static_cast<uint4*>(at) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
};

// Stores N floats as G at `at` (16 or 8 bytes).
template <typename G, int N>
__device__ __forceinline__ void StoreAs(void* at, const float* in) {
  if constexpr (sizeof(G) == 4) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      static_cast<float4*>(at)[k] =
          make_float4(in[4 * k], in[4 * k + 1], in[4 * k + 2], in[4 * k + 3]);
    }
  } else {
    uint32_t words[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const __nv_bfloat162 pair =
          __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
      words[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    if constexpr (N == 8) {
      *static_cast<uint4*>(at) =
          make_uint4(words[0], words[1], words[2], words[3]);
    } else {
      *static_cast<uint2*>(at) = make_uint2(words[0], words[1]);
    }
  }
}

template <int kBlock>
__device__ __forceinline__ float BlockReduceN(float value, float* scratch,
                                              bool is_max) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = is_max ? fmaxf(value, other) : value + other;
  }
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = scratch[0];
  for (int w = 1; w < kBlock / 32; ++w)
    value = is_max ? fmaxf(value, scratch[w]) : value + scratch[w];
  __syncthreads();  // scratch is reused
  return value;
}

__device__ __forceinline__ float BlockReduce(float value, float* scratch,
                                             bool is_max) {
  return BlockReduceN<kThreads>(value, scratch, is_max);
}

#endif  // PROBE_SM90

// One CTA per (row, slice); the C CTAs of a cluster share a row. `slice` is a
// multiple of 64 elements; every CTA's slice is non-empty. A gradient of
// another type than the logits (G, e.g. bf16 for fp32 logits: the linear
// cross-entropy's chunks) is staged after the slice, else in place.
template <typename T, typename G, bool kGrad>
__global__ void __launch_bounds__(kThreads)
    StagedRowKernel(const T* __restrict__ logits, G* __restrict__ grad,
                    const int64_t* __restrict__ targets, int64_t vocab,
                    int slice, float grad_scale, float* __restrict__ loss,
                    float* __restrict__ lse_out) {
#if PROBE_SM90
  // [slice] of T, then [slice] of G where G is not T.
  extern __shared__ __align__(128) unsigned char staged[];
  __shared__ __align__(8) uint64_t arrived[kChunks];
  __shared__ float scratch[kThreads / 32];
  __shared__ float2 partial;      // this CTA's (max, sum of exp(x - max))
  __shared__ float target_logit;  // where this CTA's slice holds the target
  using V = Vec<T>;
  constexpr int kW = V::kWidth;
  const cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / cluster_size;
  const int64_t col0 = static_cast<int64_t>(rank) * slice;
  const int count = static_cast<int>(Min(slice, vocab - col0));
  const int vecs = count / kW;
  // Chunk c covers vectors [chunk_vecs * c, min(chunk_vecs * (c + 1), vecs)).
  const int chunk_vecs = (vecs + kChunks - 1) / kChunks;
  const T* source = logits + row * vocab + col0;
  const int64_t target = targets[row];
  const bool owns_target = target >= col0 && target < col0 + count;

  if (threadIdx.x == 0) {
    for (int c = 0; c < kChunks; ++c) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
                       SharedAddress(&arrived[c]))
                   : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    for (int c = 0; c < kChunks; ++c) {
      const int begin = chunk_vecs * c;
      const int end = static_cast<int>(Min(vecs, begin + chunk_vecs));
      const uint32_t bytes = end > begin ? (end - begin) * 16u : 0u;
      const uint32_t barrier = SharedAddress(&arrived[c]);
      asm volatile(
          "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
              barrier),
          "r"(bytes)
          : "memory");
      if (bytes > 0) {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1], %2, [%3];" ::"r"(SharedAddress(staged + begin * 16)),
            "l"(source + static_cast<int64_t>(begin) * kW), "r"(bytes),
            "r"(barrier)
            : "memory");
      }
    }
  }
  __syncthreads();  // the barriers are initialized before anyone waits

  // Pass 1: the slice's max, chunk by chunk as the copies land.
  float max_value = -INFINITY;
  for (int c = 0; c < kChunks; ++c) {
    WaitParity(SharedAddress(&arrived[c]), 0);
    const int end = static_cast<int>(Min(vecs, chunk_vecs * (c + 1)));
    for (int i = chunk_vecs * c + threadIdx.x; i < end; i += kThreads) {
      float x[kW];
      V::Load(staged + i * 16, x);
#pragma unroll
      for (int k = 0; k < kW; ++k) max_value = fmaxf(max_value, x[k]);
      // Read here, before pass 3 may overwrite it in place (the reductions'
      // barriers publish it).
      if (owns_target && i == (target - col0) / kW)
        target_logit = x[(target - col0) % kW];
    }
  }
  max_value = BlockReduce(max_value, scratch, true);
  // Pass 2: the sum of exponentials against the slice's max.
  const float scaled_max = max_value * kLog2e;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < vecs; i += kThreads) {
    float x[kW];
    V::Load(staged + i * 16, x);
#pragma unroll
    for (int k = 0; k < kW; ++k) sum += Exp2(fmaf(x[k], kLog2e, -scaled_max));
  }
  sum = BlockReduce(sum, scratch, false);
  if (threadIdx.x == 0) partial = make_float2(max_value, sum);

  // The row's lse from the cluster's partials (every CTA combines them in
  // rank order, so all get the same bits).
  float row_max = max_value, row_sum = sum;
  if (cluster_size > 1) {
    cluster.sync();
    row_max = -INFINITY;
    for (int r = 0; r < cluster_size; ++r)
      row_max = fmaxf(row_max, cluster.map_shared_rank(&partial, r)->x);
    row_sum = 0.0f;
    for (int r = 0; r < cluster_size; ++r) {
      const float2 other = *cluster.map_shared_rank(&partial, r);
      row_sum += other.y * Exp2((other.x - row_max) * kLog2e);
    }
    // Arrive now, wait before exiting: no CTA may leave while a peer can
    // still read its `partial`.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  }
  const float lse = row_max + logf(row_sum);
  if (threadIdx.x == 0) {
    if (rank == 0) lse_out[row] = lse;
    if (owns_target) loss[row] = lse - target_logit;
  }
  if constexpr (kGrad) {
    // Pass 3: the gradient (in place where G is T), then one bulk store of
    // the slice.
    constexpr bool kInPlace = std::is_same_v<T, G>;
    unsigned char* out =
        kInPlace ? staged : staged + static_cast<size_t>(slice) * sizeof(T);
    const float scaled_lse = lse * kLog2e;
    for (int i = threadIdx.x; i < vecs; i += kThreads) {
      float x[kW];
      V::Load(staged + i * 16, x);
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        float g = Exp2(fmaf(x[k], kLog2e, -scaled_lse)) * grad_scale;
        if (col0 + i * kW + k == target) g -= grad_scale;
        x[k] = g;
      }
      StoreAs<G, kW>(out + i * kW * sizeof(G), x);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile(
          "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
              grad + row * vocab + col0),
          "r"(SharedAddress(out)),
          "r"(static_cast<uint32_t>(vecs * kW * sizeof(G)))
          : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
  }
  if (cluster_size > 1) {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  }
#endif
}

// The persistent variant: a grid of as many clusters as fit at once, each
// looping over rows, with two slice buffers so that the bulk copy of the next
// row lands while this one is reduced and written.
constexpr int kPersistentThreads = 512;

template <typename T, typename G, bool kGrad>
__global__ void __launch_bounds__(kPersistentThreads)
    PersistentRowKernel(const T* __restrict__ logits, G* __restrict__ grad,
                        const int64_t* __restrict__ targets, int64_t rows,
                        int64_t vocab, int slice, float grad_scale,
                        float* __restrict__ loss, float* __restrict__ lse_out) {
#if PROBE_SM90
  // [2][slice] of T, then [slice] of G where G is not T.
  extern __shared__ __align__(128) unsigned char staged[];
  __shared__ __align__(8) uint64_t arrived[2][kChunks];
  __shared__ float scratch[kPersistentThreads / 32];
  __shared__ float2 partial[2];  // this CTA's (max, sum), by row parity
  __shared__ float target_logit;
  using V = Vec<T>;
  constexpr int kW = V::kWidth;
  constexpr int kThreadsHere = kPersistentThreads;
  const cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t first_row = blockIdx.x / cluster_size;
  const int64_t row_step = gridDim.x / cluster_size;
  const int64_t col0 = static_cast<int64_t>(rank) * slice;
  const int count = static_cast<int>(Min(slice, vocab - col0));
  const int vecs = count / kW;
  const int chunk_vecs = (vecs + kChunks - 1) / kChunks;
  const size_t buffer_bytes = static_cast<size_t>(slice) * sizeof(T);
  constexpr bool kInPlace = std::is_same_v<T, G>;
  unsigned char* out_apart = staged + 2 * buffer_bytes;

  // Thread 0: the bulk copies of `row`'s slice into buffer `b`.
  auto issue = [&](int64_t row, int b) {
    const T* source = logits + row * vocab + col0;
    for (int c = 0; c < kChunks; ++c) {
      const int begin = chunk_vecs * c;
      const int end = static_cast<int>(Min(vecs, begin + chunk_vecs));
      const uint32_t bytes = end > begin ? (end - begin) * 16u : 0u;
      const uint32_t barrier = SharedAddress(&arrived[b][c]);
      asm volatile(
          "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
              barrier),
          "r"(bytes)
          : "memory");
      if (bytes > 0) {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1], %2, [%3];" ::"r"(
                SharedAddress(staged + b * buffer_bytes + begin * 16)),
            "l"(source + static_cast<int64_t>(begin) * kW), "r"(bytes),
            "r"(barrier)
            : "memory");
      }
    }
  };
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < kChunks; ++c)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
                         SharedAddress(&arrived[b][c]))
                     : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if (first_row < rows) issue(first_row, 0);
  }
  __syncthreads();

  int it = 0;
  for (int64_t row = first_row; row < rows; row += row_step, ++it) {
    const int b = it & 1;
    const uint32_t parity = (it >> 1) & 1;
    unsigned char* buffer = staged + b * buffer_bytes;
    // The other buffer's row is done (the barrier above or at the loop's
    // end) and its store has read it: load the next row there.
    if (threadIdx.x == 0) {
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      if (row + row_step < rows) issue(row + row_step, b ^ 1);
    }
    const int64_t target = targets[row];
    const bool owns_target = target >= col0 && target < col0 + count;
    float max_value = -INFINITY;
    for (int c = 0; c < kChunks; ++c) {
      WaitParity(SharedAddress(&arrived[b][c]), parity);
      const int end = static_cast<int>(Min(vecs, chunk_vecs * (c + 1)));
      for (int i = chunk_vecs * c + threadIdx.x; i < end; i += kThreadsHere) {
        float x[kW];
        V::Load(buffer + i * 16, x);
#pragma unroll
        for (int k = 0; k < kW; ++k) max_value = fmaxf(max_value, x[k]);
        if (owns_target && i == (target - col0) / kW)
          target_logit = x[(target - col0) % kW];
      }
    }
    max_value = BlockReduceN<kThreadsHere>(max_value, scratch, true);
    const float scaled_max = max_value * kLog2e;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < vecs; i += kThreadsHere) {
      float x[kW];
      V::Load(buffer + i * 16, x);
#pragma unroll
      for (int k = 0; k < kW; ++k) sum += Exp2(fmaf(x[k], kLog2e, -scaled_max));
    }
    sum = BlockReduceN<kThreadsHere>(sum, scratch, false);
    float row_max = max_value, row_sum = sum;
    if (cluster_size > 1) {
      if (threadIdx.x == 0) partial[b] = make_float2(max_value, sum);
      cluster.sync();
      row_max = -INFINITY;
      for (int r = 0; r < cluster_size; ++r)
        row_max = fmaxf(row_max, cluster.map_shared_rank(&partial[b], r)->x);
      row_sum = 0.0f;
      for (int r = 0; r < cluster_size; ++r) {
        const float2 other = *cluster.map_shared_rank(&partial[b], r);
        row_sum += other.y * Exp2((other.x - row_max) * kLog2e);
      }
    }
    const float lse = row_max + logf(row_sum);
    if (threadIdx.x == 0) {
      if (rank == 0) lse_out[row] = lse;
      if (owns_target) loss[row] = lse - target_logit;
    }
    if constexpr (kGrad) {
      unsigned char* out = kInPlace ? buffer : out_apart;
      const float scaled_lse = lse * kLog2e;
      for (int i = threadIdx.x; i < vecs; i += kThreadsHere) {
        float x[kW];
        V::Load(buffer + i * 16, x);
#pragma unroll
        for (int k = 0; k < kW; ++k) {
          float g = Exp2(fmaf(x[k], kLog2e, -scaled_lse)) * grad_scale;
          if (col0 + i * kW + k == target) g -= grad_scale;
          x[k] = g;
        }
        StoreAs<G, kW>(out + i * kW * sizeof(G), x);
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
      if (threadIdx.x == 0) {
        asm volatile(
            "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                grad + row * vocab + col0),
            "r"(SharedAddress(out)),
            "r"(static_cast<uint32_t>(vecs * kW * sizeof(G)))
            : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        // A store from the apart buffer must have read it before the next
        // row's pass 3 writes it.
        if (!kInPlace)
          asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      }
    }
    __syncthreads();  // this row's buffer and target_logit are free
  }
  if (threadIdx.x == 0)
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  if (cluster_size > 1) cluster.sync();  // no peer reads our partials
#endif
}

__global__ void FillLogits(void* out, bool bf16, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // Sum of four uniforms: roughly normal, scale 2.
    float value = 0.0f;
    for (int k = 0; k < 4; ++k)
      value += static_cast<float>((z >> (16 * k)) & 0xffff) / 65536.0f - 0.5f;
    value *= 3.46f;
    if (bf16) {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16(value);
    } else {
      static_cast<float*>(out)[i] = value;
    }
  }
}

__global__ void ReadSum(const uint4* in, int64_t count, float* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(in + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = 1.0f;  // keeps the loads
}

template <typename F>
float MedianMs(F&& launch) {
  cudaEvent_t start, stop;
  PROBE_CHECK(cudaEventCreate(&start));
  PROBE_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> times;
  for (int i = 0; i < 20; ++i) {
    PROBE_CHECK(cudaEventRecord(start));
    launch();
    PROBE_CHECK(cudaEventRecord(stop));
    PROBE_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  PROBE_CHECK(cudaGetLastError());
  PROBE_CHECK(cudaEventDestroy(start));
  PROBE_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

float ToFloat(const void* data, bool bf16, int64_t i) {
  if (!bf16) return static_cast<const float*>(data)[i];
  uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(data) + 2 * i, 2);
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

struct Launch {
  int cluster_size;
  int slice;
  size_t shared_bytes;
};

// `element`: shared bytes a logit (the logit, and its gradient where that is
// staged apart).
Launch Choose(int64_t vocab, int element) {
  Launch launch{1, 0, 0};
  while (launch.cluster_size < 8 &&
         (vocab * element + launch.cluster_size - 1) / launch.cluster_size >
             kMaxSliceBytes) {
    launch.cluster_size *= 2;
  }
  const int64_t per = (vocab + launch.cluster_size - 1) / launch.cluster_size;
  launch.slice = static_cast<int>((per + 63) / 64 * 64);
  launch.shared_bytes = static_cast<size_t>(launch.slice) * element;
  return launch;
}

template <typename T, typename G, bool kGrad>
cudaError_t Run(const Launch& launch, int64_t tokens, int64_t vocab,
                const void* logits, void* grad, const int64_t* targets,
                float* loss, float* lse) {
  auto kernel = StagedRowKernel<T, G, kGrad>;
  cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(launch.shared_bytes));
  if (error != cudaSuccess) return error;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(tokens * launch.cluster_size));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = launch.shared_bytes;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = launch.cluster_size;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(logits),
                            static_cast<G*>(grad), targets, vocab, launch.slice,
                            1.0f / static_cast<float>(tokens), loss, lse);
}

// The persistent kernel's launch: slices of at most 64 KiB of T, two buffers
// of them (and the gradient's apart), as many clusters as fit at once.
Launch ChoosePersistent(int64_t vocab, int element, int grad_element) {
  Launch launch{1, 0, 0};
  while (launch.cluster_size < 8 &&
         (vocab * element + launch.cluster_size - 1) / launch.cluster_size >
             kMaxSliceBytes) {
    launch.cluster_size *= 2;
  }
  const int64_t per = (vocab + launch.cluster_size - 1) / launch.cluster_size;
  launch.slice = static_cast<int>((per + 63) / 64 * 64);
  launch.shared_bytes =
      static_cast<size_t>(launch.slice) *
      (2 * element + (grad_element != element ? grad_element : 0));
  return launch;
}

template <typename T, typename G, bool kGrad>
cudaError_t RunPersistent(const Launch& launch, int64_t tokens, int64_t vocab,
                          const void* logits, void* grad,
                          const int64_t* targets, float* loss, float* lse) {
  auto kernel = PersistentRowKernel<T, G, kGrad>;
  cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(launch.shared_bytes));
  if (error != cudaSuccess) return error;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kPersistentThreads);
  config.dynamicSmemBytes = launch.shared_bytes;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = launch.cluster_size;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  config.gridDim = dim3(static_cast<unsigned>(tokens * launch.cluster_size));
  int clusters = 0;
  error = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  if (error != cudaSuccess) return error;
  if (clusters <= 0) return cudaErrorInvalidConfiguration;
  const int64_t grid_clusters = std::min<int64_t>(tokens, clusters);
  config.gridDim =
      dim3(static_cast<unsigned>(grid_clusters * launch.cluster_size));
  return cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(logits),
                            static_cast<G*>(grad), targets, tokens, vocab,
                            launch.slice, 1.0f / static_cast<float>(tokens),
                            loss, lse);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 16384;
  std::vector<int64_t> vocabs = {4096,  8192,  16384, 32768,
                                 50304, 65536, 131072};
  if (argc > 2) {
    vocabs.clear();
    std::string list = argv[2];
    for (size_t at = 0; at < list.size();) {
      const size_t comma = list.find(',', at);
      vocabs.push_back(std::atoll(list.substr(at, comma - at).c_str()));
      at = comma == std::string::npos ? list.size() : comma + 1;
    }
  }
  const int64_t max_vocab = *std::max_element(vocabs.begin(), vocabs.end());
  const size_t max_bytes = static_cast<size_t>(tokens * max_vocab * 4);
  void *logits, *grad;
  int64_t* targets;
  float *loss, *lse, *sink;
  PROBE_CHECK(cudaMalloc(&logits, max_bytes));
  PROBE_CHECK(cudaMalloc(&grad, max_bytes));
  PROBE_CHECK(cudaMalloc(&targets, tokens * 8));
  PROBE_CHECK(cudaMalloc(&loss, tokens * 4));
  PROBE_CHECK(cudaMalloc(&lse, tokens * 4));
  PROBE_CHECK(cudaMalloc(&sink, 4));
  cudaDeviceProp prop;
  PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "ce_staged_probe on %s: %lld tokens; mean reduction; us (median of 20), "
      "%% of the copy (one pass, read+write) or read (forward) rate measured "
      "just before; err = max relative error of 16 rows' loss / gradient "
      "against fp64\n",
      prop.name, static_cast<long long>(tokens));
  std::printf(
      "%8s %7s %3s %9s %9s %7s %9s %7s %9s %9s | %9s %7s %9s %7s %9s %9s\n",
      "logits", "vocab", "C", "copy GB/s", "fwd us", "%read", "1pass us",
      "%copy", "loss err", "grad err", "pers fwd", "%read", "pers 1p", "%copy",
      "loss err", "grad err");
  // Modes: f32 logits and gradient, bf16 both, f32 logits with a bf16
  // gradient (the linear cross-entropy's chunks; its copy ceiling moves the
  // same bytes, 4 read and 2 written a logit).
  for (int mode = 0; mode < 3; ++mode) {
    const bool bf16 = mode == 1;
    const int element = bf16 ? 2 : 4;
    const int grad_element = mode == 0 ? 4 : 2;
    const char* name = mode == 0 ? "f32" : mode == 1 ? "bf16" : "f32>bf16";
    for (const int64_t vocab : vocabs) {
      const Launch launch =
          Choose(vocab, mode == 2 ? element + grad_element : element);
      if (vocab % 8 != 0 ||
          static_cast<int64_t>(launch.shared_bytes) > 112 * 1024) {
        std::printf("%8s %7lld: skipped (vocab)\n", name,
                    static_cast<long long>(vocab));
        continue;
      }
      const int64_t count = tokens * vocab;
      const size_t bytes = static_cast<size_t>(count) * element;
      const size_t grad_bytes = static_cast<size_t>(count) * grad_element;
      FillLogits<<<1024, 256>>>(logits, bf16, count, 77 + vocab);
      std::vector<int64_t> host_targets(tokens);
      uint64_t state = 12345 + vocab;
      for (auto& t : host_targets) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        t = static_cast<int64_t>((state >> 33) % vocab);
      }
      PROBE_CHECK(cudaMemcpy(targets, host_targets.data(), tokens * 8,
                             cudaMemcpyHostToDevice));
      // The copy ceiling: read `bytes`, write `grad_bytes` (two copies of
      // half the bytes read where the gradient is half as wide).
      const float copy_ms = MedianMs([&] {
        if (grad_bytes == bytes) {
          PROBE_CHECK(
              cudaMemcpyAsync(grad, logits, bytes, cudaMemcpyDeviceToDevice));
        } else {
          PROBE_CHECK(cudaMemcpyAsync(grad, logits, grad_bytes,
                                      cudaMemcpyDeviceToDevice));
          ReadSum<<<prop.multiProcessorCount * 8, 512>>>(
              reinterpret_cast<const uint4*>(static_cast<char*>(logits) +
                                             grad_bytes),
              (bytes - grad_bytes) / 16, sink);
        }
      });
      const float read_ms = MedianMs([&] {
        ReadSum<<<prop.multiProcessorCount * 8, 512>>>(
            static_cast<const uint4*>(logits), bytes / 16, sink);
      });
      auto run = [&](bool with_grad) {
        cudaError_t error;
        if (mode == 0) {
          error = (with_grad ? Run<float, float, true>
                             : Run<float, float, false>)(launch, tokens, vocab,
                                                         logits, grad, targets,
                                                         loss, lse);
        } else if (mode == 1) {
          error =
              (with_grad
                   ? Run<__nv_bfloat16, __nv_bfloat16, true>
                   : Run<__nv_bfloat16, __nv_bfloat16, false>)(launch, tokens,
                                                               vocab, logits,
                                                               grad, targets,
                                                               loss, lse);
        } else {
          error = (with_grad ? Run<float, __nv_bfloat16, true>
                             : Run<float, __nv_bfloat16, false>)(launch, tokens,
                                                                 vocab, logits,
                                                                 grad, targets,
                                                                 loss, lse);
        }
        PROBE_CHECK(error);
      };
      // 16 rows against fp64: (loss error, gradient error).
      auto check = [&]() {
        PROBE_CHECK(cudaDeviceSynchronize());
        double loss_error = 0, grad_error = 0;
        std::vector<char> row_logits(vocab * element),
            row_grad(vocab * grad_element);
        std::vector<float> host_loss(tokens);
        PROBE_CHECK(cudaMemcpy(host_loss.data(), loss, tokens * 4,
                               cudaMemcpyDeviceToHost));
        for (int k = 0; k < 16; ++k) {
          const int64_t row = (k * 7919) % tokens;
          PROBE_CHECK(
              cudaMemcpy(row_logits.data(),
                         static_cast<char*>(logits) + row * vocab * element,
                         vocab * element, cudaMemcpyDeviceToHost));
          PROBE_CHECK(
              cudaMemcpy(row_grad.data(),
                         static_cast<char*>(grad) + row * vocab * grad_element,
                         vocab * grad_element, cudaMemcpyDeviceToHost));
          double m = -INFINITY, s = 0;
          for (int64_t j = 0; j < vocab; ++j)
            m = std::max(m, double{ToFloat(row_logits.data(), bf16, j)});
          for (int64_t j = 0; j < vocab; ++j)
            s += std::exp(ToFloat(row_logits.data(), bf16, j) - m);
          const double ref_lse = m + std::log(s);
          const int64_t t = host_targets[row];
          const double ref_loss = ref_lse - ToFloat(row_logits.data(), bf16, t);
          loss_error =
              std::max(loss_error, std::abs(host_loss[row] - ref_loss) /
                                       std::max(1e-6, std::abs(ref_loss)));
          const double scale = 1.0 / tokens;
          double num = 0, den = 0;
          for (int64_t j = 0; j < vocab; ++j) {
            const double ref =
                (std::exp(ToFloat(row_logits.data(), bf16, j) - ref_lse) -
                 (j == t ? 1.0 : 0.0)) *
                scale;
            const double got = ToFloat(row_grad.data(), grad_element == 2, j);
            num += (got - ref) * (got - ref);
            den += ref * ref;
          }
          grad_error = std::max(grad_error, std::sqrt(num / den));
        }
        return std::make_pair(loss_error, grad_error);
      };
      const float forward_ms = MedianMs([&] { run(false); });
      PROBE_CHECK(cudaMemset(grad, 0xff, grad_bytes));
      PROBE_CHECK(cudaMemset(loss, 0xff, tokens * 4));
      const float one_pass_ms = MedianMs([&] { run(true); });
      const auto [loss_error, grad_error] = check();
      // The persistent kernel.
      const Launch persistent = ChoosePersistent(vocab, element, grad_element);
      auto run_persistent = [&](bool with_grad) {
        cudaError_t error;
        if (mode == 0) {
          error =
              (with_grad
                   ? RunPersistent<float, float, true>
                   : RunPersistent<float, float, false>)(persistent, tokens,
                                                         vocab, logits, grad,
                                                         targets, loss, lse);
        } else if (mode == 1) {
          error = (with_grad ? RunPersistent<__nv_bfloat16, __nv_bfloat16, true>
                             : RunPersistent<__nv_bfloat16, __nv_bfloat16,
                                             false>)(persistent, tokens, vocab,
                                                     logits, grad, targets,
                                                     loss, lse);
        } else {
          error =
              (with_grad
                   ? RunPersistent<float, __nv_bfloat16, true>
                   : RunPersistent<float, __nv_bfloat16, false>)(persistent,
                                                                 tokens, vocab,
                                                                 logits, grad,
                                                                 targets, loss,
                                                                 lse);
        }
        PROBE_CHECK(error);
      };
      const float p_forward_ms = MedianMs([&] { run_persistent(false); });
      PROBE_CHECK(cudaMemset(grad, 0xff, grad_bytes));
      PROBE_CHECK(cudaMemset(loss, 0xff, tokens * 4));
      const float p_one_pass_ms = MedianMs([&] { run_persistent(true); });
      const auto [p_loss_error, p_grad_error] = check();
      std::printf(
          "%8s %7lld %3d %9.0f %9.1f %7.1f %9.1f %7.1f %9.2e %9.2e | %9.1f "
          "%7.1f %9.1f %7.1f %9.2e %9.2e\n",
          name, static_cast<long long>(vocab), launch.cluster_size,
          (bytes + grad_bytes) / copy_ms * 1e-6, forward_ms * 1e3,
          100.0 * read_ms / forward_ms, one_pass_ms * 1e3,
          100.0 * copy_ms / one_pass_ms, loss_error, grad_error,
          p_forward_ms * 1e3, 100.0 * read_ms / p_forward_ms,
          p_one_pass_ms * 1e3, 100.0 * copy_ms / p_one_pass_ms, p_loss_error,
          p_grad_error);
    }
  }
  return 0;
}
