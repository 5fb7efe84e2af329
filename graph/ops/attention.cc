// The causal attention op: argument checks (all before anything is written),
// the CPU implementation (Eigen products per (batch, head) and block of 64
// queries, which only reads the keys the block can see), and the GPU dispatch
// to the flash kernels, to cuDNN's fused attention (attention_cudnn.h) or to
// cuBLAS strided-batched GEMMs around softmax kernels.
#include "graph/ops/attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "absl/status/statusor.h"
#include "graph/ops/attention_cudnn.h"
#include "graph/ops/elementwise.h"
#include "graph/ops/op_checks.h"
#include "runtime/int_math.h"
#include "runtime/status.h"
#include "runtime/tensor_checks.h"

#ifdef LOSSRT_WITH_CUDA
#include "graph/ops/attention_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace ops {
namespace {

constexpr int64_t kAlign = 256;
// The GPU kernels take head_dim % 8 == 0 up to this.
constexpr int64_t kMaxGpuHeadDim = 128;
#ifdef LOSSRT_WITH_CUDA
static_assert(kMaxGpuHeadDim == attention::kMaxGpuHeadDim,
              "the op's checks and the kernels disagree");
#endif
// Queries per CPU block: the score block [kCpuBlock, seq] is the CPU's scratch.
constexpr int64_t kCpuBlock = 64;

struct Dims {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t channels = 0;  // C = heads * head_dim

  int64_t rows() const { return batch * seq; }
  int64_t groups() const { return batch * heads; }  // (batch, head) pairs
};

// The flash backward's workspace: delta [batch, heads, seq] f32, then the
// kernels' scratch (rounding up to kAlign keeps it 256-byte aligned).
int64_t FlashBackwardBytes(const Dims& d) {
  int64_t bytes = RoundUp(d.groups() * d.seq * 4, kAlign);
#ifdef LOSSRT_WITH_CUDA
  bytes +=
      attention::FlashBackwardScratchBytes(d.batch, d.seq, d.heads, d.head_dim);
#endif
  return bytes;
}

// The sizes from the arguments and qkv's shape (head_dim = width / 3 heads).
absl::StatusOr<Dims> CheckDims(const Tensor& qkv, int64_t batch, int64_t seq,
                               int64_t heads) {
  if (batch < 1 || seq < 1 || heads < 1) {
    return InvalidArgument(
        "attention: batch, seq and heads must be >= 1, got batch ", batch,
        ", seq ", seq, ", heads ", heads);
  }
  if (batch > kMaxKernelElements || seq > kMaxKernelElements ||
      heads > kMaxKernelElements || batch * seq > kMaxKernelElements) {
    return InvalidArgument("attention: batch ", batch, " x seq ", seq,
                           " exceeds the ops' limit of ", kMaxKernelElements,
                           " rows");
  }
  if (qkv.rank() != 2) {
    return InvalidArgument(
        "qkv: expected [batch * seq, 3 * heads * head_dim], got ",
        qkv.ShapeString());
  }
  if (qkv.dim(0) != batch * seq) {
    return InvalidArgument("qkv: ", qkv.dim(0),
                           " rows, expected batch * seq = ", batch, " * ", seq,
                           " = ", batch * seq);
  }
  const int64_t width = qkv.dim(1);
  if (width < 1 || width % (3 * heads) != 0) {
    return InvalidArgument("qkv: width ", width,
                           " is not 3 * heads * head_dim with heads = ", heads,
                           " (", qkv.ShapeString(), ")");
  }
  Dims dims;
  dims.batch = batch;
  dims.seq = seq;
  dims.heads = heads;
  dims.head_dim = width / (3 * heads);
  dims.channels = width / 3;
  return dims;
}

absl::Status CheckOptions(const CausalAttentionOptions& options) {
  if (options.cublas_chunk_bytes < 1) {
    return InvalidArgument("attention: cublas_chunk_bytes must be >= 1, got ",
                           options.cublas_chunk_bytes);
  }
  switch (options.kernel) {
    case AttentionKernel::kAuto:
    case AttentionKernel::kCublas:
    case AttentionKernel::kFlash:
    case AttentionKernel::kCudnn:
      return absl::OkStatus();
  }
  return InvalidArgument("attention: unknown kernel ",
                         static_cast<int>(options.kernel));
}

// qkv, out and lse as the forward takes them (the backward's inputs too).
absl::StatusOr<Dims> CheckQkvOutLse(const Context& context, const Tensor& qkv,
                                    int64_t batch, int64_t seq, int64_t heads,
                                    const Tensor& out, const Tensor& lse) {
  ASSIGN_OR_RETURN(Dims dims, CheckDims(qkv, batch, seq, heads));
  RETURN_IF_ERROR(CheckActivationDType(context, qkv.dtype, "qkv"));
  RETURN_IF_ERROR(CheckTensor(context, qkv, {dims.rows(), 3 * dims.channels},
                              {qkv.dtype}, "qkv"));
  if (context.device().is_cuda() &&
      (dims.head_dim % 8 != 0 || dims.head_dim > kMaxGpuHeadDim)) {
    return InvalidArgument("attention: head_dim ", dims.head_dim,
                           " is not supported on ", context.device().ToString(),
                           " (a multiple of 8 up to ", kMaxGpuHeadDim, ")");
  }
  RETURN_IF_ERROR(CheckTensor(context, out, {dims.rows(), dims.channels},
                              {qkv.dtype}, "out"));
  RETURN_IF_ERROR(CheckTensor(context, lse, {batch, heads, seq},
                              {AccumulatorDType(qkv.dtype)}, "lse"));
  return dims;
}

int64_t CpuWorkspaceBytes(DType dtype, int64_t seq) {
  const int64_t size = DTypeSize(dtype);
  // The backward's probabilities and their gradient, [kCpuBlock, seq] each
  // (the forward takes the first).
  return 2 * RoundUp(kCpuBlock * seq * size, kAlign);
}

// ---------------------------------------------------------------------------
// CPU.

template <typename T>
using RowMajor =
    Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// A [rows, cols] view with row stride `ld` (a head's slice of qkv, out, ...).
template <typename T>
using View = Eigen::Map<RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using ConstView =
    Eigen::Map<const RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <typename T>
void ForwardCpu(const Dims& d, const T* qkv, T* out, T* lse, T* scratch) {
  const int64_t ld = 3 * d.channels;
  const T scale = T(1) / std::sqrt(static_cast<T>(d.head_dim));
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const T* q = qkv + b * d.seq * ld + h * d.head_dim;
      const T* k = q + d.channels;
      const T* v = q + 2 * d.channels;
      T* o = out + b * d.seq * d.channels + h * d.head_dim;
      T* group_lse = lse + (b * d.heads + h) * d.seq;
      for (int64_t q0 = 0; q0 < d.seq; q0 += kCpuBlock) {
        const int64_t nq = std::min(kCpuBlock, d.seq - q0);
        const int64_t nk = q0 + nq;  // the keys the block's queries can see
        ConstView<T> queries(q + q0 * ld, nq, d.head_dim,
                             Eigen::OuterStride<>(ld));  // [nq, D]
        ConstView<T> keys(k, nk, d.head_dim,
                          Eigen::OuterStride<>(ld));  // [nk, D]
        ConstView<T> values(v, nk, d.head_dim,
                            Eigen::OuterStride<>(ld));   // [nk, D]
        Eigen::Map<RowMajor<T>> probs(scratch, nq, nk);  // [nq, nk]
        probs.noalias() = scale * (queries * keys.transpose());
        for (int64_t r = 0; r < nq; ++r) {
          const int64_t visible = q0 + r + 1;  // keys 0..q0 + r
          auto row = probs.row(r);
          const T max = row.head(visible).maxCoeff();
          T sum = 0;
          for (int64_t j = 0; j < visible; ++j) {
            row(j) = std::exp(row(j) - max);
            sum += row(j);
          }
          row.head(visible) /= sum;
          row.tail(nk - visible).setZero();
          group_lse[q0 + r] = max + std::log(sum);
        }
        View<T> block_out(o + q0 * d.channels, nq, d.head_dim,
                          Eigen::OuterStride<>(d.channels));  // [nq, D]
        block_out.noalias() = probs * values;
      }
    }
  }
}

