// Fused causal flash-attention kernels (bf16 in and out, fp32 inside) of the
// attention op: a forward with an online softmax, and a backward made of two
// kernels that recompute the probabilities from the saved lse -- one per key
// block (dK, dV), one per query block (dQ) -- so that no [seq, seq] fp32
// matrix ever exists, every output element has exactly one writer (no
// atomics, the result is deterministic) and d_qkv can be written or added to
// in place. For head dims up to 64, when it fits in 256 MiB, the dK/dV kernel
// also stores dS in bf16 and the dQ kernel only multiplies it by K (about 4%
// faster at GPT-2 small's shape on the H200 than recomputing P and dP).
//
// Every block has 4 warps; each warp owns 16 rows of the block's tile (queries
// in the forward and dQ kernels, keys in the dK/dV kernel). Tiles of Q, K, V
// and dO go to shared memory by cp.async; warps multiply with
// mma.sync.m16n8k16 (bf16 x bf16 -> fp32) fed by ldmatrix. Fragment layouts
// (PTX ISA, "matrix fragments for mma.m16n8k16"), with lane = 4 g + t:
//   A (16 x 16, row-major): 4 registers of 2 bf16 each, the lower column in
//     the low half: a0 = (row g, cols 2t, 2t + 1), a1 = (row g + 8, same),
//     a2 = (row g, cols 2t + 8, 2t + 9), a3 = (row g + 8, same).
//   B (16 x 8, k x n): 2 registers: b0 = (k 2t, 2t + 1; n g),
//     b1 = (k 2t + 8, 2t + 9; n g).
//   C (16 x 8, fp32): 4 floats: c0, c1 = (row g, cols 2t, 2t + 1),
//     c2, c3 = (row g + 8, same).
// So the C fragments of two adjacent 8-column tiles, packed to bf16 pairs, are
// exactly the A fragment of a 16-wide k step: probabilities go from one
// product into the next without leaving registers (FlashAttention-2's trick).
//
// ldmatrix.x4 loads four 8 x 8 b16 matrices; lane i gives the address of row
// i % 8 of matrix i / 8, and register j of every lane receives matrix j's
// elements (row lane / 4, cols 2 (lane % 4), +1) -- of the transpose with
// .trans. The three loaders below place those matrices to match A and B.
//
// Head dims are padded to kD in {32, 64, 96, 128}: the padding columns are
// zero-filled in shared memory, add nothing to any product and are never
// stored. Rows past seq (the tail of the last block) are zero-filled too and
// masked out of every softmax and gradient.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "graph/ops/attention_cuda.h"
#include "runtime/int_math.h"

namespace lossrt {
namespace ops {
namespace attention {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;  // 4 warps of 16 tile rows each
constexpr int kWarpRows = 16;
// Padding of every shared-memory row (bf16 elements = 16 bytes): consecutive
// rows then start in different 16-byte bank groups, so the 8 row addresses of
// an ldmatrix never conflict.
constexpr int kPad = 8;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994531f;

// Kernel arguments (by value).
struct Problem {
  const bf16* qkv;
  bf16* out;
  const bf16* d_out;
  bf16* d_qkv;
  float* lse;
  const float* delta;
  int seq;
  int heads;
  int head_dim;
  int batch_heads;
  int64_t ld_qkv;    // 3C
  int64_t channels;  // C: the row stride of out and d_out
  float scale;       // 1 / sqrt(head_dim)
  float scale_log2;  // scale * log2(e): softmaxes run in base 2 (exp2)
  bool accumulate;
  // When the backward passes dS through memory (DsBytes): bf16 tiles of
  // [kDsTile keys, kDsTile queries] written by the dK/dV kernel and read by
  // FlashBackwardDqFromDsKernel, per (batch, head) one per block pair (key
  // block j, query block i >= j) at DsTileIndex(i, j); null otherwise.
  bf16* ds;
};

// dS tiles: 64 keys x 64 queries, the blocks of both backward kernels.
constexpr int kDsTile = 64;

// A (batch, head)'s dS tiles in the order the dQ kernel reads them: by query
// block i, then key block j <= i.
__host__ __device__ constexpr int64_t DsTileIndex(int i, int j) {
  return static_cast<int64_t>(i) * (i + 1) / 2 + j;
}

// ---------------------------------------------------------------------------
// PTX wrappers.

__device__ __forceinline__ uint32_t SmemAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddress(smem)),
      "l"(gmem)
      : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are in
// flight. A __syncthreads() must follow before other threads' copies are read.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrix(uint32_t (&r)[4], const bf16* row) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(SmemAddress(row)));
}

__device__ __forceinline__ void LdMatrixTrans(uint32_t (&r)[4],
                                              const bf16* row) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, "
      "[%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(SmemAddress(row)));
}

// c (16 x 8) += a (16 x 16) b (16 x 8).
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4],
                                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, `lo` in the low half (the lower column).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// ---------------------------------------------------------------------------
// Tiles and fragments.

// Rows [row0, row0 + kRows) of a bf16 matrix with row stride `ld` (columns
// [0, kD)) into the shared tile [kRows, kD + kPad], 16 bytes per cp.async.
// Rows >= seq and columns >= head_dim become zeros.
template <int kRows, int kD>
__device__ __forceinline__ void LoadTile(bf16* tile, const bf16* src,
                                         int64_t ld, int row0, int seq,
                                         int head_dim) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = (c % kChunks) * 8;
    bf16* dst = tile + r * (kD + kPad) + col;
    if (row0 + r < seq && col < head_dim) {
      CpAsync16(dst, src + static_cast<int64_t>(row0 + r) * ld + col);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

// The A fragment of rows [0, 16) and columns [col0, col0 + 16) of `tile`
// (row-major, row stride kStride). Matrices 0..3 = (rows 0-7, cols 0-7),
// (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) =
// a0..a3.
template <int kStride>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const bf16* tile,
                                      int col0, int lane) {
  LdMatrix(a, tile + (lane % 16) * kStride + col0 + (lane / 16) * 8);
}

