// Probe: do cuDNN's fused matmul graphs run the GELU MLP's two GELU GEMMs
// faster than cuBLASLt's epilogues? In the GPT-2 step (bench/RESULTS.md,
// H100: cuDNN's atomic dQ, and the GELU epilogues probed) cuBLASLt's GELU-aux
// forward takes about 174 us and its DGELU backward about 167 us, against
// 117-124 us for the same GEMMs without an epilogue. The two graphs, bf16
// row-major tensors, fp32 compute:
//   forward:  pre [rows, hidden] = x [rows, width] w1^T + b1 (saved),
//             h = gelu_tanh(pre)
//   backward: d_pre [rows, hidden] = gelu_tanh'(pre) * (dy [rows, width] w2),
//             w2 [width, hidden]
// For each it builds every engine cuDNN's heuristics (modes A and FALLBACK)
// offer, times each plan that builds (CUDA events, median of 20 after 3
// warm-up), checks the first plan against a double-precision host reference
// on a few rows, and checks that a second run gives the same bits. Run on a
// GPU machine (libcudnn on LD_LIBRARY_PATH, as for the staged binaries):
//   tools/cudnn_gelu_probe [rows width hidden]
// The frontend's JSON serialization is not needed: the header compiles faster.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
// The weak NVRTC references go before the frontend.
// clang-format off
#include "third_party/cudnn_frontend_weak_nvrtc.h"
#include <cudnn_frontend.h>
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "tools/probe_check.h"

namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

#define PROBE_FE_CHECK(call)                                    \
  do {                                                          \
    fe::error_t probe_error = (call);                           \
    if (probe_error.is_bad()) {                                 \
      std::printf("%s failed: %s (line %d)\n", #call,           \
                  probe_error.get_message().c_str(), __LINE__); \
      return 1;                                                 \
    }                                                           \
  } while (false)

double GeluTanh(double x) {
  const double b = std::sqrt(2.0 / M_PI), c = 0.044715;
  return 0.5 * x * (1.0 + std::tanh(b * (x + c * x * x * x)));
}

double GeluTanhDerivative(double x) {
  const double b = std::sqrt(2.0 / M_PI), c = 0.044715;
  const double t = std::tanh(b * (x + c * x * x * x));
  return 0.5 * (1.0 + t) +
         0.5 * x * (1.0 - t * t) * b * (1.0 + 3.0 * c * x * x);
}

float Bf16ToFloat(__nv_bfloat16 value) {
  const uint16_t bits = static_cast<__nv_bfloat16_raw>(value).x;
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float result;
  std::memcpy(&result, &word, 4);
  return result;
}

__nv_bfloat16 FloatToBf16(float value) {  // round to nearest even
  uint32_t word;
  std::memcpy(&word, &value, 4);
  word += 0x7fffu + ((word >> 16) & 1u);
  __nv_bfloat16_raw raw;
  raw.x = static_cast<uint16_t>(word >> 16);
  return __nv_bfloat16(raw);
}

// Host values (rounded to bf16) and their device copy.
struct Array {
  std::vector<float> host;
  void* device = nullptr;
};

int MakeArray(std::mt19937_64& rng, long count, float scale, Array* array) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<__nv_bfloat16> bits(count);
  array->host.resize(count);
  for (long i = 0; i < count; ++i) {
    bits[i] = FloatToBf16(uniform(rng));
    array->host[i] = Bf16ToFloat(bits[i]);
  }
  PROBE_CHECK(cudaMalloc(&array->device, count * 2));
  PROBE_CHECK(cudaMemcpy(array->device, bits.data(), count * 2,
                         cudaMemcpyHostToDevice));
  return 0;
}

int Download(const void* device, long count, std::vector<float>* host) {
  std::vector<__nv_bfloat16> bits(count);
  PROBE_CHECK(
      cudaMemcpy(bits.data(), device, count * 2, cudaMemcpyDeviceToHost));
  host->resize(count);
  for (long i = 0; i < count; ++i) (*host)[i] = Bf16ToFloat(bits[i]);
  return 0;
}