template <typename T>
void BackwardCpu(const Dims& d, const T* qkv, const T* out, const T* lse,
                 const T* d_out, T* d_qkv, bool accumulate, T* scratch) {
  const int64_t ld = 3 * d.channels;
  const T scale = T(1) / std::sqrt(static_cast<T>(d.head_dim));
  T* probs_data = scratch;
  constexpr int64_t kSize = sizeof(T);
  T* dprobs_data = scratch + RoundUp(kCpuBlock * d.seq * kSize, kAlign) / kSize;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t qkv_offset = b * d.seq * ld + h * d.head_dim;
      const int64_t out_offset = b * d.seq * d.channels + h * d.head_dim;
      const T* q = qkv + qkv_offset;
      const T* k = q + d.channels;
      const T* v = q + 2 * d.channels;
      T* dq = d_qkv + qkv_offset;
      const T* group_lse = lse + (b * d.heads + h) * d.seq;
      // dK and dV gather contributions from every query block.
      View<T> dk_all(dq + d.channels, d.seq, d.head_dim,
                     Eigen::OuterStride<>(ld));  // [seq, D]
      View<T> dv_all(dq + 2 * d.channels, d.seq, d.head_dim,
                     Eigen::OuterStride<>(ld));  // [seq, D]
      if (!accumulate) {
        dk_all.setZero();
        dv_all.setZero();
      }
      for (int64_t q0 = 0; q0 < d.seq; q0 += kCpuBlock) {
        const int64_t nq = std::min(kCpuBlock, d.seq - q0);
        const int64_t nk = q0 + nq;
        const Eigen::OuterStride<> qkv_stride(ld);
        const Eigen::OuterStride<> out_stride(d.channels);
        ConstView<T> queries(q + q0 * ld, nq, d.head_dim, qkv_stride);
        ConstView<T> keys(k, nk, d.head_dim, qkv_stride);
        ConstView<T> values(v, nk, d.head_dim, qkv_stride);
        ConstView<T> outs(out + out_offset + q0 * d.channels, nq, d.head_dim,
                          out_stride);  // [nq, D]
        ConstView<T> douts(d_out + out_offset + q0 * d.channels, nq, d.head_dim,
                           out_stride);                       // [nq, D]
        Eigen::Map<RowMajor<T>> probs(probs_data, nq, nk);    // [nq, nk]
        Eigen::Map<RowMajor<T>> dprobs(dprobs_data, nq, nk);  // [nq, nk]
        // P from the saved lse, 0 above the diagonal.
        probs.noalias() = scale * (queries * keys.transpose());
        for (int64_t r = 0; r < nq; ++r) {
          const int64_t visible = q0 + r + 1;
          const T row_lse = group_lse[q0 + r];
          for (int64_t j = 0; j < visible; ++j) {
            probs(r, j) = std::exp(probs(r, j) - row_lse);
          }
          probs.row(r).tail(nk - visible).setZero();
        }
        // dS = P * (dP - rowsum(dO * O)), with dP = dO V^T (in place).
        dprobs.noalias() = douts * values.transpose();
        for (int64_t r = 0; r < nq; ++r) {
          const T delta = douts.row(r).dot(outs.row(r));
          dprobs.row(r).array() =
              probs.row(r).array() * (dprobs.row(r).array() - delta);
        }
        View<T> dq_block(dq + q0 * ld, nq, d.head_dim, qkv_stride);
        if (accumulate) {
          dq_block.noalias() += scale * (dprobs * keys);
        } else {
          dq_block.noalias() = scale * (dprobs * keys);
        }
        dk_all.topRows(nk).noalias() += scale * (dprobs.transpose() * queries);
        dv_all.topRows(nk).noalias() += probs.transpose() * douts;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// GPU.

// kAuto's kernel for bf16 tensors with 16-byte aligned data, which both fused
// kernels need: kCudnn, whose kernels made the GPT-2-small training step on the
// H200 about 10% faster than ours (bench/RESULTS.md). A build without cuDNN,
// an lse that is not 16-byte aligned and a single token stay on kFlash, and
// the workspace sizes follow.
constexpr AttentionKernel kAutoFusedKernel = AttentionKernel::kCudnn;

// cuDNN's SDPA refuses a single token (s_q = s_kv = 1).
constexpr int64_t kMinCudnnSeq = 2;

// The kernel that runs: options.kernel, or kAuto's pick for the dtype, the
// sequence length and whether the tensors (`aligned`) and lse (`lse_aligned`,
// which only cuDNN needs aligned) start on 16 bytes.
AttentionKernel ResolveKernel(const CausalAttentionOptions& options,
                              DType dtype, int64_t seq, bool aligned,
                              bool lse_aligned) {
  if (options.kernel != AttentionKernel::kAuto) return options.kernel;
  if (dtype != DType::kBF16 || !aligned) return AttentionKernel::kCublas;
  if (kAutoFusedKernel == AttentionKernel::kCudnn &&
      (!attention_cudnn::CheckBuiltWithCudnn().ok() || !lse_aligned ||
       seq < kMinCudnnSeq)) {
    return AttentionKernel::kFlash;
  }
  return kAutoFusedKernel;
}

attention_cudnn::Shape CudnnShapeOf(const Dims& d,
                                    const CausalAttentionOptions& options) {
  attention_cudnn::Shape shape;
  shape.deterministic = options.deterministic;
  shape.batch = d.batch;
  shape.seq = d.seq;
  shape.heads = d.heads;
  shape.head_dim = d.head_dim;
  return shape;
}

// The cuDNN path's own scratch: with accumulate, cuDNN writes the gradient to a
// [rows, 3C] bf16 buffer after its workspace, which is then added to d_qkv
// (cuDNN's backward cannot add to its outputs).
int64_t CudnnAccumulateBytes(const Dims& d) {
  return RoundUp(d.rows() * 3 * d.channels * 2, kAlign);
}

// An estimate of cuDNN's workspace for the Device overloads, which have no
// cuDNN handle to ask (the GPU tests check it against the exact figure). On
// sm_90 the deterministic backward keeps dP in bf16 for the whole square,
// queries padded to 64 and keys to 128, plus a float per query row (cuDNN 9.19
// asks exactly that); the forward needs less, and so does the atomic backward
// (no dP). The estimate adds an f32 dQ accumulator, more row statistics and
// 1 MiB for other versions' layouts.
int64_t CudnnWorkspaceEstimate(const Dims& d, bool deterministic) {
  const int64_t groups = d.groups();
  const int64_t seq64 = RoundUp(d.seq, int64_t{64});
  const int64_t seq128 = RoundUp(d.seq, int64_t{128});
  const int64_t dp = deterministic ? groups * seq64 * seq128 * 2 : 0;
  const int64_t dq_accumulator = groups * seq128 * d.head_dim * 4;
  const int64_t row_stats = 4 * groups * seq128 * 4;
  return RoundUp(dp + dq_accumulator + row_stats, kAlign) + (int64_t{1} << 20);
}

// The cuBLAS path's chunking: `chunk` (batch, head) pairs at a time, each
// with [seq, ld] score buffers (ld = seq rounded up to 8 elements, so that
// every row of a bf16 buffer starts 16-byte aligned).
struct CublasPlan {
  int64_t ld = 0;
  int64_t matrix = 0;  // elements of one pair's [seq, ld] buffer
  int64_t chunk = 0;
  int64_t delta_bytes = 0;     // backward: delta [batch, heads, seq] floats
  int64_t buffer_f32 = 0;      // bytes of one chunk buffer of floats
  int64_t buffer_act = 0;      // ... of activations
  int64_t forward_bytes = 0;   // scores (f32) + probs
  int64_t backward_bytes = 0;  // delta + scores, dprobs (f32) + probs, dscores
};

CublasPlan MakeCublasPlan(const Dims& d, DType dtype, int64_t budget) {
  const int64_t act = DTypeSize(dtype);
  CublasPlan plan;
  plan.ld = RoundUp(d.seq, int64_t{8});
  plan.matrix = d.seq * plan.ld;
  // The backward's buffers are the larger: size the chunk by them.
  const int64_t pair_bytes = plan.matrix * (2 * 4 + 2 * act);
  plan.chunk = std::max<int64_t>(1, std::min(d.groups(), budget / pair_bytes));
  plan.delta_bytes = RoundUp(d.groups() * d.seq * 4, kAlign);
  plan.buffer_f32 = RoundUp(plan.chunk * plan.matrix * 4, kAlign);
  plan.buffer_act = RoundUp(plan.chunk * plan.matrix * act, kAlign);
  plan.forward_bytes = plan.buffer_f32 + plan.buffer_act;
  plan.backward_bytes =
      plan.delta_bytes + 2 * plan.buffer_f32 + 2 * plan.buffer_act;
  return plan;
}

#ifdef LOSSRT_WITH_CUDA

bool Aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// A GEMM operand: data, leading dimension and stride between batch items.
struct Operand {
  const void* data;
  cudaDataType type;
  int64_t ld;
  int64_t stride;
};

// C = alpha op(A) op(B) + beta C for `count` items (column-major, cuBLAS's
// convention), fp32 compute. beta = 0 never reads C.
absl::Status Gemm(cublasHandle_t handle, cublasOperation_t op_a,
                  cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const Operand& a, const Operand& b, float beta,
                  void* c, cudaDataType c_type, int64_t ldc, int64_t stride_c,
                  int64_t count) {
  // Under compute-sanitizer's initcheck, cuBLAS's Hopper kernels store
  // through TMA, which the tool does not see: each item's m x n block of C
  // (and only it: items and other heads interleave) is zeroed first, as the
  // GEMM runner does (runtime/cuda_gemm.h), so that our kernels' reads of C
  // stay checked. (This path is the GPU's reference, not the hot one: the
  // environment is read each call.)
  if (beta == 0.0f && InitcheckZeroingRequested()) {
    cudaStream_t stream = nullptr;
    CUBLAS_RETURN_IF_ERROR(cublasGetStream(handle, &stream));
    const int64_t size = c_type == CUDA_R_32F ? 4 : 2;
    for (int64_t item = 0; item < count; ++item) {
      CUDA_RETURN_IF_ERROR(
          cudaMemset2DAsync(static_cast<char*>(c) + item * stride_c * size,
                            ldc * size, 0, m * size, n, stream));
    }
  }
  CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      handle, op_a, op_b, static_cast<int>(m), static_cast<int>(n),
      static_cast<int>(k), &alpha, a.data, a.type, static_cast<int>(a.ld),
      a.stride, b.data, b.type, static_cast<int>(b.ld), b.stride, &beta, c,
      c_type, static_cast<int>(ldc), stride_c, static_cast<int>(count),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// Calls fn(b, h0, count, local) for each run of consecutive pairs [g, g +
// count) of the chunk [g0, g1) within one batch element b (heads h0.., at
// position `local` of the chunk): heads are strided evenly inside a row of qkv,
// batch elements are not, so one strided-batched GEMM covers one run.
template <typename Fn>
absl::Status ForEachRun(const Dims& d, int64_t g0, int64_t g1, Fn fn) {
  for (int64_t g = g0; g < g1;) {
    const int64_t b = g / d.heads;
    const int64_t h0 = g % d.heads;
    const int64_t count = std::min(d.heads - h0, g1 - g);
    RETURN_IF_ERROR(fn(b, h0, count, g - g0));
    g += count;
  }
  return absl::OkStatus();
}

const char* At(const void* base, int64_t elements, int64_t size) {
  return static_cast<const char*>(base) + elements * size;
}
char* At(void* base, int64_t elements, int64_t size) {
  return static_cast<char*>(base) + elements * size;
}

// Pointers of run (b, h0): Q of head h0 at row b * seq (K and V follow at +C,
// +2C), its rows in out-shaped tensors.
struct RunOffsets {
  int64_t qkv;
  int64_t out;
};
RunOffsets OffsetsOf(const Dims& d, int64_t b, int64_t h0) {
  return {b * d.seq * 3 * d.channels + h0 * d.head_dim,
          b * d.seq * d.channels + h0 * d.head_dim};
}

// S = scale Q K^T for a run: row-major S[i][j] (query i, key j, row stride
// ld) is column-major S^T = K Q^T, where the column-major views of K and Q
// (ld 3C) are K^T and Q^T: so op(A) = (K^T)^T, op(B) = Q^T.
absl::Status ScoresGemm(cublasHandle_t handle, const Dims& d,
                        const CublasPlan& plan, const Tensor& qkv,
                        cudaDataType act_type, float scale, int64_t b,
                        int64_t h0, int64_t count, float* scores) {
  const int64_t size = DTypeSize(qkv.dtype);
  const int64_t ld3 = 3 * d.channels;
  const char* q = At(qkv.data, OffsetsOf(d, b, h0).qkv, size);
  const char* k = q + d.channels * size;
  return Gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, d.seq, d.seq, d.head_dim, scale,
              {k, act_type, ld3, d.head_dim}, {q, act_type, ld3, d.head_dim},
              0.0f, scores, CUDA_R_32F, plan.ld, plan.matrix, count);
}

absl::Status CublasForward(Context& context, cudaStream_t stream, const Dims& d,
                           const CausalAttentionOptions& options,
                           const Tensor& qkv, const Tensor& out,
                           const Tensor& lse) {
  const bool bf16 = qkv.dtype == DType::kBF16;
  const int64_t size = DTypeSize(qkv.dtype);
  const cudaDataType act_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const CublasPlan plan =
      MakeCublasPlan(d, qkv.dtype, options.cublas_chunk_bytes);
  ASSIGN_OR_RETURN(void* workspace, context.Workspace(plan.forward_bytes));
  ASSIGN_OR_RETURN(cublasHandle_t handle, CublasHandleOf(context));
  float* scores = static_cast<float*>(workspace);  // [chunk, seq, ld]
  char* probs = static_cast<char*>(workspace) + plan.buffer_f32;  // same
  const int64_t ld3 = 3 * d.channels;
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));

  for (int64_t g0 = 0; g0 < d.groups(); g0 += plan.chunk) {
    const int64_t g1 = std::min(d.groups(), g0 + plan.chunk);
    RETURN_IF_ERROR(ForEachRun(d, g0, g1,
                               [&](int64_t b, int64_t h0, int64_t count,
                                   int64_t local) -> absl::Status {
                                 return ScoresGemm(
                                     handle, d, plan, qkv, act_type, scale, b,
                                     h0, count, scores + local * plan.matrix);
                               }));
    CUDA_RETURN_IF_ERROR(attention::LaunchCausalSoftmax(
        scores, plan.ld, probs, bf16, lse.data_as<float>() + g0 * d.seq,
        g1 - g0, d.seq, stream));
    // O = P V: column-major O^T (ld C) = V^T P^T, V^T being V's column-major
    // view (ld 3C) and P^T P's (ld ld).
    RETURN_IF_ERROR(ForEachRun(
        d, g0, g1,
        [&](int64_t b, int64_t h0, int64_t count,
            int64_t local) -> absl::Status {
          const RunOffsets at = OffsetsOf(d, b, h0);
          const char* v = At(qkv.data, at.qkv + 2 * d.channels, size);
          return Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, d.head_dim, d.seq,
                      d.seq, 1.0f, {v, act_type, ld3, d.head_dim},
                      {probs + local * plan.matrix * size, act_type, plan.ld,
                       plan.matrix},
                      0.0f, At(out.data, at.out, size), act_type, d.channels,
                      d.head_dim, count);
        }));
  }
  return absl::OkStatus();
}

