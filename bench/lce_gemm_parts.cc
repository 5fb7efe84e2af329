// The linear cross-entropy's three GEMMs as its token-chunk schedule runs
// them, timed one kind at a time over all chunks of a shape: the logits GEMM
// (G1, fp32 output), d_hidden (G2, from 16-bit dlogits laid out in place in
// the fp32 buffer) and the d_weight accumulation (G3, fp32 [V, H], beta = 1
// after the first chunk), against chunk rows and the cuBLASLt workspace the
// plan gives them. Shows where a small workspace budget's time goes. Two
// experiments on the accumulation, which is bound by its fp32 read-modify-write
// at a few hundred rows: --g3_candidates times cuBLASLt's other algorithms for
// it, --concurrent_g3_sms runs each chunk's d_hidden on a second stream beside
// it, the two aimed at parts of the SMs. GPU only.
//
//   bench/lce_gemm_parts --shapes=4096x4096x128256 --chunks=256,512,1024,4096
//   bench/lce_gemm_parts --chunks=512 --concurrent_g3_sms=0,66,88
//   --g3_candidates=8
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#ifdef LOSSRT_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "bench/bench_util.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#endif

ABSL_FLAG(std::string, shapes, "4096x4096x128256,16384x768x50304",
          "N x H x V shapes, comma-separated");
ABSL_FLAG(std::string, chunks, "256,512,1024,2048",
          "token chunk rows (N itself is always added)");
ABSL_FLAG(std::string, workspaces_mib, "4,16,32",
          "cuBLASLt workspace sizes (MiB, at most 32: the context's)");
ABSL_FLAG(int, repeats, 7, "timed repetitions (median)");
ABSL_FLAG(std::string, concurrent_g3_sms, "",
          "also run each chunk's d_hidden (side stream) and d_weight (main "
          "stream) GEMMs at once, d_weight on this many SMs and d_hidden on "
          "the rest (0: no SM targets), comma-separated");
ABSL_FLAG(int, g3_candidates, 0,
          "also time up to this many of cuBLASLt's candidates for each "
          "chunk's d_weight accumulation (whatever their bits; 0: none)");

namespace lossrt {
namespace {

#ifdef LOSSRT_WITH_CUDA
// The integers >= min_value of a `sep`-separated list (others are skipped).
std::vector<int64_t> ParseList(const std::string& text, char sep,
                               int64_t min_value = 1) {
  std::vector<int64_t> out;
  for (absl::string_view item : absl::StrSplit(text, sep, absl::SkipEmpty())) {
    int64_t value = 0;
    if (absl::SimpleAtoi(item, &value) && value >= min_value) {
      out.push_back(value);
    }
  }
  return out;
}

// The GEMMs of a token chunk of c rows, chunk k (logits rows k c ...), as the
// linear cross-entropy's backend calls them, on one fp32 logits buffer whose
// rows also hold the 16-bit dlogits in place (row stride 2 ld bf16).
struct ChunkGemms {
  int64_t h = 0, v = 0, ld = 0;
  const char* hidden = nullptr;  // [N, H] bf16
  const char* weight = nullptr;  // [V, H] bf16
  char* buffer = nullptr;        // [rows, ld] fp32
  void* d_hidden = nullptr;      // [N, H] bf16
  void* d_weight = nullptr;      // [V, H] fp32