// B fragments of two 8-wide n tiles where B[k][n] = tile[n][k] (the tile's
// rows are the n index, as K's rows in Q K^T): n in [row0, row0 + 16), k in
// [col0, col0 + 16). b[0], b[1] serve n tile row0.., b[2], b[3] n tile
// row0 + 8... Matrix m covers rows row0 + 8 (m / 2).., cols col0 + 8 (m % 2)..;
// its un-transposed fragment (row g = n, cols 2t = k) is what B wants.
template <int kStride>
__device__ __forceinline__ void LoadBFromRows(uint32_t (&b)[4],
                                              const bf16* tile, int row0,
                                              int col0, int lane) {
  const int matrix = lane / 8;
  LdMatrix(b, tile + (row0 + lane % 8 + (matrix / 2) * 8) * kStride + col0 +
                  (matrix % 2) * 8);
}

// B fragments of two 8-wide n tiles where B[k][n] = tile[k][n] (the tile's
// rows are the k index, as V's rows in P V): k in [row0, row0 + 16), n in
// [col0, col0 + 16). b[0], b[1] serve n tile col0.., b[2], b[3] n tile
// col0 + 8... Matrix m covers rows row0 + 8 (m % 2).., cols col0 + 8 (m / 2)..;
// transposed, lane (g, t) gets tile[k 2t, 2t+1][n g] as B wants.
template <int kStride>
__device__ __forceinline__ void LoadBFromCols(uint32_t (&b)[4],
                                              const bf16* tile, int row0,
                                              int col0, int lane) {
  const int matrix = lane / 8;
  LdMatrixTrans(b, tile + (row0 + lane % 8 + (matrix % 2) * 8) * kStride +
                       col0 + (matrix / 2) * 8);
}

template <int kTiles>
__device__ __forceinline__ void Zero(float (&acc)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
  }
}

// acc (16 x kN) += A (16 x kK) B^T: A from registers (a[kK / 16]), B^T's rows
// from `tile` ([kN rows, >= kK cols]): acc[r][n] += sum_k A[r][k] tile[n][k].
template <int kK, int kN, int kStride>
__device__ __forceinline__ void MmaRegTimesRowsT(
    float (&acc)[kN / 8][4], const uint32_t (&a)[kK / 16][4], const bf16* tile,
    int lane) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      LoadBFromRows<kStride>(b, tile, np * 16, kk * 16, lane);
      Mma(acc[2 * np], a[kk], b[0], b[1]);
      Mma(acc[2 * np + 1], a[kk], b[2], b[3]);
    }
  }
}