absl::Status CublasBackward(Context& context, cudaStream_t stream,
                            const Dims& d,
                            const CausalAttentionOptions& options,
                            const Tensor& qkv, const Tensor& out,
                            const Tensor& lse, const Tensor& d_out,
                            const Tensor& d_qkv, bool accumulate) {
  const bool bf16 = qkv.dtype == DType::kBF16;
  const int64_t size = DTypeSize(qkv.dtype);
  const cudaDataType act_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const CublasPlan plan =
      MakeCublasPlan(d, qkv.dtype, options.cublas_chunk_bytes);
  ASSIGN_OR_RETURN(void* workspace, context.Workspace(plan.backward_bytes));
  ASSIGN_OR_RETURN(cublasHandle_t handle, CublasHandleOf(context));
  char* base = static_cast<char*>(workspace);
  float* delta = reinterpret_cast<float*>(base);  // [batch, heads, seq]
  base += plan.delta_bytes;
  float* scores = reinterpret_cast<float*>(base);  // [chunk, seq, ld] each
  float* dprobs = reinterpret_cast<float*>(base + plan.buffer_f32);
  char* probs = base + 2 * plan.buffer_f32;
  char* dscores = probs + plan.buffer_act;
  const int64_t ld3 = 3 * d.channels;
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  const float beta = accumulate ? 1.0f : 0.0f;

  CUDA_RETURN_IF_ERROR(attention::LaunchDelta(out.data, d_out.data, bf16,
                                              d.batch, d.seq, d.heads,
                                              d.head_dim, delta, stream));
  for (int64_t g0 = 0; g0 < d.groups(); g0 += plan.chunk) {
    const int64_t g1 = std::min(d.groups(), g0 + plan.chunk);
    RETURN_IF_ERROR(ForEachRun(
        d, g0, g1,
        [&](int64_t b, int64_t h0, int64_t count,
            int64_t local) -> absl::Status {
          RETURN_IF_ERROR(ScoresGemm(handle, d, plan, qkv, act_type, scale, b,
                                     h0, count, scores + local * plan.matrix));
          // dP = dO V^T: column-major dP^T = V dO^T = (V^T)^T (dO^T).
          const RunOffsets at = OffsetsOf(d, b, h0);
          const char* v = At(qkv.data, at.qkv + 2 * d.channels, size);
          const char* dout = At(d_out.data, at.out, size);
          return Gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, d.seq, d.seq,
                      d.head_dim, 1.0f, {v, act_type, ld3, d.head_dim},
                      {dout, act_type, d.channels, d.head_dim}, 0.0f,
                      dprobs + local * plan.matrix, CUDA_R_32F, plan.ld,
                      plan.matrix, count);
        }));
    CUDA_RETURN_IF_ERROR(attention::LaunchSoftmaxBackward(
        scores, dprobs, plan.ld, lse.data_as<float>() + g0 * d.seq,
        delta + g0 * d.seq, probs, dscores, bf16, g1 - g0, d.seq, stream));
    RETURN_IF_ERROR(ForEachRun(
        d, g0, g1,
        [&](int64_t b, int64_t h0, int64_t count,
            int64_t local) -> absl::Status {
          const RunOffsets at = OffsetsOf(d, b, h0);
          const char* q = At(qkv.data, at.qkv, size);
          const char* k = q + d.channels * size;
          const char* dout = At(d_out.data, at.out, size);
          char* dq = At(d_qkv.data, at.qkv, size);
          char* dk = dq + d.channels * size;
          char* dv = dq + 2 * d.channels * size;
          const Operand p{probs + local * plan.matrix * size, act_type, plan.ld,
                          plan.matrix};
          const Operand ds{dscores + local * plan.matrix * size, act_type,
                           plan.ld, plan.matrix};
          // dV = P^T dO: column-major dV^T (ld 3C) = dO^T P.
          RETURN_IF_ERROR(Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, d.head_dim,
                               d.seq, d.seq, 1.0f,
                               {dout, act_type, d.channels, d.head_dim}, p,
                               beta, dv, act_type, ld3, d.head_dim, count));
          // dQ = scale dS K: column-major dQ^T = K^T dS^T.
          RETURN_IF_ERROR(Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, d.head_dim,
                               d.seq, d.seq, scale,
                               {k, act_type, ld3, d.head_dim}, ds, beta, dq,
                               act_type, ld3, d.head_dim, count));
          // dK = scale dS^T Q: column-major dK^T = Q^T dS.
          return Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, d.head_dim, d.seq,
                      d.seq, scale, {q, act_type, ld3, d.head_dim}, ds, beta,
                      dk, act_type, ld3, d.head_dim, count);
        }));
  }
  return absl::OkStatus();
}