  // G1: logits[c, V] = hidden_k @ weight^T.
  GemmCall Logits(int64_t k, int64_t c) const {
    GemmCall call;
    call.a = {weight, CUDA_R_16BF, h, v, h, CUBLAS_OP_T};
    call.b = {hidden + k * c * h * 2, CUDA_R_16BF, h, c, h, CUBLAS_OP_N};
    call.d = buffer;
    call.d_type = CUDA_R_32F;
    call.m = v;
    call.n = c;
    call.ld_d = ld;
    return call;
  }
  // G2: d_hidden of rows [p rows, (p + 1) rows) of chunk k = dlogits @ weight.
  GemmCall DHidden(int64_t k, int64_t c, int64_t p, int64_t rows) const {
    GemmCall call;
    call.a = {weight, CUDA_R_16BF, h, v, h, CUBLAS_OP_N};
    call.b = {
        buffer + p * rows * ld * 4, CUDA_R_16BF, v, rows, 2 * ld, CUBLAS_OP_N};
    call.d = static_cast<char*>(d_hidden) + (k * c + p * rows) * h * 2;
    call.d_type = CUDA_R_16BF;
    call.m = h;
    call.n = rows;
    call.ld_d = h;
    return call;
  }
  // G3: d_weight (+)= dlogits^T @ hidden_k (beta 0 for the first chunk).
  GemmCall DWeight(int64_t k, int64_t c) const {
    GemmCall call;
    call.a = {hidden + k * c * h * 2, CUDA_R_16BF, h, c, h, CUBLAS_OP_N};
    call.b = {buffer, CUDA_R_16BF, v, c, 2 * ld, CUBLAS_OP_T};
    call.d = d_weight;
    call.d_type = CUDA_R_32F;
    call.m = h;
    call.n = v;
    call.ld_d = h;
    call.beta = k == 0 ? 0.0f : 1.0f;
    return call;
  }
};

// A cuBLASLt GEMM of one shape with its own descriptors and up to
// `candidates` of the heuristic's algorithms, optionally aimed at `sm_count`
// SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET): what GemmRunner does not expose.
class RawGemm {
 public:
  ~RawGemm() {
    if (d_ != nullptr) cublasLtMatrixLayoutDestroy(d_);
    if (b_ != nullptr) cublasLtMatrixLayoutDestroy(b_);
    if (a_ != nullptr) cublasLtMatrixLayoutDestroy(a_);
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  }
  absl::Status Init(cublasLtHandle_t handle, const GemmCall& call, int sm_count,
                    void* workspace, size_t workspace_bytes,
                    int candidates = 1) {
    handle_ = handle;
    workspace_ = workspace;
    workspace_bytes_ = workspace_bytes;
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t op_a = call.a.op, op_b = call.b.op;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (sm_count > 0) {
      const int32_t sms = sm_count;
      CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          desc_, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)));
    }
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
        &a_, call.a.type, call.a.rows, call.a.cols, call.a.ld));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
        &b_, call.b.type, call.b.rows, call.b.cols, call.b.ld));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d_, call.d_type, call.m,
                                                      call.n, call.ld_d));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
        sizeof(workspace_bytes)));
    std::vector<cublasLtMatmulHeuristicResult_t> results(candidates);
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, desc_, a_, b_, d_, d_, pref,
                                       candidates, results.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    CUBLAS_RETURN_IF_ERROR(status);
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS)
        algos_.push_back(results[i].algo);
    }
    if (algos_.empty())
      return absl::UnimplementedError("no cuBLASLt algorithm");
    return absl::OkStatus();
  }
  int algorithms() const { return static_cast<int>(algos_.size()); }
  const cublasLtMatmulAlgo_t& algorithm(int i) const { return algos_[i]; }
  // `call` (the shape Init saw, operands and scalars of its own) with
  // algorithm `i`.
  absl::Status Run(const GemmCall& call, cudaStream_t stream, int i = 0) const {
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmul(handle_, desc_, &call.alpha, call.a.data, a_,
                       call.b.data, b_, &call.beta, call.d, d_, call.d, d_,
                       &algos_[i], workspace_, workspace_bytes_, stream));
    return absl::OkStatus();
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos_;
};

// Times up to `limit` of the heuristic's candidates for the d_weight
// accumulation over all chunks of c rows, with the context's whole cuBLASLt
// workspace: how far the heuristic's first choice is from the fastest, bits
// aside.
absl::Status SweepG3(Context& context, cudaStream_t stream,
                     const ChunkGemms& gemms, int64_t n, int64_t c, int limit) {
  ASSIGN_OR_RETURN(cublasLtHandle_t handle, CublasLtHandleOf(context));
  ASSIGN_OR_RETURN(void* workspace, context.cublaslt_workspace());
  RawGemm g3;
  RETURN_IF_ERROR(g3.Init(handle, gemms.DWeight(0, c), 0, workspace,
                          Context::kCublasLtWorkspaceBytes, limit));
  const int64_t count = n / c;
  for (int i = 0; i < g3.algorithms(); ++i) {
    auto run = [&](int) -> absl::Status {
      for (int64_t k = 0; k < count; ++k) {
        RETURN_IF_ERROR(g3.Run(gemms.DWeight(k, c), stream, i));
      }
      return absl::OkStatus();
    };
    absl::StatusOr<double> ms =
        bench::MedianMs(stream, 1, absl::GetFlag(FLAGS_repeats), run);
    int32_t tile = 0, stages = 0, splits = 0, cluster = 0;
    size_t size = 0;
    const cublasLtMatmulAlgo_t& algo = g3.algorithm(i);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID,
                                         &tile, sizeof(tile), &size);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                         &stages, sizeof(stages), &size);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                         &splits, sizeof(splits), &size);
    cublasLtMatmulAlgoConfigGetAttribute(&algo,
                                         CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                         &cluster, sizeof(cluster), &size);
    if (ms.ok()) {
      std::printf(
          "%6lld  G3 candidate %2d (tile %d, stages %d, split-K %d, cluster "
          "%d): %8.3f ms, %5.0f GB/s of fp32 d_weight traffic\n",
          static_cast<long long>(c), i, tile, stages, splits, cluster, *ms,
          8.0 * gemms.v * gemms.h * count / (*ms * 1e-3) / 1e9);
    } else {
      std::printf("%6lld  G3 candidate %2d: %s\n", static_cast<long long>(c), i,
                  ms.status().ToString().c_str());
    }
  }
  return absl::OkStatus();
}

