// Probe: does compute-sanitizer's initcheck see the stores of cuBLASLt's Hopper
// kernels? A bf16 GEMM writes C [1024, 1024] f32 into fresh cudaMalloc memory,
// then a kernel of ours sums C. Mode 0: nothing else (initcheck reports the
// sum's reads of C as uninitialized if it misses the GEMM's TMA stores);
// mode 1: C is zeroed with cudaMemset before the GEMM; mode 2: a plain kernel
// writes C instead of the GEMM (the controls: no report expected). Prints the
// sum (the GEMM's result, so it did write C). Run on a GPU machine:
//   compute-sanitizer --tool initcheck --print-limit 3 tools/initcheck_probe 0
// Why it matters: tools/run_gpu_tests.sh --sanitize=initcheck sets
// LOSSRT_INITCHECK_GEMM_OUTPUTS=1 (runtime/cuda_gemm.h) because of mode 0.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>

#include "tools/probe_check.h"

namespace {

__global__ void Fill(__nv_bfloat16* values, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) values[i] = __float2bfloat16(0.01f * (i % 7));
}

__global__ void Sum(const float* values, int count, float* sum) {
  float part = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) part += values[i];
  atomicAdd(sum, part);
}

__global__ void WriteOnes(float* values, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) values[i] = 1.0f;
}

}  // namespace

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  constexpr int m = 1024, n = 1024, k = 1024;
  __nv_bfloat16 *a = nullptr, *b = nullptr;  // [m, k], [n, k]
  float *c = nullptr, *sum = nullptr;        // [n, m] column-major, [1]
  PROBE_CHECK(cudaMalloc(&a, m * k * 2));
  PROBE_CHECK(cudaMalloc(&b, n * k * 2));
  PROBE_CHECK(cudaMalloc(&c, m * n * 4));
  PROBE_CHECK(cudaMalloc(&sum, 4));
  Fill<<<(m * k + 255) / 256, 256>>>(a, m * k);
  Fill<<<(n * k + 255) / 256, 256>>>(b, n * k);
  PROBE_CHECK(cudaMemset(sum, 0, 4));
  if (mode == 1) PROBE_CHECK(cudaMemset(c, 0, m * n * 4));
  if (mode == 2) {
    WriteOnes<<<(m * n + 255) / 256, 256>>>(c, m * n);
  } else {
    cublasLtHandle_t handle;
    PROBE_CHECK(cublasLtCreate(&handle));
    cublasLtMatmulDesc_t desc;
    PROBE_CHECK(
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
    PROBE_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
    PROBE_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c;
    PROBE_CHECK(cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_16BF, k, m, k));
    PROBE_CHECK(cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_16BF, k, n, k));
    PROBE_CHECK(cublasLtMatrixLayoutCreate(&layout_c, CUDA_R_32F, m, n, m));
    void* workspace = nullptr;
    size_t workspace_bytes = size_t{32} << 20;
    PROBE_CHECK(cudaMalloc(&workspace, workspace_bytes));
    cublasLtMatmulPreference_t preference;
    PROBE_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    PROBE_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
        sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    PROBE_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, layout_a, layout_b,
                                               layout_c, layout_c, preference,
                                               1, &heuristic, &found));
    if (found == 0) {
      std::printf("cuBLASLt offers no algorithm\n");
      return 1;
    }
    const float alpha = 1.0f, beta = 0.0f;
    PROBE_CHECK(cublasLtMatmul(handle, desc, &alpha, a, layout_a, b, layout_b,
                               &beta, c, layout_c, c, layout_c, &heuristic.algo,
                               workspace, workspace_bytes, nullptr));
  }
  Sum<<<1, 256>>>(c, m * n, sum);
  float host_sum = 0.0f;
  PROBE_CHECK(cudaMemcpy(&host_sum, sum, 4, cudaMemcpyDeviceToHost));
  std::printf("mode %d sum %g\n", mode, host_sum);
  return 0;
}