// The kernel for these tensors (lse apart: only cuDNN needs it aligned), or
// why the one asked for cannot take them.
absl::StatusOr<AttentionKernel> ChooseKernel(
    const CausalAttentionOptions& options, DType dtype, int64_t seq,
    std::initializer_list<const Tensor*> tensors, const Tensor& lse) {
  bool aligned = true;
  for (const Tensor* tensor : tensors) aligned &= Aligned16(tensor->data);
  const bool lse_aligned = Aligned16(lse.data);
  const AttentionKernel kernel =
      ResolveKernel(options, dtype, seq, aligned, lse_aligned);
  if (kernel == AttentionKernel::kFlash &&
      (dtype != DType::kBF16 || !aligned)) {
    return InvalidArgument(
        "attention: the flash kernel needs bf16 tensors with 16-byte aligned "
        "data, got ",
        DTypeName(dtype), aligned ? "" : " (misaligned)");
  }
  if (kernel == AttentionKernel::kCudnn) {
    if (dtype != DType::kBF16 || !aligned || !lse_aligned) {
      return InvalidArgument(
          "attention: the cuDNN kernel needs bf16 tensors with 16-byte "
          "aligned data (lse included), got ",
          DTypeName(dtype), aligned && lse_aligned ? "" : " (misaligned)");
    }
    if (seq < kMinCudnnSeq) {
      return InvalidArgument("attention: the cuDNN kernel needs seq >= ",
                             kMinCudnnSeq, ", got ", seq);
    }
    RETURN_IF_ERROR(attention_cudnn::CheckBuiltWithCudnn());
  }
  return kernel;
}