// Each chunk's G2 (d_hidden, on the context's side stream, SMs - g3_sms SMs)
// and G3 (d_weight accumulation, on the main stream, g3_sms SMs) at once,
// both reading the chunk's dlogits, joined before the next chunk; against
// the two one after the other with the same descriptors. Halves of the
// context's cuBLASLt workspace, one a GEMM.
absl::Status ConcurrentG2G3(Context& context, cudaStream_t stream,
                            const ChunkGemms& gemms, int64_t n, int64_t c,
                            int g3_sms) {
  ASSIGN_OR_RETURN(cublasLtHandle_t handle, CublasLtHandleOf(context));
  ASSIGN_OR_RETURN(void* workspace, context.cublaslt_workspace());
  ASSIGN_OR_RETURN(cudaStream_t side, ContextSideStream(context));
  ASSIGN_OR_RETURN(const cudaEvent_t* events, ContextEvents(context, 2));
  int sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &sms, cudaDevAttrMultiProcessorCount, context.device().ordinal));
  const size_t half = Context::kCublasLtWorkspaceBytes / 2;
  RawGemm g2, g3;
  RETURN_IF_ERROR(g2.Init(handle, gemms.DHidden(0, c, 0, c),
                          g3_sms > 0 ? sms - g3_sms : 0, workspace, half));
  RETURN_IF_ERROR(g3.Init(handle, gemms.DWeight(0, c), g3_sms,
                          static_cast<char*>(workspace) + half, half));
  const int64_t count = n / c;
  auto run = [&](bool concurrent) {
    return [&, concurrent](int) -> absl::Status {
      for (int64_t k = 0; k < count; ++k) {
        cudaStream_t g2_stream = concurrent ? side : stream;
        if (concurrent) {
          CUDA_RETURN_IF_ERROR(cudaEventRecord(events[0], stream));
          CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, events[0], 0));
        }
        RETURN_IF_ERROR(g2.Run(gemms.DHidden(k, c, 0, c), g2_stream));
        RETURN_IF_ERROR(g3.Run(gemms.DWeight(k, c), stream));
        if (concurrent) {
          CUDA_RETURN_IF_ERROR(cudaEventRecord(events[1], side));
          CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, events[1], 0));
        }
      }
      return absl::OkStatus();
    };
  };
  const int repeats = absl::GetFlag(FLAGS_repeats);
  ASSIGN_OR_RETURN(double serial,
                   bench::MedianMs(stream, 2, repeats, run(false)));
  ASSIGN_OR_RETURN(double both, bench::MedianMs(stream, 2, repeats, run(true)));
  std::printf(
      "%6lld  G2 + G3, G3 on %d SMs (0: no target): one after the "
      "other %8.3f ms, at once %8.3f ms\n",
      static_cast<long long>(c), g3_sms, serial, both);
  return absl::OkStatus();
}

