// Training-step benchmark: a GPT-2-small-shaped model (12 layers, width 768,
// 12 heads, context 1024, vocab 50304, tied head, bf16 activations, fp32
// master weights and AdamW) trained on random tokens, with the fused linear
// cross-entropy head and, for comparison, the unfused head (full logits + the
// cross-entropy op). Reports the median step time over timed steps after
// warm-up, tokens/s, peak memory, model FLOPs utilization against the
// datasheet peak and against a bf16 cuBLASLt GEMM measured in the same run, and
// a per-op breakdown of one step.
//
//   ./bazelw run -c opt //bench:train_step
//   ./bazelw run -c opt //bench:train_step -- --lm_heads=fused --steps=50
//       --json=/tmp/train_step.jsonl
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#ifdef LOSSRT_WITH_CUDA
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "graph/gpt.h"
#include "graph/trainer.h"
#include "runtime/context.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#include "runtime/status.h"

ABSL_FLAG(int32_t, batch, 16, "Sequences per step.");
ABSL_FLAG(int32_t, seq, 1024, "Tokens per sequence (and the context).");
ABSL_FLAG(int32_t, layers, 12, "Transformer blocks.");
ABSL_FLAG(int32_t, heads, 12, "Attention heads.");
ABSL_FLAG(int32_t, width, 768, "Model width.");
ABSL_FLAG(int32_t, vocab, 50304, "Vocabulary.");
ABSL_FLAG(std::string, lm_heads, "fused,unfused",
          "Heads to measure: fused and/or unfused.");
ABSL_FLAG(int32_t, warmup, 5, "Untimed steps first.");
ABSL_FLAG(int32_t, steps, 20, "Timed steps (the median is reported).");
ABSL_FLAG(double, peak_tflops, 989.0,
          "Datasheet dense bf16 peak of the GPU (H100/H200 SXM: 989).");
ABSL_FLAG(bool, profile, true, "Print a per-op time breakdown of one step.");
ABSL_FLAG(int64_t, lce_workspace_mb, 1024,
          "Temporary-memory budget of the fused head (MiB).");
ABSL_FLAG(bool, cuda_graph, true,
          "Replay each step's forward and backward from a CUDA graph.");
ABSL_FLAG(std::string, json, "", "Append one JSON line per head here.");