// As MmaRegTimesRowsT with A's 16 rows read from shared memory (`a_tile`,
// rows [0, 16)) one k step at a time.
template <int kK, int kN, int kStride>
__device__ __forceinline__ void MmaSmemTimesRowsT(float (&acc)[kN / 8][4],
                                                  const bf16* a_tile,
                                                  const bf16* tile, int lane) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[4];
    LoadA<kStride>(a, a_tile, kk * 16, lane);
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      LoadBFromRows<kStride>(b, tile, np * 16, kk * 16, lane);
      Mma(acc[2 * np], a, b[0], b[1]);
      Mma(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x kN) += P (16 x kK) B, P given as C fragments p[kK / 8] (fp32,
// rounded to bf16 here) and B = tile[k][n] ([kK rows, >= kN cols]).
template <int kK, int kN, int kStride>
__device__ __forceinline__ void MmaAccTimesCols(float (&acc)[kN / 8][4],
                                                const float (&p)[kK / 8][4],
                                                const bf16* tile, int lane) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    // C fragments 2 kk (k columns 0-7) and 2 kk + 1 (8-15) -> A fragment.
    const uint32_t a[4] = {PackBf16(p[2 * kk][0], p[2 * kk][1]),
                           PackBf16(p[2 * kk][2], p[2 * kk][3]),
                           PackBf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           PackBf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t b[4];
      LoadBFromCols<kStride>(b, tile, kk * 16, np * 16, lane);
      Mma(acc[2 * np], a, b[0], b[1]);
      Mma(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// dst[0], dst[1] = v0, v1 (or += with accumulate), in bf16.
__device__ __forceinline__ void StorePair(bf16* dst, float v0, float v1,
                                          bool accumulate) {
  __nv_bfloat162* pair = reinterpret_cast<__nv_bfloat162*>(dst);
  if (accumulate) {
    const __nv_bfloat162 old = *pair;
    v0 += __low2float(old);
    v1 += __high2float(old);
  }
  *pair = __floats2bfloat162_rn(v0, v1);
}

// Writes the 16 x kD fragment rows this lane holds (rows row0 + g and
// row0 + g + 8 of a [seq, ld] matrix at `dst`) times `scale`, skipping rows
// >= seq and padding columns.
template <int kD>
__device__ __forceinline__ void StoreRows(bf16* dst, int64_t ld, int row0,
                                          int seq, int head_dim,
                                          const float (&acc)[kD / 8][4],
                                          float scale, bool accumulate,
                                          int lane) {
  const int g = lane / 4;
  const int t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= seq) continue;
    bf16* row_dst = dst + static_cast<int64_t>(row) * ld;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col < head_dim) {
        StorePair(row_dst + col, acc[dt][2 * r] * scale,
                  acc[dt][2 * r + 1] * scale, accumulate);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Forward: one block per (64-query block, batch, head), over the key blocks up
// to the diagonal; online softmax in base 2 with per-row running max and sum.

constexpr int kFwdBlockQ = 64;
constexpr int kFwdBlockK = 64;

template <int kD>
constexpr int ForwardSmemBytes() {
  return (kFwdBlockQ + 2 * kFwdBlockK) * (kD + kPad) *
         static_cast<int>(sizeof(bf16));
}

template <int kD>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(const Problem p) {
  constexpr int kStride = kD + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem);  // [kFwdBlockQ, kStride]
  bf16* k_tile = q_tile + kFwdBlockQ * kStride;  // [kFwdBlockK, kStride]
  bf16* v_tile = k_tile + kFwdBlockK * kStride;  // [kFwdBlockK, kStride]

  // The last query blocks see the most keys: they are scheduled first.
  const int num_q_blocks = CeilDiv(p.seq, kFwdBlockQ);
  const int q_block =
      num_q_blocks - 1 - static_cast<int>(blockIdx.x) / p.batch_heads;
  const int bh = static_cast<int>(blockIdx.x) % p.batch_heads;
  const int b = bh / p.heads;
  const int h = bh % p.heads;
  const int q0 = q_block * kFwdBlockQ;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const bf16* q_src = p.qkv + static_cast<int64_t>(b) * p.seq * p.ld_qkv +
                      static_cast<int64_t>(h) * p.head_dim;
  const bf16* k_src = q_src + p.channels;
  const bf16* v_src = q_src + 2 * p.channels;
  // Key blocks up to the one holding the block's last query.
  const int num_k_blocks =
      min(CeilDiv(p.seq, kFwdBlockK), (q0 + kFwdBlockQ - 1) / kFwdBlockK + 1);

  LoadTile<kFwdBlockQ, kD>(q_tile, q_src, p.ld_qkv, q0, p.seq, p.head_dim);
  CpAsyncCommit();
  LoadTile<kFwdBlockK, kD>(k_tile, k_src, p.ld_qkv, 0, p.seq, p.head_dim);
  CpAsyncCommit();
  CpAsyncWait<1>();  // Q has landed (K_0 may be in flight)
  __syncthreads();
  uint32_t q_frag[kD / 16][4];  // this warp's 16 queries, all of the head dim
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    LoadA<kStride>(q_frag[kk], q_tile + warp * kWarpRows * kStride, kk * 16,
                   lane);
  }

  float o[kD / 8][4];
  Zero(o);
  // Rows g and g + 8 of the warp: running max (base-2 scaled scores) and this
  // lane's share of the running sum (its 4 lanes are summed at the end; every
  // rescale is by the same factor for all 4, so the shares stay consistent).
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  for (int j = 0; j < num_k_blocks; ++j) {
    const int k0 = j * kFwdBlockK;
    // V_j streams in while the scores are computed.
    LoadTile<kFwdBlockK, kD>(v_tile, v_src, p.ld_qkv, k0, p.seq, p.head_dim);
    CpAsyncCommit();
    CpAsyncWait<1>();  // K_j has landed (V_j may be in flight)
    __syncthreads();

    float s[kFwdBlockK / 8][4];
    Zero(s);
    MmaRegTimesRowsT<kD, kFwdBlockK, kStride>(s, q_frag, k_tile, lane);

    // Scale to base 2; mask keys past the query (and past seq) with -inf.
    // Only blocks reaching the diagonal or the end need the test.
    const bool masked = k0 + kFwdBlockK - 1 > q0 || k0 + kFwdBlockK > p.seq;
#pragma unroll
    for (int nt = 0; nt < kFwdBlockK / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * p.scale_log2;
        if (masked) {
          const int key = k0 + nt * 8 + 2 * t + (e & 1);
          const int query = q0 + warp * kWarpRows + g + 8 * (e >> 1);
          if (key > query || key >= p.seq) x = -INFINITY;
        }
        s[nt][e] = x;
      }
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int nt = 0; nt < kFwdBlockK / 8; ++nt) {
        m = fmaxf(m, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      }
      // The 4 lanes of a quad hold the same row.
      m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 1));
      m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 2));
      // m is finite: key 0 is visible to every query and lies in block 0. On
      // block 0 row_max is -inf and alpha = 0.
      const float alpha = exp2f(row_max[r] - m);
      row_max[r] = m;
      row_sum[r] *= alpha;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