#endif  // LOSSRT_WITH_CUDA

}  // namespace

const char* AttentionKernelName(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kAuto:
      return "auto";
    case AttentionKernel::kCublas:
      return "cublas";
    case AttentionKernel::kFlash:
      return "flash";
    case AttentionKernel::kCudnn:
      return "cudnn";
  }
  return "unknown";
}

absl::StatusOr<AttentionKernel> ParseAttentionKernel(absl::string_view name) {
  for (AttentionKernel kernel :
       {AttentionKernel::kAuto, AttentionKernel::kCublas,
        AttentionKernel::kFlash, AttentionKernel::kCudnn}) {
    if (name == AttentionKernelName(kernel)) return kernel;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("attention kernel '", name,
                   "': expected one of auto, cublas, flash, cudnn"));
}

absl::Status AttentionKernelBuilt(AttentionKernel kernel) {
  if (kernel == AttentionKernel::kAuto) return absl::OkStatus();
  if (!BuiltWithCuda()) {
    return absl::UnimplementedError(
        absl::StrCat("attention: the ", AttentionKernelName(kernel),
                     " kernel needs a build with CUDA"));
  }
  if (kernel == AttentionKernel::kCudnn) {
    return attention_cudnn::CheckBuiltWithCudnn();
  }
  return absl::OkStatus();
}

