// Probe: which cuBLASLt kernels, and how fast, take the GELU MLP backward's
// input GEMM with the GELU derivative in the epilogue, and does the bias
// gradient fused there (DGELU_BGRAD) cost anything? The GPT-2 step's call:
// d_a [rows, hidden] = dy [rows, width] W2 [width, hidden], then
// d_h = d_a * gelu'(h), h the saved pre-activation [rows, hidden] (all bf16,
// row-major; cuBLASLt sees the column-major transposes: m = hidden, n = rows,
// k = width, "nn"). For each epilogue (none, DGELU, DGELU_BGRAD with an f32
// or bf16 bias gradient) it asks the heuristic for up to 8 candidates and
// times each (CUDA events, median of 20 after 3 warm-up), then checks that
// the first candidate's output and bias gradient are the same bits on a
// second run. Run on a GPU machine:
//   tools/gemm_epilogue_probe [rows width hidden]
// Why it matters: graph/ops/linear.cc's LinearGeluBackwardInput runs DGELU,
// and the bias gradient of the first linear is a column-sum kernel after it.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tools/probe_check.h"

namespace {

__global__ void Fill(__nv_bfloat16* values, long count, unsigned seed,
                     float scale) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  unsigned x = static_cast<unsigned>(i) * 2654435761u + seed * 97u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  values[i] = __float2bfloat16(scale * ((x & 0xffff) / 32768.0f - 1.0f));
}

struct Variant {
  const char* name;
  cublasLtEpilogue_t epilogue;
  cudaDataType bias_type;  // DGELU_BGRAD's bias gradient
};

}  // namespace