#pragma unroll
      for (int nt = 0; nt < kFwdBlockK / 8; ++nt) {
        s[nt][2 * r] = exp2f(s[nt][2 * r] - m);  // masked: exp2(-inf) = 0
        s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - m);
        row_sum[r] += s[nt][2 * r] + s[nt][2 * r + 1];
      }
    }

    CpAsyncWait<0>();  // V_j has landed
    __syncthreads();   // ... for every thread, and every warp is done with K_j
    if (j + 1 < num_k_blocks) {
      LoadTile<kFwdBlockK, kD>(k_tile, k_src, p.ld_qkv, k0 + kFwdBlockK, p.seq,
                               p.head_dim);
      CpAsyncCommit();  // K_{j+1} streams in during P V
    }
    MmaAccTimesCols<kFwdBlockK, kD, kStride>(o, s, v_tile, lane);
    __syncthreads();  // every warp is done with V_j before it is overwritten
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(kFullMask, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(kFullMask, row_sum[r], 2);
  }
  const int row0 = q0 + warp * kWarpRows;
  bf16* out = p.out + static_cast<int64_t>(b) * p.seq * p.channels +
              static_cast<int64_t>(h) * p.head_dim;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = row0 + g + 8 * r;
    if (query >= p.seq) continue;
    const float inv = 1.0f / row_sum[r];
    bf16* row_out = out + static_cast<int64_t>(query) * p.channels;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col < p.head_dim) {
        StorePair(row_out + col, o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv,
                  /*accumulate=*/false);
      }
    }
    // ln(sum_k e^{score_k}) = ln 2 * (max2 + log2(sum_k 2^{score2_k - max2})).
    if (t == 0) {
      p.lse[static_cast<int64_t>(bh) * p.seq + query] =
          (row_max[r] + log2f(row_sum[r])) * kLn2;
    }
  }
}

// ---------------------------------------------------------------------------
// Backward, dQ: one block per (64-query block, batch, head) over the key
// blocks up to the diagonal: P = exp(S - lse), dP = dO V^T,
// dS = P (dP - delta), dQ += dS K; dQ * scale is stored at the end. K and V
// tiles are double-buffered: block j + 1 streams in while block j is used.

constexpr int kDqBlockQ = 64;

template <int kD, int kBlockK>
constexpr int DqSmemBytes() {
  return (2 * kDqBlockQ + 4 * kBlockK) * (kD + kPad) *
         static_cast<int>(sizeof(bf16));
}

template <int kD, int kBlockK>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardDqKernel(const Problem p) {
  constexpr int kStride = kD + kPad;
  constexpr int kKvTile = kBlockK * kStride;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem);   // [kDqBlockQ, kStride]
  bf16* do_tile = q_tile + kDqBlockQ * kStride;   // [kDqBlockQ, kStride]
  bf16* k_tiles = do_tile + kDqBlockQ * kStride;  // [2][kBlockK, kStride]
  bf16* v_tiles = k_tiles + 2 * kKvTile;          // [2][kBlockK, kStride]

  const int num_q_blocks = CeilDiv(p.seq, kDqBlockQ);
  const int q_block =
      num_q_blocks - 1 - static_cast<int>(blockIdx.x) / p.batch_heads;
  const int bh = static_cast<int>(blockIdx.x) % p.batch_heads;
  const int b = bh / p.heads;
  const int h = bh % p.heads;
  const int q0 = q_block * kDqBlockQ;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const bf16* q_src = p.qkv + static_cast<int64_t>(b) * p.seq * p.ld_qkv +
                      static_cast<int64_t>(h) * p.head_dim;
  const bf16* k_src = q_src + p.channels;
  const bf16* v_src = q_src + 2 * p.channels;
  const bf16* do_src = p.d_out + static_cast<int64_t>(b) * p.seq * p.channels +
                       static_cast<int64_t>(h) * p.head_dim;
  const int num_k_blocks =
      min(CeilDiv(p.seq, kBlockK), (q0 + kDqBlockQ - 1) / kBlockK + 1);

  LoadTile<kDqBlockQ, kD>(q_tile, q_src, p.ld_qkv, q0, p.seq, p.head_dim);
  LoadTile<kDqBlockQ, kD>(do_tile, do_src, p.channels, q0, p.seq, p.head_dim);
  CpAsyncCommit();
  LoadTile<kBlockK, kD>(k_tiles, k_src, p.ld_qkv, 0, p.seq, p.head_dim);
  LoadTile<kBlockK, kD>(v_tiles, v_src, p.ld_qkv, 0, p.seq, p.head_dim);
  CpAsyncCommit();

  // This lane's rows (g and g + 8 of the warp): base-2 lse and delta; 0 past
  // seq (those rows are masked).
  const int row0 = q0 + warp * kWarpRows;
  float lse2[2];
  float delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = row0 + g + 8 * r;
    const int64_t at = static_cast<int64_t>(bh) * p.seq + query;
    lse2[r] = query < p.seq ? p.lse[at] * kLog2e : 0.0f;
    delta[r] = query < p.seq ? p.delta[at] : 0.0f;
  }

  CpAsyncWait<1>();  // Q and dO have landed (K_0, V_0 may be in flight)
  __syncthreads();
  uint32_t q_frag[kD / 16][4];
  uint32_t do_frag[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    LoadA<kStride>(q_frag[kk], q_tile + warp * kWarpRows * kStride, kk * 16,
                   lane);
    LoadA<kStride>(do_frag[kk], do_tile + warp * kWarpRows * kStride, kk * 16,
                   lane);
  }

  float dq[kD / 8][4];
  Zero(dq);
  for (int j = 0; j < num_k_blocks; ++j) {
    const int k0 = j * kBlockK;
    const bf16* k_tile = k_tiles + (j % 2) * kKvTile;
    const bf16* v_tile = v_tiles + (j % 2) * kKvTile;
    if (j + 1 < num_k_blocks) {
      // The other buffer was last read in iteration j - 1, which ended with a
      // barrier.
      LoadTile<kBlockK, kD>(k_tiles + ((j + 1) % 2) * kKvTile, k_src, p.ld_qkv,
                            k0 + kBlockK, p.seq, p.head_dim);
      LoadTile<kBlockK, kD>(v_tiles + ((j + 1) % 2) * kKvTile, v_src, p.ld_qkv,
                            k0 + kBlockK, p.seq, p.head_dim);
      CpAsyncCommit();
      CpAsyncWait<1>();  // K_j and V_j have landed (block j + 1 in flight)
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();

    // P = 2^(S scale log2(e) - lse log2(e)), 0 where masked.
    float s[kBlockK / 8][4];
    Zero(s);
    MmaRegTimesRowsT<kD, kBlockK, kStride>(s, q_frag, k_tile, lane);
    const bool masked =
        k0 + kBlockK - 1 > q0 || k0 + kBlockK > p.seq || q0 + kDqBlockQ > p.seq;
#pragma unroll
    for (int nt = 0; nt < kBlockK / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float prob = exp2f(s[nt][e] * p.scale_log2 - lse2[e >> 1]);
        if (masked) {
          const int key = k0 + nt * 8 + 2 * t + (e & 1);
          const int query = row0 + g + 8 * (e >> 1);
          if (key > query || key >= p.seq || query >= p.seq) prob = 0.0f;
        }
        s[nt][e] = prob;
      }
    }

    float dp[kBlockK / 8][4];
    Zero(dp);
    MmaRegTimesRowsT<kD, kBlockK, kStride>(dp, do_frag, v_tile, lane);
#pragma unroll
    for (int nt = 0; nt < kBlockK / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] *= dp[nt][e] - delta[e >> 1];  // dS
      }
    }
    MmaAccTimesCols<kBlockK, kD, kStride>(dq, s, k_tile, lane);
    __syncthreads();  // every warp is done with K_j and V_j
  }

  StoreRows<kD>(p.d_qkv + static_cast<int64_t>(b) * p.seq * p.ld_qkv +
                    static_cast<int64_t>(h) * p.head_dim,
                p.ld_qkv, row0, p.seq, p.head_dim, dq, p.scale, p.accumulate,
                lane);
}