absl::Status CausalAttentionForward(Context& context, const Tensor& qkv,
                                    int64_t batch, int64_t seq, int64_t heads,
                                    const Tensor& out, const Tensor& lse) {
  return CausalAttentionForward(context, qkv, batch, seq, heads, out, lse,
                                CausalAttentionOptions());
}

absl::Status CausalAttentionForward(Context& context, const Tensor& qkv,
                                    int64_t batch, int64_t seq, int64_t heads,
                                    const Tensor& out, const Tensor& lse,
                                    const CausalAttentionOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const Dims d,
                   CheckQkvOutLse(context, qkv, batch, seq, heads, out, lse));
  RETURN_IF_ERROR(CheckDisjoint({&out, "out"}, {{&qkv, "qkv"}, {&lse, "lse"}}));
  RETURN_IF_ERROR(CheckDisjoint({&lse, "lse"}, {{&qkv, "qkv"}}));

  if (context.device().is_cpu()) {
    ASSIGN_OR_RETURN(void* scratch,
                     context.Workspace(CpuWorkspaceBytes(qkv.dtype, d.seq)));
    if (qkv.dtype == DType::kF64) {
      ForwardCpu<double>(d, qkv.data_as<const double>(), out.data_as<double>(),
                         lse.data_as<double>(), static_cast<double*>(scratch));
    } else {
      ForwardCpu<float>(d, qkv.data_as<const float>(), out.data_as<float>(),
                        lse.data_as<float>(), static_cast<float*>(scratch));
    }
    return absl::OkStatus();
  }