TensorPtr Tensor2d(fe::graph::Graph& graph, const char* name, long rows,
                   long cols, long row_stride, long col_stride) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_dim({1, rows, cols})
                          .set_stride({rows * cols, row_stride, col_stride})
                          .set_data_type(fe::DataType_t::BFLOAT16));
}

// Times every plan of `graph` that builds; prints them; leaves the first
// built plan selected for the checks (returns its index, or -1).
int TimeAllPlans(cudnnHandle_t handle, fe::graph::Graph& graph,
                 std::unordered_map<TensorPtr, void*>& pack, double flops,
                 cudaEvent_t start, cudaEvent_t stop, int* first_plan) {
  *first_plan = -1;
  const int64_t plans = graph.get_execution_plan_count();
  std::printf("  %ld plans offered\n", static_cast<long>(plans));
  for (int64_t p = 0; p < plans; ++p) {
    if (graph.build_plan_at_index(handle, p).is_bad()) {
      std::printf("  plan %ld: does not build\n", static_cast<long>(p));
      continue;
    }
    int64_t workspace_bytes = 0;
    PROBE_FE_CHECK(graph.get_workspace_size_plan_at_index(p, workspace_bytes));
    void* workspace = nullptr;
    if (workspace_bytes > 0)
      PROBE_CHECK(cudaMalloc(&workspace, workspace_bytes));
    std::vector<float> ms;
    bool ok = true;
    for (int r = 0; r < 23 && ok; ++r) {
      PROBE_CHECK(cudaEventRecord(start));
      ok = graph.execute_plan_at_index(handle, pack, workspace, p).is_good();
      PROBE_CHECK(cudaEventRecord(stop));
      PROBE_CHECK(cudaEventSynchronize(stop));
      float elapsed = 0;
      PROBE_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
      if (r >= 3) ms.push_back(elapsed);
    }
    if (workspace != nullptr) PROBE_CHECK(cudaFree(workspace));
    if (!ok) {
      std::printf("  plan %ld: execute failed\n", static_cast<long>(p));
      continue;
    }
    std::sort(ms.begin(), ms.end());
    const double us = 1e3 * ms[ms.size() / 2];
    std::string name = "?";
    (void)graph.get_plan_name_at_index(p, name);
    std::printf("  plan %ld (%s): %8.1f us, %6.1f TFLOP/s, workspace %ld\n",
                static_cast<long>(p), name.c_str(), us, flops / us / 1e6,
                static_cast<long>(workspace_bytes));
    if (*first_plan < 0) *first_plan = static_cast<int>(p);
  }
  return 0;
}

// Runs plan `p` twice into `out`, downloads both, and reports whether they
// are the same bits.
int RunTwice(cudnnHandle_t handle, fe::graph::Graph& graph,
             std::unordered_map<TensorPtr, void*>& pack, int p, void* out,
             long count, std::vector<float>* values) {
  int64_t workspace_bytes = 0;
  PROBE_FE_CHECK(graph.get_workspace_size_plan_at_index(p, workspace_bytes));
  void* workspace = nullptr;
  if (workspace_bytes > 0) PROBE_CHECK(cudaMalloc(&workspace, workspace_bytes));
  std::vector<float> again;
  PROBE_FE_CHECK(graph.execute_plan_at_index(handle, pack, workspace, p));
  PROBE_CHECK(cudaDeviceSynchronize());
  if (Download(out, count, values) != 0) return 1;
  PROBE_CHECK(cudaMemset(out, 0, count * 2));
  PROBE_FE_CHECK(graph.execute_plan_at_index(handle, pack, workspace, p));
  PROBE_CHECK(cudaDeviceSynchronize());
  if (Download(out, count, &again) != 0) return 1;
  if (workspace != nullptr) PROBE_CHECK(cudaFree(workspace));
  std::printf("  run to run: %s\n",
              std::memcmp(values->data(), again.data(), count * 4) == 0
                  ? "same bits"
                  : "bits differ");
  return 0;
}