// ---------------------------------------------------------------------------
// Backward, dK and dV: one block per (64-key block, batch, head) over the
// query blocks from the diagonal on, in the transposed orientation (each warp
// owns 16 keys): P^T = exp(K Q^T scale - lse), dV += P^T dO,
// dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q. Q, dO, lse and
// delta of the query blocks are double-buffered.

constexpr int kDkvBlockK = 64;

template <int kD, int kBlockQ>
constexpr int DkvSmemBytes() {
  return (2 * kDkvBlockK + 4 * kBlockQ) * (kD + kPad) *
             static_cast<int>(sizeof(bf16)) +
         4 * kBlockQ * static_cast<int>(sizeof(float));
}

// Query block i's Q and dO tiles (cp.async, not committed) and its base-2 lse
// and delta (plain stores; 0 past seq) into one of the two buffers.
template <int kD, int kBlockQ>
__device__ __forceinline__ void LoadQueryBlock(
    const Problem& p, const bf16* q_src, const bf16* do_src, int bh, int q0,
    bf16* q_tile, bf16* do_tile, float* lse2, float* delta) {
  LoadTile<kBlockQ, kD>(q_tile, q_src, p.ld_qkv, q0, p.seq, p.head_dim);
  LoadTile<kBlockQ, kD>(do_tile, do_src, p.channels, q0, p.seq, p.head_dim);
  for (int c = threadIdx.x; c < kBlockQ; c += kThreads) {
    const int query = q0 + c;
    const int64_t at = static_cast<int64_t>(bh) * p.seq + query;
    lse2[c] = query < p.seq ? p.lse[at] * kLog2e : 0.0f;
    delta[c] = query < p.seq ? p.delta[at] : 0.0f;
  }
}