int main(int argc, char** argv) {
  const long rows = argc > 3 ? std::atol(argv[1]) : 16384;
  const long width = argc > 3 ? std::atol(argv[2]) : 768;
  const long hidden = argc > 3 ? std::atol(argv[3]) : 3072;
  const long m = hidden, n = rows, k = width;
  __nv_bfloat16 *w2 = nullptr, *dy = nullptr, *h = nullptr, *d = nullptr;
  void* bias = nullptr;
  void* workspace = nullptr;
  const size_t workspace_bytes = size_t{32} << 20;
  PROBE_CHECK(cudaMalloc(&w2, width * hidden * 2));
  PROBE_CHECK(cudaMalloc(&dy, rows * width * 2));
  PROBE_CHECK(cudaMalloc(&h, rows * hidden * 2));
  PROBE_CHECK(cudaMalloc(&d, rows * hidden * 2));
  PROBE_CHECK(cudaMalloc(&bias, hidden * 4));
  PROBE_CHECK(cudaMalloc(&workspace, workspace_bytes));
  Fill<<<(width * hidden + 255) / 256, 256>>>(w2, width * hidden, 1, 0.05f);
  Fill<<<(rows * width + 255) / 256, 256>>>(dy, rows * width, 2, 1.0f);
  Fill<<<(rows * hidden + 255) / 256, 256>>>(h, rows * hidden, 3, 3.0f);
  PROBE_CHECK(cudaDeviceSynchronize());

  cublasLtHandle_t handle;
  PROBE_CHECK(cublasLtCreate(&handle));
  cudaEvent_t start, stop;
  PROBE_CHECK(cudaEventCreate(&start));
  PROBE_CHECK(cudaEventCreate(&stop));
  const double flops = 2.0 * m * n * k;
  std::printf("rows %ld width %ld hidden %ld: m %ld n %ld k %ld, %.1f GFLOP\n",
              rows, width, hidden, m, n, k, flops / 1e9);

  const Variant variants[] = {
      {"none", CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF},
      {"dgelu", CUBLASLT_EPILOGUE_DGELU, CUDA_R_16BF},
      {"dgelu_bgrad f32 bias", CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_32F},
      {"dgelu_bgrad bf16 bias", CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_16BF},
  };
  for (const Variant& v : variants) {
    cublasLtMatmulDesc_t desc;
    PROBE_CHECK(
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op = CUBLAS_OP_N;
    PROBE_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof(op)));
    PROBE_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof(op)));
    PROBE_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &v.epilogue, sizeof(v.epilogue)));
    if (v.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
      const int64_t ld_aux = m;
      const cudaDataType aux_type = CUDA_R_16BF;
      PROBE_CHECK(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &h, sizeof(h)));
      PROBE_CHECK(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof(ld_aux)));
      PROBE_CHECK(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
          sizeof(aux_type)));
    }
    if (v.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
      PROBE_CHECK(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      PROBE_CHECK(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &v.bias_type,
          sizeof(v.bias_type)));
    }
    cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
    PROBE_CHECK(cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_16BF, m, k, m));
    PROBE_CHECK(cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_16BF, k, n, k));
    PROBE_CHECK(cublasLtMatrixLayoutCreate(&layout_d, CUDA_R_16BF, m, n, m));
    cublasLtMatmulPreference_t preference;
    PROBE_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    PROBE_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
        sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t results[8];
    int found = 0;
    const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
        handle, desc, layout_a, layout_b, layout_d, layout_d, preference, 8,
        results, &found);
    std::printf("%s: heuristic status %d, %d candidates\n", v.name,
                static_cast<int>(heuristic), found);
    const float alpha = 1.0f, beta = 0.0f;
    for (int c = 0; c < found; ++c) {
      auto run = [&]() {
        return cublasLtMatmul(handle, desc, &alpha, w2, layout_a, dy, layout_b,
                              &beta, d, layout_d, d, layout_d, &results[c].algo,
                              workspace, workspace_bytes, 0);
      };
      bool ok = true;
      for (int i = 0; i < 3 && ok; ++i) ok = run() == CUBLAS_STATUS_SUCCESS;
      if (!ok) {
        std::printf("  candidate %d: does not run\n", c);
        continue;
      }
      std::vector<float> times;
      for (int i = 0; i < 20; ++i) {
        PROBE_CHECK(cudaEventRecord(start));
        PROBE_CHECK(run());
        PROBE_CHECK(cudaEventRecord(stop));
        PROBE_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        PROBE_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
      }
      std::sort(times.begin(), times.end());
      const double us = 1e3 * times[times.size() / 2];
      int tile = -1, stages = -1, splitk = -1;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&results[c].algo,
                                           CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                           sizeof(tile), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&results[c].algo,
                                           CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                           &stages, sizeof(stages), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&results[c].algo,
                                           CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                           &splitk, sizeof(splitk), &written);
      std::printf(
          "  candidate %d: %8.1f us, %6.1f TFLOP/s (tile %d, stages %d, "
          "split-k %d, workspace %zu)\n",
          c, us, flops / (us * 1e-6) / 1e12, tile, stages, splitk,
          results[c].workspaceSize);
    }
    if (found > 0) {
      // Run to run: the first candidate twice, output and bias gradient.
      std::vector<unsigned short> first(m * n), again(m * n);
      std::vector<float> bias_first(hidden), bias_again(hidden);
      for (int pass = 0; pass < 2; ++pass) {
        PROBE_CHECK(cudaMemset(d, 0xff, m * n * 2));
        PROBE_CHECK(cudaMemset(bias, 0xff, hidden * 4));
        PROBE_CHECK(cublasLtMatmul(handle, desc, &alpha, w2, layout_a, dy,
                                   layout_b, &beta, d, layout_d, d, layout_d,
                                   &results[0].algo, workspace, workspace_bytes,
                                   0));
        PROBE_CHECK(cudaMemcpy(pass == 0 ? first.data() : again.data(), d,
                               m * n * 2, cudaMemcpyDeviceToHost));
        PROBE_CHECK(
            cudaMemcpy(pass == 0 ? bias_first.data() : bias_again.data(), bias,
                       hidden * 4, cudaMemcpyDeviceToHost));
      }
      const bool same_d = first == again;
      const bool same_bias =
          std::memcmp(bias_first.data(), bias_again.data(), hidden * 4) == 0;
      std::printf("  first candidate run to run: output %s, bias %s\n",
                  same_d ? "same bits" : "DIFFERENT",
                  v.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD
                      ? (same_bias ? "same bits" : "DIFFERENT")
                      : "-");
    }
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(layout_d);
    cublasLtMatrixLayoutDestroy(layout_b);
    cublasLtMatrixLayoutDestroy(layout_a);
    cublasLtMatmulDescDestroy(desc);
  }
  std::printf("done\n");
  return 0;
}