namespace lossrt {
namespace {

using graph::Gpt;
using graph::GptConfig;
using graph::Trainer;

// bf16 GEMM throughput (TFLOP/s) of an n^3 cuBLASLt GEMM: the ceiling a
// training step's GEMMs can reach on this GPU today.
absl::StatusOr<double> GemmTflops(Context& context, int64_t n) {
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(GemmRunner * gemm, ContextGemmRunner(context));
  ASSIGN_OR_RETURN(Buffer a, context.allocator().Allocate(n * n * 2));
  ASSIGN_OR_RETURN(Buffer b, context.allocator().Allocate(n * n * 2));
  ASSIGN_OR_RETURN(Buffer d, context.allocator().Allocate(n * n * 2));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.data(), 0, n * n * 2, stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b.data(), 0, n * n * 2, stream));
  GemmCall call;
  call.a = {a.data(), CUDA_R_16BF, n, n, n, CUBLAS_OP_T};
  call.b = {b.data(), CUDA_R_16BF, n, n, n, CUBLAS_OP_N};
  call.d = d.data();
  call.d_type = CUDA_R_16BF;
  call.m = call.n = call.ld_d = n;
  ASSIGN_OR_RETURN(double ms, bench::MedianMs(stream, 3, 10, [&](int) {
                     return gemm->Run(call, stream);
                   }));
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

struct Result {
  std::string head;
  double step_ms = 0;
  double tokens_per_s = 0;
  double peak_gb = 0;
  double mfu = 0;
  double gemm_fraction = 0;
  float loss = 0;
};

// Per node type: milliseconds of forward and backward in one step, timed
// with events around every node (which serializes nothing: events only).
absl::Status ProfileStep(Gpt& model, const std::vector<int32_t>& ids,
                         const std::vector<int32_t>& targets) {
  graph::Graph& g = model.graph();
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(g.context()));
  struct Mark {
    int node;
    bool backward;
    cudaEvent_t begin, end;
  };
  std::vector<Mark> marks;
  g.set_node_observer([&](int node, bool backward, bool begin) -> absl::Status {
    if (begin) {
      marks.push_back({node, backward, nullptr, nullptr});
      CUDA_RETURN_IF_ERROR(cudaEventCreate(&marks.back().begin));
      CUDA_RETURN_IF_ERROR(cudaEventCreate(&marks.back().end));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(marks.back().begin, stream));
    } else {
      CUDA_RETURN_IF_ERROR(cudaEventRecord(marks.back().end, stream));
    }
    return absl::OkStatus();
  });
  cudaEvent_t step_begin, step_end;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_begin));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&step_end));
  // One eager forward and backward (a replayed CUDA graph would not call
  // the observer); the optimizer is not part of it.
  RETURN_IF_ERROR(g.SetInput(model.ids(), ids));
  RETURN_IF_ERROR(g.SetInput(model.targets(), targets));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(step_begin, stream));
  const absl::Status status = g.ForwardBackward(/*use_cuda_graph=*/false);
  CUDA_RETURN_IF_ERROR(cudaEventRecord(step_end, stream));
  g.set_node_observer(nullptr);
  RETURN_IF_ERROR(status);
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::map<std::string, std::pair<double, double>> by_type;
  double nodes_ms = 0;
  for (const Mark& mark : marks) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, mark.begin, mark.end));
    auto& entry = by_type[g.nodes()[mark.node]->type()];
    (mark.backward ? entry.second : entry.first) += ms;
    nodes_ms += ms;
    cudaEventDestroy(mark.begin);
    cudaEventDestroy(mark.end);
  }
  float step_ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&step_ms, step_begin, step_end));
  cudaEventDestroy(step_begin);
  cudaEventDestroy(step_end);
  std::printf("  %-20s %10s %10s\n", "op", "fwd ms", "bwd ms");
  for (const auto& [type, times] : by_type) {
    std::printf("  %-20s %10.3f %10.3f\n", type.c_str(), times.first,
                times.second);
  }
  std::printf(
      "  %-20s %10.3f   (the rest of the %.3f ms step: optimizer, "
      "copies, gaps)\n",
      "all nodes", nodes_ms, step_ms);
  return absl::OkStatus();
}

absl::StatusOr<Result> RunHead(const std::string& head, double gemm_tflops) {
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                   Context::Create(Device::Cuda(0)));
  GptConfig config;
  config.layers = absl::GetFlag(FLAGS_layers);
  config.heads = absl::GetFlag(FLAGS_heads);
  config.width = absl::GetFlag(FLAGS_width);
  config.vocab = absl::GetFlag(FLAGS_vocab);
  config.context = absl::GetFlag(FLAGS_seq);
  const graph::BatchShape shape{absl::GetFlag(FLAGS_batch),
                                absl::GetFlag(FLAGS_seq)};
  // Nothing to switch off for the CUDA graph: the ops detect the capture.
  LinearCrossEntropyOptions options;
  options.max_workspace_bytes = absl::GetFlag(FLAGS_lce_workspace_mb) << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<Gpt> model,
                   Gpt::Create(*context, config, shape, DType::kBF16,
                               head == "fused" ? graph::GptHead::kFusedLoss
                                               : graph::GptHead::kUnfusedLoss,
                               options));
  RETURN_IF_ERROR(model->Initialize(1234));
  graph::TrainerOptions trainer_options;
  trainer_options.schedule = {6e-4f, 6e-5f, 10, 1000};
  trainer_options.cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                   Trainer::Create(*model, trainer_options));
  // Random tokens below GPT-2's 50257, as the PyTorch reference draws them.
  std::mt19937_64 engine(42);
  const int64_t rows = shape.rows();
  std::vector<int32_t> ids(rows), targets(rows);
  auto draw = [&] {
    for (int64_t i = 0; i < rows; ++i) {
      ids[i] = static_cast<int32_t>(engine() %
                                    std::min<int64_t>(50257, config.vocab));
      targets[i] = static_cast<int32_t>(engine() %
                                        std::min<int64_t>(50257, config.vocab));
    }
  };
  Result result;
  result.head = head;
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) {
    draw();
    RETURN_IF_ERROR(trainer->Step(ids, targets).status());
  }
  RETURN_IF_ERROR(context->Synchronize());
  context->allocator().ResetPeak();
  std::vector<double> times;
  for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
    draw();
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(Trainer::StepStats stats, trainer->Step(ids, targets));
    RETURN_IF_ERROR(context->Synchronize());
    times.push_back(std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count());
    result.loss = stats.loss;
  }
  std::sort(times.begin(), times.end());
  result.step_ms = times[times.size() / 2];
  result.tokens_per_s = rows / (result.step_ms * 1e-3);
  result.peak_gb = context->allocator().peak_bytes() / 1e9;
  const double tflops =
      model->TrainingFlopsPerStep() / (result.step_ms * 1e-3) / 1e12;
  result.mfu = tflops / absl::GetFlag(FLAGS_peak_tflops);
  result.gemm_fraction = tflops / gemm_tflops;
  std::printf(
      "%s head%s: %.2f ms/step, %.1fK tokens/s, peak %.2f GB, %.1f TFLOP/s = "
      "MFU %.1f%% of %.0f, %.1f%% of the measured GEMM rate; loss %.3f\n",
      head.c_str(), model->graph().has_cuda_graph() ? " (CUDA graph)" : "",
      result.step_ms, result.tokens_per_s / 1e3, result.peak_gb, tflops,
      100 * result.mfu, absl::GetFlag(FLAGS_peak_tflops),
      100 * result.gemm_fraction, result.loss);
  if (absl::GetFlag(FLAGS_profile)) {
    draw();
    RETURN_IF_ERROR(ProfileStep(*model, ids, targets));
  }
  return result;
}