// kStoreDs (kBlockQ == kDsTile): dS^T also goes to p.ds, for the dQ kernel
// to read instead of recomputing P and dP. Its registers are capped for three
// blocks an SM (a few spill): on the H200 that beat two blocks with every
// register it wanted (bench/RESULTS.md, What was tried and dropped).
template <int kD, int kBlockQ, bool kStoreDs>
__global__ void __launch_bounds__(kThreads, kStoreDs ? 3 : 1)
    FlashBackwardDkDvKernel(const Problem p) {
  static_assert(!kStoreDs || (kBlockQ == kDsTile && kDkvBlockK == kDsTile),
                "dS tiles are one key block by one query block");
  constexpr int kStride = kD + kPad;
  constexpr int kQTile = kBlockQ * kStride;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* k_tile = reinterpret_cast<bf16*>(smem);   // [kDkvBlockK, kStride]
  bf16* v_tile = k_tile + kDkvBlockK * kStride;   // [kDkvBlockK, kStride]
  bf16* q_tiles = v_tile + kDkvBlockK * kStride;  // [2][kBlockQ, kStride]
  bf16* do_tiles = q_tiles + 2 * kQTile;          // [2][kBlockQ, kStride]
  float* lse2_tiles = reinterpret_cast<float*>(do_tiles + 2 * kQTile);
  float* delta_tiles = lse2_tiles + 2 * kBlockQ;  // [2][kBlockQ] each

  // The first key blocks see the most queries: they are scheduled first.
  const int k_block = static_cast<int>(blockIdx.x) / p.batch_heads;
  const int bh = static_cast<int>(blockIdx.x) % p.batch_heads;
  const int b = bh / p.heads;
  const int h = bh % p.heads;
  const int k0 = k_block * kDkvBlockK;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const bf16* q_src = p.qkv + static_cast<int64_t>(b) * p.seq * p.ld_qkv +
                      static_cast<int64_t>(h) * p.head_dim;
  const bf16* k_src = q_src + p.channels;
  const bf16* v_src = q_src + 2 * p.channels;
  const bf16* do_src = p.d_out + static_cast<int64_t>(b) * p.seq * p.channels +
                       static_cast<int64_t>(h) * p.head_dim;

  // Query blocks from the one holding key k0 (kDkvBlockK is a multiple of
  // kBlockQ, so it starts at k0) to the end.
  const int first_q_block = k0 / kBlockQ;
  const int num_q_blocks = CeilDiv(p.seq, kBlockQ);

  LoadTile<kDkvBlockK, kD>(k_tile, k_src, p.ld_qkv, k0, p.seq, p.head_dim);
  LoadTile<kDkvBlockK, kD>(v_tile, v_src, p.ld_qkv, k0, p.seq, p.head_dim);
  CpAsyncCommit();
  LoadQueryBlock<kD, kBlockQ>(p, q_src, do_src, bh, k0, q_tiles, do_tiles,
                              lse2_tiles, delta_tiles);
  CpAsyncCommit();

  const bf16* k_warp = k_tile + warp * kWarpRows * kStride;
  const bf16* v_warp = v_tile + warp * kWarpRows * kStride;
  const int key_row0 = k0 + warp * kWarpRows;  // this warp's first key
  float dk[kD / 8][4];
  float dv[kD / 8][4];
  Zero(dk);
  Zero(dv);

  for (int i = first_q_block; i < num_q_blocks; ++i) {
    const int q0 = i * kBlockQ;
    const int buffer = (i - first_q_block) % 2;
    const bf16* q_tile = q_tiles + buffer * kQTile;
    const bf16* do_tile = do_tiles + buffer * kQTile;
    const float* lse2_tile = lse2_tiles + buffer * kBlockQ;
    const float* delta_tile = delta_tiles + buffer * kBlockQ;
    if (i + 1 < num_q_blocks) {
      // The other buffer was last read in iteration i - 1, which ended with a
      // barrier.
      const int other = 1 - buffer;
      LoadQueryBlock<kD, kBlockQ>(
          p, q_src, do_src, bh, q0 + kBlockQ, q_tiles + other * kQTile,
          do_tiles + other * kQTile, lse2_tiles + other * kBlockQ,
          delta_tiles + other * kBlockQ);
      CpAsyncCommit();
      CpAsyncWait<1>();  // K, V and block i have landed (i + 1 in flight)
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();

    // P^T (16 keys x kBlockQ queries per warp).
    float s[kBlockQ / 8][4];
    Zero(s);
    MmaSmemTimesRowsT<kD, kBlockQ, kStride>(s, k_warp, q_tile, lane);
    const bool masked = q0 < k0 + kDkvBlockK || q0 + kBlockQ > p.seq;
#pragma unroll
    for (int nt = 0; nt < kBlockQ / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t + (e & 1);  // query within the block
        float prob = exp2f(s[nt][e] * p.scale_log2 - lse2_tile[col]);
        if (masked) {
          const int key = key_row0 + g + 8 * (e >> 1);
          const int query = q0 + col;
          if (query < key || query >= p.seq) prob = 0.0f;
        }
        s[nt][e] = prob;
      }
    }
    MmaAccTimesCols<kBlockQ, kD, kStride>(dv, s, do_tile, lane);

    // dS^T = P^T (dP^T - delta) with dP^T = V dO^T.
    float dp[kBlockQ / 8][4];
    Zero(dp);
    MmaSmemTimesRowsT<kD, kBlockQ, kStride>(dp, v_warp, do_tile, lane);
#pragma unroll
    for (int nt = 0; nt < kBlockQ / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] *= dp[nt][e] - delta_tile[nt * 8 + 2 * t + (e & 1)];
      }
    }
    if constexpr (kStoreDs) {
      // This warp's rows of the tile (keys g, g + 8), rounded to bf16 as the
      // dK product rounds them; 4-byte stores that fill whole sectors two
      // column tiles at a time.
      const int64_t pairs = DsTileIndex(num_q_blocks, 0);
      bf16* ds = p.ds +
                 (bh * pairs + DsTileIndex(i, k_block)) * kDsTile * kDsTile +
                 warp * kWarpRows * kDsTile;
#pragma unroll
      for (int nt = 0; nt < kBlockQ / 8; ++nt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          *reinterpret_cast<uint32_t*>(ds + (g + 8 * r) * kDsTile + nt * 8 +
                                       2 * t) =
              PackBf16(s[nt][2 * r], s[nt][2 * r + 1]);
        }
      }
    }
    MmaAccTimesCols<kBlockQ, kD, kStride>(dk, s, q_tile, lane);
    __syncthreads();  // every warp is done with block i's buffer
  }

  bf16* dst = p.d_qkv + static_cast<int64_t>(b) * p.seq * p.ld_qkv +
              static_cast<int64_t>(h) * p.head_dim;
  StoreRows<kD>(dst + p.channels, p.ld_qkv, key_row0, p.seq, p.head_dim, dk,
                p.scale, p.accumulate, lane);
  StoreRows<kD>(dst + 2 * p.channels, p.ld_qkv, key_row0, p.seq, p.head_dim, dv,
                1.0f, p.accumulate, lane);
}

// ---------------------------------------------------------------------------
// Backward, dQ from the stored dS (head dims up to 64): one block per
// (64-query block i, batch, head), dQ_i = sum over key blocks j <= i of
// dS_ij K_j, in order of j: one product per key block instead of the three
// (and the exponentials) of recomputing P and dP. dS and K tiles are
// double-buffered.