#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(const AttentionKernel kernel,
                   ChooseKernel(options, qkv.dtype, d.seq, {&qkv, &out}, lse));
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  if (kernel == AttentionKernel::kCudnn) {
    const attention_cudnn::Shape shape = CudnnShapeOf(d, options);
    ASSIGN_OR_RETURN(const int64_t bytes,
                     attention_cudnn::ForwardWorkspaceBytes(context, shape));
    ASSIGN_OR_RETURN(void* workspace, context.Workspace(bytes));
    return attention_cudnn::Forward(context, shape, qkv.data, out.data,
                                    lse.data_as<float>(), workspace);
  }
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  if (kernel == AttentionKernel::kFlash) {
    attention::FlashArgs args;
    args.qkv = qkv.data;
    args.out = out.data;
    args.lse = lse.data_as<float>();
    args.batch = d.batch;
    args.seq = d.seq;
    args.heads = d.heads;
    args.head_dim = d.head_dim;
    CUDA_RETURN_IF_ERROR(attention::LaunchFlashForward(args, stream));
    return absl::OkStatus();
  }
  return CublasForward(context, stream, d, options, qkv, out, lse);
#else
  return absl::UnavailableError("attention on " + context.device().ToString() +
                                ": built without CUDA");
#endif
}

absl::Status CausalAttentionBackward(Context& context, const Tensor& qkv,
                                     const Tensor& out, const Tensor& lse,
                                     const Tensor& d_out, int64_t batch,
                                     int64_t seq, int64_t heads,
                                     const Tensor& d_qkv, bool accumulate) {
  return CausalAttentionBackward(context, qkv, out, lse, d_out, batch, seq,
                                 heads, d_qkv, accumulate,
                                 CausalAttentionOptions());
}

absl::Status CausalAttentionBackward(Context& context, const Tensor& qkv,
                                     const Tensor& out, const Tensor& lse,
                                     const Tensor& d_out, int64_t batch,
                                     int64_t seq, int64_t heads,
                                     const Tensor& d_qkv, bool accumulate,
                                     const CausalAttentionOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const Dims d,
                   CheckQkvOutLse(context, qkv, batch, seq, heads, out, lse));
  RETURN_IF_ERROR(CheckTensor(context, d_out, {d.rows(), d.channels},
                              {qkv.dtype}, "d_out"));
  RETURN_IF_ERROR(CheckTensor(context, d_qkv, {d.rows(), 3 * d.channels},
                              {qkv.dtype}, "d_qkv"));
  RETURN_IF_ERROR(CheckDisjoint(
      {&d_qkv, "d_qkv"},
      {{&qkv, "qkv"}, {&out, "out"}, {&lse, "lse"}, {&d_out, "d_out"}}));

  if (context.device().is_cpu()) {
    ASSIGN_OR_RETURN(void* scratch,
                     context.Workspace(CpuWorkspaceBytes(qkv.dtype, d.seq)));
    if (qkv.dtype == DType::kF64) {
      BackwardCpu<double>(
          d, qkv.data_as<const double>(), out.data_as<const double>(),
          lse.data_as<const double>(), d_out.data_as<const double>(),
          d_qkv.data_as<double>(), accumulate, static_cast<double*>(scratch));
    } else {
      BackwardCpu<float>(d, qkv.data_as<const float>(),
                         out.data_as<const float>(), lse.data_as<const float>(),
                         d_out.data_as<const float>(), d_qkv.data_as<float>(),
                         accumulate, static_cast<float*>(scratch));
    }
    return absl::OkStatus();
  }

#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(const AttentionKernel kernel,
                   ChooseKernel(options, qkv.dtype, d.seq,
                                {&qkv, &out, &d_out, &d_qkv}, lse));
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  if (kernel == AttentionKernel::kCudnn) {
    const attention_cudnn::Shape shape = CudnnShapeOf(d, options);
    ASSIGN_OR_RETURN(const int64_t cudnn_bytes,
                     attention_cudnn::BackwardWorkspaceBytes(context, shape));
    const int64_t cudnn_share = RoundUp(cudnn_bytes, kAlign);
    ASSIGN_OR_RETURN(
        void* workspace,
        context.Workspace(cudnn_share +
                          (accumulate ? CudnnAccumulateBytes(d) : 0)));
    if (!accumulate) {
      return attention_cudnn::Backward(context, shape, qkv.data, out.data,
                                       lse.data_as<float>(), d_out.data,
                                       d_qkv.data, workspace);
    }
    // [rows, 3C] bf16 after cuDNN's share.
    void* gradient = static_cast<char*>(workspace) + cudnn_share;
    RETURN_IF_ERROR(attention_cudnn::Backward(context, shape, qkv.data,
                                              out.data, lse.data_as<float>(),
                                              d_out.data, gradient, workspace));
    return AccumulateInto(
        context,
        Tensor::Of(gradient, DType::kBF16, {d.rows(), 3 * d.channels},
                   context.device()),
        d_qkv, /*accumulate=*/true);
  }
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  if (kernel == AttentionKernel::kFlash) {
    const int64_t delta_bytes = RoundUp(d.groups() * d.seq * 4, kAlign);
    ASSIGN_OR_RETURN(void* workspace, context.Workspace(FlashBackwardBytes(d)));
    float* delta = static_cast<float*>(workspace);  // [batch, heads, seq]
    CUDA_RETURN_IF_ERROR(attention::LaunchDelta(
        out.data, d_out.data,
        /*bf16=*/true, d.batch, d.seq, d.heads, d.head_dim, delta, stream));
    attention::FlashArgs args;
    args.qkv = qkv.data;
    args.d_out = d_out.data;
    args.d_qkv = d_qkv.data;
    args.lse = lse.data_as<float>();
    args.delta = delta;
    args.batch = d.batch;
    args.seq = d.seq;
    args.heads = d.heads;
    args.head_dim = d.head_dim;
    args.accumulate = accumulate;
    args.scratch = static_cast<unsigned char*>(workspace) + delta_bytes;
    CUDA_RETURN_IF_ERROR(attention::LaunchFlashBackward(args, stream));
    return absl::OkStatus();
  }
  return CublasBackward(context, stream, d, options, qkv, out, lse, d_out,
                        d_qkv, accumulate);