absl::Status RunShape(Context& context, int64_t n, int64_t h, int64_t v) {
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  Allocator& a = context.allocator();
  const int64_t ld = (v + 7) / 8 * 8;  // fp32 logits row stride
  ASSIGN_OR_RETURN(OwnedTensor hidden, EmptyTensor(a, DType::kBF16, {n, h}));
  ASSIGN_OR_RETURN(OwnedTensor weight, EmptyTensor(a, DType::kBF16, {v, h}));
  ASSIGN_OR_RETURN(OwnedTensor d_hidden, EmptyTensor(a, DType::kBF16, {n, h}));
  ASSIGN_OR_RETURN(OwnedTensor d_weight, EmptyTensor(a, DType::kF32, {v, h}));
  // [N, 2 ld] bf16: the dlogits as the CE kernel leaves them in the fp32
  // buffer, and the buffer itself.
  ASSIGN_OR_RETURN(OwnedTensor buffer,
                   EmptyTensor(a, DType::kBF16, {n, 2 * ld}));
  RETURN_IF_ERROR(FillNormal(hidden.view, 1, 0.0f, 0.5f, context));
  RETURN_IF_ERROR(FillNormal(weight.view, 2, 0.0f, 0.02f, context));
  RETURN_IF_ERROR(FillNormal(buffer.view, 3, 0.0f, 1e-4f, context));
  ChunkGemms gemms;
  gemms.h = h;
  gemms.v = v;
  gemms.ld = ld;
  gemms.hidden = static_cast<const char*>(hidden.view.data);
  gemms.weight = static_cast<const char*>(weight.view.data);
  gemms.buffer = static_cast<char*>(buffer.view.data);
  gemms.d_hidden = d_hidden.view.data;
  gemms.d_weight = d_weight.view.data;
  const double flops = 2.0 * n * h * v;  // one GEMM over all chunks

  std::vector<int64_t> chunks = ParseList(absl::GetFlag(FLAGS_chunks), ',');
  chunks.push_back(n);
  std::printf(
      "\n%lld x %lld x %lld bf16 (ld %lld): ms over all chunks "
      "(TFLOP/s)\n",
      static_cast<long long>(n), static_cast<long long>(h),
      static_cast<long long>(v), static_cast<long long>(ld));
  std::printf("%6s %5s %16s %16s %16s %16s\n", "chunk", "wsMiB", "G1 logits",
              "G2 d_hidden", "G2 2 halves", "G3 d_weight+=");
  const int repeats = absl::GetFlag(FLAGS_repeats);
  for (int64_t c : chunks) {
    if (c > n || n % c != 0) continue;
    const int64_t count = n / c;
    for (int64_t ws_mib : ParseList(absl::GetFlag(FLAGS_workspaces_mib), ',')) {
      ASSIGN_OR_RETURN(
          GemmRunner * gemm,
          ContextGemmRunnerFor(context, CUBLAS_COMPUTE_32F, ws_mib << 20));
      auto g1 = [&](int) -> absl::Status {
        for (int64_t k = 0; k < count; ++k) {
          RETURN_IF_ERROR(gemm->Run(gemms.Logits(k, c), stream));
        }
        return absl::OkStatus();
      };
      auto g2 = [&](int parts) {
        return [&, parts](int) -> absl::Status {
          for (int64_t k = 0; k < count; ++k) {
            for (int p = 0; p < parts; ++p) {
              RETURN_IF_ERROR(
                  gemm->Run(gemms.DHidden(k, c, p, c / parts), stream));
            }
          }
          return absl::OkStatus();
        };
      };
      auto g3 = [&](int) -> absl::Status {
        for (int64_t k = 0; k < count; ++k) {
          RETURN_IF_ERROR(gemm->Run(gemms.DWeight(k, c), stream));
        }
        return absl::OkStatus();
      };
      ASSIGN_OR_RETURN(double t1, bench::MedianMs(stream, 2, repeats, g1));
      ASSIGN_OR_RETURN(double t2, bench::MedianMs(stream, 2, repeats, g2(1)));
      double t2h = 0;
      if (c >= 256) {
        ASSIGN_OR_RETURN(t2h, bench::MedianMs(stream, 2, repeats, g2(2)));
      }
      ASSIGN_OR_RETURN(double t3, bench::MedianMs(stream, 2, repeats, g3));
      auto rate = [&](double ms) { return ms > 0 ? flops / ms / 1e9 : 0.0; };
      std::printf(
          "%6lld %5lld %8.3f (%5.0f) %8.3f (%5.0f) %8.3f (%5.0f) "
          "%8.3f (%5.0f)\n",
          static_cast<long long>(c), static_cast<long long>(ws_mib), t1,
          rate(t1), t2, rate(t2), t2h, rate(t2h), t3, rate(t3));
    }
    for (int64_t g3_sms :
         ParseList(absl::GetFlag(FLAGS_concurrent_g3_sms), ',', 0)) {
      if (c == n) break;
      RETURN_IF_ERROR(ConcurrentG2G3(context, stream, gemms, n, c,
                                     static_cast<int>(g3_sms)));
    }
    if (absl::GetFlag(FLAGS_g3_candidates) > 0 && c < n) {
      RETURN_IF_ERROR(SweepG3(context, stream, gemms, n, c,
                              absl::GetFlag(FLAGS_g3_candidates)));
    }
  }
  return absl::OkStatus();
}

absl::Status Run() {
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                   Context::Create(Device::Cuda(0)));
  ASSIGN_OR_RETURN(double tflops, bench::GemmTflops(*context, 8192));
  std::printf("ceiling: 8192^3 bf16 GEMM %.0f TFLOP/s\n", tflops);
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty())) {
    std::vector<int64_t> dims = ParseList(std::string(item), 'x');
    if (dims.size() != 3) return InvalidArgument("bad shape '", item, "'");
    RETURN_IF_ERROR(RunShape(*context, dims[0], dims[1], dims[2]));
  }
  return absl::OkStatus();
}
#else
absl::Status Run() {
  return absl::UnimplementedError("lce_gemm_parts needs a CUDA build");
}
#endif

}  // namespace
}  // namespace lossrt

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = lossrt::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "lce_gemm_parts: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