template <int kD>
constexpr int DqFromDsSmemBytes() {
  return 2 * kDsTile * ((kDsTile + kPad) + (kD + kPad)) *
         static_cast<int>(sizeof(bf16));
}

// acc (this warp's 16 queries x kD) += dS K_j: A = dS[queries 16 warp..,
// keys] read transposed from `ds_tile` ([key][query], row stride kDsTile +
// kPad; matrix m holds queries + 8 (m % 2), keys + 8 (m / 2)), B = the key
// tile ([key][d]).
template <int kD>
__device__ __forceinline__ void MmaDsTimesK(float (&acc)[kD / 8][4],
                                            const bf16* ds_tile,
                                            const bf16* k_tile, int warp,
                                            int lane) {
  constexpr int kDsStride = kDsTile + kPad;
  const int m = lane / 8;
#pragma unroll
  for (int kk = 0; kk < kDsTile / 16; ++kk) {
    uint32_t a[4];
    LdMatrixTrans(a, ds_tile + (kk * 16 + (m / 2) * 8 + lane % 8) * kDsStride +
                         warp * kWarpRows + (m % 2) * 8);
#pragma unroll
    for (int np = 0; np < kD / 16; ++np) {
      uint32_t b[4];
      LoadBFromCols<kD + kPad>(b, k_tile, kk * 16, np * 16, lane);
      Mma(acc[2 * np], a, b[0], b[1]);
      Mma(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

template <int kD>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardDqFromDsKernel(const Problem p) {
  constexpr int kStride = kD + kPad;
  constexpr int kDsStride = kDsTile + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ds_tiles = reinterpret_cast<bf16*>(smem);  // [2][kDsTile, kDsStride]
  bf16* k_tiles = ds_tiles + 2 * kDsTile * kDsStride;  // [2][kDsTile, kStride]

  // The last query blocks have the most key blocks: they are scheduled first.
  const int num_q_blocks = CeilDiv(p.seq, kDsTile);
  const int q_block =
      num_q_blocks - 1 - static_cast<int>(blockIdx.x) / p.batch_heads;
  const int bh = static_cast<int>(blockIdx.x) % p.batch_heads;
  const int b = bh / p.heads;
  const int h = bh % p.heads;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t head_at = static_cast<int64_t>(b) * p.seq * p.ld_qkv +
                          static_cast<int64_t>(h) * p.head_dim;
  bf16* q_dst = p.d_qkv + head_at;
  const bf16* k_src = p.qkv + head_at + p.channels;
  // This query block's tiles, key block 0 on, are contiguous.
  const bf16* ds_src =
      p.ds + (bh * DsTileIndex(num_q_blocks, 0) + DsTileIndex(q_block, 0)) *
                 kDsTile * kDsTile;
  // Tile j of dS (64 rows of 128 bytes) and K_j into buffer j % 2.
  auto load = [&](int j) {
    const bf16* src = ds_src + static_cast<int64_t>(j) * kDsTile * kDsTile;
    bf16* dst = ds_tiles + (j % 2) * kDsTile * kDsStride;
    constexpr int kChunks = kDsTile / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < kDsTile * kChunks; c += kThreads) {
      const int r = c / kChunks;
      const int col = (c % kChunks) * 8;
      CpAsync16(dst + r * kDsStride + col, src + r * kDsTile + col);
    }
    LoadTile<kDsTile, kD>(k_tiles + (j % 2) * kDsTile * kStride, k_src,
                          p.ld_qkv, j * kDsTile, p.seq, p.head_dim);
    CpAsyncCommit();
  };

  float dq[kD / 8][4];
  Zero(dq);
  load(0);
  for (int j = 0; j <= q_block; ++j) {
    if (j < q_block) {
      // The other buffer was last read in iteration j - 1, which ended with a
      // barrier.
      load(j + 1);
      CpAsyncWait<1>();  // tile j has landed (j + 1 in flight)
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    MmaDsTimesK<kD>(dq, ds_tiles + (j % 2) * kDsTile * kDsStride,
                    k_tiles + (j % 2) * kDsTile * kStride, warp, lane);
    __syncthreads();  // every warp is done with buffer j % 2
  }
  StoreRows<kD>(q_dst, p.ld_qkv, q_block * kDsTile + warp * kWarpRows, p.seq,
                p.head_dim, dq, p.scale, p.accumulate, lane);
}

// ---------------------------------------------------------------------------
// Launchers.

Problem MakeProblem(const FlashArgs& args) {
  Problem p;
  p.qkv = static_cast<const bf16*>(args.qkv);
  p.out = static_cast<bf16*>(args.out);
  p.d_out = static_cast<const bf16*>(args.d_out);
  p.d_qkv = static_cast<bf16*>(args.d_qkv);
  p.lse = args.lse;
  p.delta = args.delta;
  p.seq = static_cast<int>(args.seq);
  p.heads = static_cast<int>(args.heads);
  p.head_dim = static_cast<int>(args.head_dim);
  p.batch_heads = static_cast<int>(args.batch * args.heads);
  p.channels = args.heads * args.head_dim;
  p.ld_qkv = 3 * p.channels;
  p.scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(args.head_dim)));
  p.scale_log2 = static_cast<float>(
      1.0 / std::sqrt(static_cast<double>(args.head_dim)) * 1.4426950408889634);
  p.accumulate = args.accumulate;
  p.ds = nullptr;
  return p;
}

bool ValidShape(const FlashArgs& args) {
  if (args.batch < 1 || args.seq < 1 || args.heads < 1) return false;
  if (args.head_dim < 8 || args.head_dim % 8 != 0 ||
      args.head_dim > kMaxGpuHeadDim) {
    return false;
  }
  // Grid sizes (blocks of 32 rows at the smallest) and indices fit an int.
  const int64_t blocks = (args.seq + 31) / 32 * args.batch * args.heads;
  return args.seq <= INT_MAX && blocks <= INT_MAX;
}

int PaddedHeadDim(int64_t head_dim) {
  return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 96 ? 96 : 128;
}

// dS bytes of one (batch, head): a bf16 tile per (key block, query block)
// pair of the causal triangle.
int64_t DsBytesPerHead(int64_t seq) {
  const int64_t blocks = CeilDiv<int64_t>(seq, kDsTile);
  return DsTileIndex(static_cast<int>(blocks), 0) * kDsTile * kDsTile *
         static_cast<int64_t>(sizeof(bf16));
}

// The backward passes dS through memory (FlashBackwardDqFromDsKernel) for head
// dims up to 64 when all of it fits in this; otherwise (wider heads: registers;
// long sequences: memory) the dQ kernel recomputes it.
constexpr int64_t kMaxDsBytes = int64_t{256} << 20;

int64_t DsBytes(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  if (PaddedHeadDim(head_dim) > 64) return 0;
  const int64_t bytes = batch * heads * DsBytesPerHead(seq);
  return bytes <= kMaxDsBytes ? bytes : 0;
}

template <typename Kernel>
cudaError_t Launch(Kernel kernel, int smem_bytes, int64_t blocks,
                   const Problem& p, cudaStream_t stream) {
  // Above 48 KiB dynamic shared memory must be opted into; the carveout
  // preference lets several blocks share an SM.
  cudaError_t error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (error != cudaSuccess) return error;
  error = cudaFuncSetAttribute(kernel,
                               cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  if (error != cudaSuccess) return error;
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

template <int kD>
cudaError_t ForwardFor(const Problem& p, cudaStream_t stream) {
  const int64_t blocks =
      static_cast<int64_t>(CeilDiv(p.seq, kFwdBlockQ)) * p.batch_heads;
  return Launch(FlashForwardKernel<kD>, ForwardSmemBytes<kD>(), blocks, p,
                stream);
}

template <int kD>
cudaError_t BackwardFor(const Problem& p, cudaStream_t stream) {
  const int64_t key_blocks =
      static_cast<int64_t>(CeilDiv(p.seq, kDkvBlockK)) * p.batch_heads;
  if (p.ds != nullptr) {
    if constexpr (kD <= 64) {
      // dK, dV and dS, then dQ from dS.
      const cudaError_t error =
          Launch(FlashBackwardDkDvKernel<kD, kDsTile, true>,
                 DkvSmemBytes<kD, kDsTile>(), key_blocks, p, stream);
      if (error != cudaSuccess) return error;
      return Launch(FlashBackwardDqFromDsKernel<kD>, DqFromDsSmemBytes<kD>(),
                    key_blocks, p, stream);
    }
    return cudaErrorInvalidValue;
  }
  // Wide heads take half-height blocks on the inner loop, to keep the fp32
  // accumulators and fragments within the register file.
  constexpr int kInner = kD <= 64 ? 64 : 32;
  const cudaError_t error =
      Launch(FlashBackwardDkDvKernel<kD, kInner, false>,
             DkvSmemBytes<kD, kInner>(), key_blocks, p, stream);
  if (error != cudaSuccess) return error;
  const int64_t query_blocks =
      static_cast<int64_t>(CeilDiv(p.seq, kDqBlockQ)) * p.batch_heads;
  return Launch(FlashBackwardDqKernel<kD, kInner>, DqSmemBytes<kD, kInner>(),
                query_blocks, p, stream);
}

}  // namespace

cudaError_t LaunchFlashForward(const FlashArgs& args, cudaStream_t stream) {
  if (!ValidShape(args)) return cudaErrorInvalidValue;
  const Problem p = MakeProblem(args);
  switch (PaddedHeadDim(args.head_dim)) {
    case 32:
      return ForwardFor<32>(p, stream);
    case 64:
      return ForwardFor<64>(p, stream);
    case 96:
      return ForwardFor<96>(p, stream);
    default:
      return ForwardFor<128>(p, stream);
  }
}

int64_t FlashBackwardScratchBytes(int64_t batch, int64_t seq, int64_t heads,
                                  int64_t head_dim) {
  if (batch < 1 || seq < 1 || heads < 1) return 0;
  return DsBytes(batch, seq, heads, head_dim);
}

cudaError_t LaunchFlashBackward(const FlashArgs& args, cudaStream_t stream) {
  if (!ValidShape(args)) return cudaErrorInvalidValue;
  Problem p = MakeProblem(args);
  if (DsBytes(args.batch, args.seq, args.heads, args.head_dim) > 0) {
    if (args.scratch == nullptr) return cudaErrorInvalidValue;
    p.ds = static_cast<bf16*>(args.scratch);
  }
  switch (PaddedHeadDim(args.head_dim)) {
    case 32:
      return BackwardFor<32>(p, stream);
    case 64:
      return BackwardFor<64>(p, stream);
    case 96:
      return BackwardFor<96>(p, stream);
    default:
      return BackwardFor<128>(p, stream);
  }
}

}  // namespace attention
}  // namespace ops
}  // namespace lossrt