#else
  return absl::UnavailableError("attention on " + context.device().ToString() +
                                ": built without CUDA");
#endif
}

int64_t CausalAttentionWorkspaceBytes(const Device& device, DType dtype,
                                      int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim) {
  return CausalAttentionWorkspaceBytes(device, dtype, batch, seq, heads,
                                       head_dim, CausalAttentionOptions());
}

namespace {

// The sizes of a workspace query, or nothing for nonsensical arguments.
std::optional<Dims> WorkspaceDims(int64_t batch, int64_t seq, int64_t heads,
                                  int64_t head_dim,
                                  const CausalAttentionOptions& options) {
  if (batch < 1 || seq < 1 || heads < 1 || head_dim < 1 ||
      batch > kMaxKernelElements || seq > kMaxKernelElements ||
      heads > kMaxKernelElements || head_dim > kMaxKernelElements ||
      batch * seq > kMaxKernelElements ||
      heads * head_dim > kMaxKernelElements || options.cublas_chunk_bytes < 1) {
    return std::nullopt;
  }
  Dims d;
  d.batch = batch;
  d.seq = seq;
  d.heads = heads;
  d.head_dim = head_dim;
  d.channels = heads * head_dim;
  return d;
}

// The GPU workspace of a kernel; for kCudnn `cudnn_bytes`, cuDNN's own need.
int64_t GpuWorkspaceBytes(const Dims& d, DType dtype, AttentionKernel kernel,
                          const CausalAttentionOptions& options,
                          int64_t cudnn_bytes) {
  switch (kernel) {
    case AttentionKernel::kFlash:
      return FlashBackwardBytes(d);
    case AttentionKernel::kCudnn:
      return RoundUp(cudnn_bytes, kAlign) + CudnnAccumulateBytes(d);
    default:
      break;
  }
  const CublasPlan plan = MakeCublasPlan(d, dtype, options.cublas_chunk_bytes);
  return std::max(plan.forward_bytes, plan.backward_bytes);
}

}  // namespace

int64_t CausalAttentionWorkspaceBytes(const Device& device, DType dtype,
                                      int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim,
                                      const CausalAttentionOptions& options) {
  const std::optional<Dims> d =
      WorkspaceDims(batch, seq, heads, head_dim, options);
  if (!d.has_value()) return 0;
  if (device.is_cpu()) return CpuWorkspaceBytes(dtype, seq);
  const AttentionKernel kernel = ResolveKernel(
      options, dtype, seq, /*aligned=*/true, /*lse_aligned=*/true);
  return GpuWorkspaceBytes(
      *d, dtype, kernel, options,
      kernel == AttentionKernel::kCudnn
          ? CudnnWorkspaceEstimate(*d, options.deterministic)
          : 0);
}

absl::StatusOr<int64_t> CausalAttentionWorkspaceBytes(
    Context& context, DType dtype, int64_t batch, int64_t seq, int64_t heads,
    int64_t head_dim, const CausalAttentionOptions& options) {
  const std::optional<Dims> d =
      WorkspaceDims(batch, seq, heads, head_dim, options);
  const AttentionKernel kernel = ResolveKernel(
      options, dtype, seq, /*aligned=*/true, /*lse_aligned=*/true);
  // Only shapes that the cuDNN path takes build graphs; the others get the
  // Device overload's answer (the op refuses them anyway).
  if (!d.has_value() || context.device().is_cpu() ||
      kernel != AttentionKernel::kCudnn || dtype != DType::kBF16 ||
      head_dim % 8 != 0 || head_dim > kMaxGpuHeadDim || seq < kMinCudnnSeq) {
    return CausalAttentionWorkspaceBytes(context.device(), dtype, batch, seq,
                                         heads, head_dim, options);
  }
  RETURN_IF_ERROR(attention_cudnn::CheckBuiltWithCudnn());
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
#endif
  const attention_cudnn::Shape shape = CudnnShapeOf(*d, options);
  ASSIGN_OR_RETURN(const int64_t forward,
                   attention_cudnn::ForwardWorkspaceBytes(context, shape));
  ASSIGN_OR_RETURN(const int64_t backward,
                   attention_cudnn::BackwardWorkspaceBytes(context, shape));
  return GpuWorkspaceBytes(*d, dtype, kernel, options,
                           std::max(forward, backward));
}

}  // namespace ops
}  // namespace lossrt