absl::Status Run() {
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                   Context::Create(Device::Cuda(0)));
  ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(context->device()));
  ASSIGN_OR_RETURN(const double gemm_tflops, GemmTflops(*context, 8192));
  context.reset();
  std::printf("device: %s; bf16 GEMM 8192^3: %.0f TFLOP/s\n", info.name.c_str(),
              gemm_tflops);
  std::printf(
      "model: %d layers, width %d, %d heads, vocab %d; batch %d x %d "
      "tokens, bf16\n",
      absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_width),
      absl::GetFlag(FLAGS_heads), absl::GetFlag(FLAGS_vocab),
      absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_seq));
  std::vector<Result> results;
  for (absl::string_view head :
       absl::StrSplit(absl::GetFlag(FLAGS_lm_heads), ',')) {
    if (head != "fused" && head != "unfused") {
      return InvalidArgument("--lm_heads: unknown head '", head, "'");
    }
    ASSIGN_OR_RETURN(Result result, RunHead(std::string(head), gemm_tflops));
    results.push_back(result);
  }
  std::printf(
      "\n| head | ms/step | tokens/s | peak GB | MFU (of %.0f) | of "
      "GEMM rate |\n|---|---|---|---|---|---|\n",
      absl::GetFlag(FLAGS_peak_tflops));
  for (const Result& r : results) {
    std::printf("| %s | %.2f | %.0fK | %.2f | %.1f%% | %.1f%% |\n",
                r.head.c_str(), r.step_ms, r.tokens_per_s / 1e3, r.peak_gb,
                100 * r.mfu, 100 * r.gemm_fraction);
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_json), std::ios::app);
    for (const Result& r : results) {
      out << absl::StrFormat(
          "{\"head\": \"%s\", \"batch\": %d, \"seq\": %d, \"step_ms\": %.4f, "
          "\"tokens_per_s\": %.1f, \"peak_gb\": %.4f, \"mfu\": %.4f, "
          "\"gemm_tflops\": %.1f, \"loss\": %.4f}\n",
          r.head, absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_seq),
          r.step_ms, r.tokens_per_s, r.peak_gb, r.mfu, gemm_tflops, r.loss);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace lossrt

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = lossrt::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "train_step: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
#else  // !LOSSRT_WITH_CUDA
#include <cstdio>

int main() {
  std::fprintf(stderr, "train_step: built without CUDA; it measures a GPU\n");
  return 1;
}
#endif  // LOSSRT_WITH_CUDA