// max |got - want| / max |want| over the checked rows.
void Report(const char* what, const std::vector<double>& want,
            const std::vector<double>& got) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  std::printf("  %s against the f64 reference: max |diff| / max |ref| %.2e\n",
              what, scale > 0 ? diff / scale : diff);
}

int BuildGraph(cudnnHandle_t handle, fe::graph::Graph& graph) {
  PROBE_FE_CHECK(graph.validate());
  PROBE_FE_CHECK(graph.build_operation_graph(handle));
  PROBE_FE_CHECK(graph.create_execution_plans(
      {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  PROBE_FE_CHECK(graph.check_support(handle));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const long rows = argc > 3 ? std::atol(argv[1]) : 16384;
  const long width = argc > 3 ? std::atol(argv[2]) : 768;
  const long hidden = argc > 3 ? std::atol(argv[3]) : 3072;
  const double flops = 2.0 * rows * width * hidden;
  std::printf("cuDNN %ld; rows %ld width %ld hidden %ld: %.1f GFLOP a GEMM\n",
              static_cast<long>(cudnnGetVersion()), rows, width, hidden,
              flops / 1e9);
  std::mt19937_64 rng(20261207);
  Array x, w1, b1, dy, w2;
  if (MakeArray(rng, rows * width, 1.0f, &x) != 0 ||
      MakeArray(rng, hidden * width, 0.05f, &w1) != 0 ||
      MakeArray(rng, hidden, 0.5f, &b1) != 0 ||
      MakeArray(rng, rows * width, 1.0f, &dy) != 0 ||
      MakeArray(rng, width * hidden, 0.05f, &w2) != 0) {
    return 1;
  }
  void *pre = nullptr, *h = nullptr, *d_pre = nullptr;
  PROBE_CHECK(cudaMalloc(&pre, rows * hidden * 2));
  PROBE_CHECK(cudaMalloc(&h, rows * hidden * 2));
  PROBE_CHECK(cudaMalloc(&d_pre, rows * hidden * 2));
  cudnnHandle_t handle;
  PROBE_CHECK(cudnnCreate(&handle));
  cudaEvent_t start, stop;
  PROBE_CHECK(cudaEventCreate(&start));
  PROBE_CHECK(cudaEventCreate(&stop));
  // The rows the host reference checks.
  const long checked[] = {0, 1, rows / 2, rows - 1};

  // Forward: pre = x w1^T + b1 (w1 [hidden, width] row-major is the [width,
  // hidden] operand with strides (1, width)), h = gelu(pre).
  std::vector<float> pre_values;
  {
    fe::graph::Graph graph;
    graph.set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tx = Tensor2d(graph, "x", rows, width, width, 1);
    auto tw1 = Tensor2d(graph, "w1t", width, hidden, 1, width);
    auto tb1 = Tensor2d(graph, "b1", 1, hidden, hidden, 1);
    auto product =
        graph.matmul(tx, tw1,
                     fe::graph::Matmul_attributes().set_compute_data_type(
                         fe::DataType_t::FLOAT));
    auto tpre =
        graph.pointwise(product, tb1,
                        fe::graph::Pointwise_attributes()
                            .set_mode(fe::PointwiseMode_t::ADD)
                            .set_compute_data_type(fe::DataType_t::FLOAT));
    tpre->set_output(true).set_data_type(fe::DataType_t::BFLOAT16);
    auto th = graph.pointwise(
        tpre, fe::graph::Pointwise_attributes()
                  .set_mode(fe::PointwiseMode_t::GELU_APPROX_TANH_FWD)
                  .set_compute_data_type(fe::DataType_t::FLOAT));
    th->set_output(true).set_data_type(fe::DataType_t::BFLOAT16);
    std::printf("forward: matmul + bias + GELU (tanh), pre-activation saved\n");
    if (BuildGraph(handle, graph) != 0) {
      std::printf("  not supported\n");
    } else {
      std::unordered_map<TensorPtr, void*> pack = {{tx, x.device},
                                                   {tw1, w1.device},
                                                   {tb1, b1.device},
                                                   {tpre, pre},
                                                   {th, h}};
      int first = -1;
      if (TimeAllPlans(handle, graph, pack, flops, start, stop, &first) != 0)
        return 1;
      if (first >= 0) {
        std::vector<float> h_values;
        if (RunTwice(handle, graph, pack, first, h, rows * hidden, &h_values) !=
                0 ||
            Download(pre, rows * hidden, &pre_values) != 0) {
          return 1;
        }
        std::vector<double> want_pre, got_pre, want_h, got_h;
        for (long r : checked) {
          for (long j = 0; j < hidden; ++j) {
            double sum = b1.host[j];
            for (long k = 0; k < width; ++k)
              sum += double{x.host[r * width + k]} * w1.host[j * width + k];
            want_pre.push_back(sum);
            got_pre.push_back(pre_values[r * hidden + j]);
            // GELU of the pre-activation as saved (bf16), as the next
            // layer's reference would take it.
            want_h.push_back(GeluTanh(pre_values[r * hidden + j]));
            got_h.push_back(h_values[r * hidden + j]);
          }
        }
        Report("pre", want_pre, got_pre);
        Report("h", want_h, got_h);
      }
    }
  }

  // Backward: d_pre = gelu'(pre) * (dy w2); pre from the forward (or, where
  // the forward did not run, x's values reused as stand-in inputs).
  {
    if (pre_values.empty()) {
      std::printf("backward: no forward output; pre filled from x\n");
      PROBE_CHECK(cudaMemcpy(pre, x.device,
                             std::min(rows * width, rows * hidden) * 2,
                             cudaMemcpyDeviceToDevice));
      if (Download(pre, rows * hidden, &pre_values) != 0) return 1;
    }
    fe::graph::Graph graph;
    graph.set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tdy = Tensor2d(graph, "dy", rows, width, width, 1);
    auto tw2 = Tensor2d(graph, "w2", width, hidden, hidden, 1);
    auto tpre = Tensor2d(graph, "pre", rows, hidden, hidden, 1);
    auto product =
        graph.matmul(tdy, tw2,
                     fe::graph::Matmul_attributes().set_compute_data_type(
                         fe::DataType_t::FLOAT));
    // Backward pointwise modes take dy first, then the forward's input.
    auto td_pre =
        graph.pointwise(product, tpre,
                        fe::graph::Pointwise_attributes()
                            .set_mode(fe::PointwiseMode_t::GELU_APPROX_TANH_BWD)
                            .set_compute_data_type(fe::DataType_t::FLOAT));
    td_pre->set_output(true).set_data_type(fe::DataType_t::BFLOAT16);
    std::printf("backward: matmul + GELU (tanh) derivative\n");
    if (BuildGraph(handle, graph) != 0) {
      std::printf("  not supported\n");
    } else {
      std::unordered_map<TensorPtr, void*> pack = {
          {tdy, dy.device}, {tw2, w2.device}, {tpre, pre}, {td_pre, d_pre}};
      int first = -1;
      if (TimeAllPlans(handle, graph, pack, flops, start, stop, &first) != 0)
        return 1;
      if (first >= 0) {
        std::vector<float> got;
        if (RunTwice(handle, graph, pack, first, d_pre, rows * hidden, &got) !=
            0) {
          return 1;
        }
        std::vector<double> want, have;
        for (long r : checked) {
          for (long j = 0; j < hidden; ++j) {
            double sum = 0;
            for (long k = 0; k < width; ++k)
              sum += double{dy.host[r * width + k]} * w2.host[k * hidden + j];
            want.push_back(sum *
                           GeluTanhDerivative(pre_values[r * hidden + j]));
            have.push_back(got[r * hidden + j]);
          }
        }
        Report("d_pre", want, have);
      }
    }
  }
  cudnnDestroy(handle);
  std::printf("done\n");
  return 0;
}
