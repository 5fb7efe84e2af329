// Training-step benchmark: a GPT-2-small-shaped model (12 layers, width 768,
// 12 heads, context 1024, vocab 50304, tied head, bf16 activations, fp32
// master weights and AdamW) trained on random tokens, with the fused linear
// cross-entropy head and, for comparison, the unfused head (full logits + the
// cross-entropy op). Reports the median step time over timed steps after
// warm-up, tokens/s, peak memory, model FLOPs utilization against the
// datasheet peak and against a bf16 cuBLASLt GEMM measured in the same run, and
// a per-op breakdown of one step.
//
// Data parallel in one process (--gpus=N): one thread per rank, rank i on
// cuda:i with its own Context, model and Trainer, the ranks in one NCCL group;
// each GPU trains on --batch sequences a step (the global batch is N times
// that) and the gradients are all-reduced in --bucket_mib buckets (--zero1:
// reduce-scattered, the AdamW moments sharded). The report adds tokens/s per
// GPU and in all, and the scaling: the N GPUs' tokens/s over one GPU's with
// the same per-GPU batch, measured first in the same run (--baseline) on
// cuda:0 alone without a communicator. --gpus=1 with --bucket_mib, --zero1 or
// --force_communicator runs a 1-rank NCCL group, so that the data-parallel
// code paths run on one GPU.
//
//   ./bazelw run -c opt //bench:train_step
//   ./bazelw run -c opt //bench:train_step -- --lm_heads=fused --steps=50
//       --json=/tmp/train_step.jsonl
//   ./bazelw run -c opt //bench:train_step -- --gpus=8 --zero1
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/train_step_options.h"
#include "graph/ops/attention.h"
#include "runtime/device.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "bench/bench_util.h"
#include "bench/rank_threads.h"
#include "graph/gpt.h"
#include "graph/trainer.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/nccl_communicator.h"
#endif  // LOSSRT_WITH_CUDA

ABSL_FLAG(int32_t, batch, 16, "Sequences per step (per GPU with --gpus).");
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
ABSL_FLAG(bool, profile, true,
          "Print a per-op time breakdown of one step (of the one-GPU run "
          "without a communicator: the baseline when data-parallel).");
ABSL_FLAG(int64_t, lce_workspace_mb, 1024,
          "Temporary-memory budget of the fused head (MiB).");
ABSL_FLAG(bool, lce_operand_dtype_logits, false,
          "the fused head's LinearCrossEntropyOptions::operand_dtype_logits: "
          "the cross-entropy on bf16 logits, as PyTorch's bf16 head");
ABSL_FLAG(bool, cuda_graph, true,
          "Replay each step's forward and backward from a CUDA graph. With "
          "NCCL and one micro-batch the gradient buckets' all-reduces are "
          "captured into it, overlapping the backward as without a graph.");
ABSL_FLAG(std::string, json, "", "Append one JSON line per head here.");
ABSL_FLAG(
    std::string, attention, "auto",
    "The attention op's GPU kernel: auto (the op's default), flash (ours), "
    "cudnn (cuDNN's fused attention) or cublas.");
ABSL_FLAG(bool, attention_deterministic, true,
          "CausalAttentionOptions::deterministic: cuDNN's deterministic "
          "backward (false: its atomic dQ, PyTorch's default; bits vary run "
          "to run).");
ABSL_FLAG(int32_t, gpus, 1,
          "Data-parallel GPUs in this process, 1 to 1024: rank i on cuda:i, "
          "one thread each, over NCCL; each trains --batch sequences a step.");
ABSL_FLAG(double, bucket_mib, lossrt::bench::kBucketMibUnset,
          "Data parallel: MiB of gradients per all-reduce bucket; 0: one "
          "all-reduce of every gradient after the backward. Unset (-1): 25 "
          "MiB with --gpus > 1, no communicator with --gpus=1; given with "
          "--gpus=1, a 1-rank NCCL group runs the bucket code path. --zero1 "
          "reduce-scatters the whole buffer at once (no buckets).");
ABSL_FLAG(bool, zero1, false,
          "Data parallel: shard the AdamW moments over the ranks (ZeRO-1: "
          "reduce-scatter, update a shard, all-gather); with --gpus=1 a "
          "1-rank NCCL group runs that code path.");
ABSL_FLAG(bool, force_communicator, false,
          "Build the NCCL group even with --gpus=1 (the data-parallel code "
          "paths on one GPU).");
ABSL_FLAG(
    bool, gemm_tuning, true,
    "Time cuBLASLt's candidates on each GEMM shape's first call (off: the "
    "heuristic's first choice; the same bits either way). Off, with "
    "--gemm_rate=false, for runs under compute-sanitizer, where the "
    "timing runs take minutes.");
ABSL_FLAG(bool, gemm_rate, true,
          "Measure a bf16 8192^3 GEMM first, for the 'of GEMM rate' figures "
          "(off: they are 0).");
ABSL_FLAG(bool, baseline, true,
          "Data parallel: first measure one GPU (cuda:0, the same per-GPU "
          "batch, no communicator) for the scaling.");

namespace lossrt {
namespace {

using bench::TrainStepOptions;

TrainStepOptions OptionsFromFlags() {
  TrainStepOptions o;
  o.batch = absl::GetFlag(FLAGS_batch);
  o.seq = absl::GetFlag(FLAGS_seq);
  o.layers = absl::GetFlag(FLAGS_layers);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.width = absl::GetFlag(FLAGS_width);
  o.vocab = absl::GetFlag(FLAGS_vocab);
  o.lm_heads = absl::GetFlag(FLAGS_lm_heads);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  o.lce_workspace_mb = absl::GetFlag(FLAGS_lce_workspace_mb);
  o.lce_operand_dtype_logits = absl::GetFlag(FLAGS_lce_operand_dtype_logits);
  o.gpus = absl::GetFlag(FLAGS_gpus);
  o.bucket_mib = absl::GetFlag(FLAGS_bucket_mib);
  o.zero1 = absl::GetFlag(FLAGS_zero1);
  o.force_communicator = absl::GetFlag(FLAGS_force_communicator);
  o.baseline = absl::GetFlag(FLAGS_baseline);
  return o;
}

#ifdef LOSSRT_WITH_CUDA
using graph::Gpt;
using graph::GptConfig;
using graph::Trainer;

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

// One rank's measurement: its median step time, last loss and peak memory.
struct RankResult {
  double step_ms = 0;
  double peak_gb = 0;
  float loss = 0;
  bool cuda_graph = false;
  double flops_per_step = 0;
};

// Trains `head` on `context` for the warm-up and timed steps: alone
// (`communicator` null) or as rank `rank` of the communicator's group, on this
// rank's own random tokens. `profile`: then one step's per-op breakdown.
absl::StatusOr<RankResult> TrainRank(const TrainStepOptions& o,
                                     const std::string& head, int rank,
                                     Context& context,
                                     Communicator* communicator, bool profile) {
  if (!absl::GetFlag(FLAGS_gemm_tuning)) {
    RETURN_IF_ERROR(context.set_gemm_tuning(false));
  }
  GptConfig config;
  config.layers = o.layers;
  config.heads = o.heads;
  config.width = o.width;
  config.vocab = o.vocab;
  config.context = o.seq;
  const graph::BatchShape shape{o.batch, o.seq};
  // Nothing to switch off for the CUDA graph: the ops detect the capture.
  LinearCrossEntropyOptions options;
  options.max_workspace_bytes = o.lce_workspace_mb << 20;
  options.operand_dtype_logits = o.lce_operand_dtype_logits;
  ops::CausalAttentionOptions attention;
  ASSIGN_OR_RETURN(attention.kernel,
                   ops::ParseAttentionKernel(absl::GetFlag(FLAGS_attention)));
  attention.deterministic = absl::GetFlag(FLAGS_attention_deterministic);
  ASSIGN_OR_RETURN(std::unique_ptr<Gpt> model,
                   Gpt::Create(context, config, shape, DType::kBF16,
                               head == "fused" ? graph::GptHead::kFusedLoss
                                               : graph::GptHead::kUnfusedLoss,
                               options, attention));
  // The same seed on every rank: data parallelism starts from equal weights.
  RETURN_IF_ERROR(model->Initialize(1234));
  graph::TrainerOptions trainer_options;
  trainer_options.schedule = {6e-4f, 6e-5f, 10, 1000};
  trainer_options.cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
  trainer_options.communicator = communicator;
  trainer_options.bucket_bytes = bench::BucketBytes(o.bucket_mib);
  trainer_options.shard_optimizer_state = o.zero1;
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                   Trainer::Create(*model, trainer_options));
  // Random tokens below GPT-2's 50257, as the PyTorch reference draws them;
  // each rank its own (rank 0 the same as one GPU alone).
  std::mt19937_64 engine(42 + 1000003 * static_cast<uint64_t>(rank));
  const int64_t rows = shape.rows();
  std::vector<int32_t> ids(rows), targets(rows);  // [batch * seq]
  const int64_t token_range = std::min<int64_t>(50257, config.vocab);
  auto draw = [&] {
    for (int64_t i = 0; i < rows; ++i) {
      ids[i] = static_cast<int32_t>(engine() % token_range);
      targets[i] = static_cast<int32_t>(engine() % token_range);
    }
  };
  for (int64_t i = 0; i < o.warmup; ++i) {
    draw();
    RETURN_IF_ERROR(trainer->Step(ids, targets).status());
  }
  RETURN_IF_ERROR(context.Synchronize());
  context.allocator().ResetPeak();
  RankResult result;
  std::vector<double> times;
  for (int64_t i = 0; i < o.steps; ++i) {
    draw();
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(Trainer::StepStats stats, trainer->Step(ids, targets));
    RETURN_IF_ERROR(context.Synchronize());
    times.push_back(std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count());
    result.loss = stats.loss;
  }
  ASSIGN_OR_RETURN(result.step_ms, bench::MedianMs(times));
  result.peak_gb = context.allocator().peak_bytes() / 1e9;
  result.cuda_graph = model->graph().has_cuda_graph();
  result.flops_per_step = model->TrainingFlopsPerStep();
  if (profile) {
    draw();
    RETURN_IF_ERROR(ProfileStep(*model, ids, targets));
  }
  return result;
}

// One head's figures, over `gpus` GPUs (rank 0's loss and peak memory, the
// slowest rank's median step).
struct Result {
  std::string head;
  int64_t gpus = 1;
  bool communicator = false;
  RankResult rank0;
  double step_ms = 0;
  bench::Throughput throughput;
  std::optional<double> baseline_tokens_per_s;
  double mfu = 0;  // per GPU
  double gemm_fraction = 0;
};

// Runs `head` on GPUs 0 to gpus - 1: on this thread without a communicator
// (gpus = 1, !data_parallel), else one thread per rank in one NCCL group.
absl::StatusOr<Result> RunHead(const TrainStepOptions& o,
                               const std::string& head, int gpus,
                               bool data_parallel, bool profile) {
  std::vector<RankResult> ranks(gpus);
  if (!data_parallel) {
    ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                     Context::Create(Device::Cuda(0)));
    ASSIGN_OR_RETURN(ranks[0],
                     TrainRank(o, head, 0, *context, nullptr, profile));
  } else {
    // As examples/train_lm's --gpus: one unique id for the group, each rank
    // joins on its own GPU; a rank that fails aborts the group so that the
    // others fail too instead of waiting in a collective.
    ASSIGN_OR_RETURN(const std::string nccl_id,
                     NcclCommunicator::NewUniqueId());
    RETURN_IF_ERROR(bench::RunRankThreads(gpus, [&](int rank) -> absl::Status {
      // Declared before what uses them: the trainer goes before the
      // communicator, the communicator before the context.
      std::unique_ptr<Context> context;
      std::unique_ptr<NcclCommunicator> nccl;
      absl::Status status = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(context, Context::Create(Device::Cuda(rank)));
        ASSIGN_OR_RETURN(
            nccl, NcclCommunicator::Create(nccl_id, rank, gpus, *context));
        ASSIGN_OR_RETURN(ranks[rank], TrainRank(o, head, rank, *context,
                                                nccl.get(), /*profile=*/false));
        return absl::OkStatus();
      }();
      if (!status.ok() && nccl != nullptr) {
        nccl->Abort(absl::StrCat("rank ", rank, ": ", status.message()))
            .IgnoreError();
      }
      return status;
    }));
  }
  Result result;
  result.head = head;
  result.gpus = gpus;
  result.communicator = data_parallel;
  result.rank0 = ranks[0];
  for (const RankResult& rank : ranks) {
    result.step_ms = std::max(result.step_ms, rank.step_ms);
  }
  return result;
}

// Fills in the throughput, the scaling and the utilization.
void Summarize(const TrainStepOptions& o, double gemm_tflops,
               std::optional<double> baseline_tokens_per_s, Result& r) {
  r.baseline_tokens_per_s = baseline_tokens_per_s;
  r.throughput = bench::MeasureThroughput(r.gpus, o.batch * o.seq, r.step_ms,
                                          baseline_tokens_per_s);
  const double tflops = r.rank0.flops_per_step / (r.step_ms * 1e-3) / 1e12;
  r.mfu = tflops / o.peak_tflops;
  r.gemm_fraction = gemm_tflops > 0 ? tflops / gemm_tflops : 0.0;
}

// A JSON number with `digits` decimals, or null.
std::string JsonNumber(std::optional<double> value, int digits) {
  return value.has_value() ? absl::StrFormat("%.*f", digits, *value) : "null";
}

// The bucket size in MiB as the trainer gets it (0: one all-reduce).
std::string BucketMib(const TrainStepOptions& o) {
  if (o.bucket_mib == 0) return "0";
  return absl::StrFormat("%.6g", bench::BucketBytes(o.bucket_mib) / 1048576.0);
}

// The gradients' collectives of a data-parallel step.
std::string Collectives(const TrainStepOptions& o) {
  // ZeRO-1 reduce-scatters the whole buffer at once: no buckets.
  if (o.zero1) {
    return "ZeRO-1: one reduce-scatter and one all-gather a step, sharded "
           "AdamW moments";
  }
  if (o.bucket_mib == 0) return "one all-reduce after the backward";
  return absl::StrCat(BucketMib(o), " MiB all-reduce buckets");
}

void PrintResult(const TrainStepOptions& o, const Result& r) {
  const double tflops = r.mfu * o.peak_tflops;
  std::string where;
  if (r.communicator) {
    where = absl::StrFormat(", %d GPU%s over NCCL (%s)", r.gpus,
                            r.gpus == 1 ? "" : "s", Collectives(o));
  } else if (r.baseline_tokens_per_s.has_value() || o.gpus > 1 ||
             bench::UsesCommunicator(o)) {
    where = ", 1 GPU alone (baseline)";
  }
  std::printf(
      "%s head%s, %s attention%s%s: %.2f ms/step, %.1fK tokens/s per GPU, "
      "%.1fK in all, peak %.2f GB, %.1f TFLOP/s per GPU = MFU %.1f%% of %.0f, "
      "%.1f%% of the measured GEMM rate; loss %.3f\n",
      r.head.c_str(), r.rank0.cuda_graph ? " (CUDA graph)" : "",
      absl::GetFlag(FLAGS_attention).c_str(),
      absl::GetFlag(FLAGS_attention_deterministic) ? "" : " (nondeterministic)",
      where.c_str(), r.step_ms, r.throughput.tokens_per_s_per_gpu / 1e3,
      r.throughput.tokens_per_s_total / 1e3, r.rank0.peak_gb, tflops,
      100 * r.mfu, o.peak_tflops, 100 * r.gemm_fraction, r.rank0.loss);
  if (r.throughput.scaling.has_value()) {
    std::printf(
        "  scaling: %.3fx one GPU's %.1fK tokens/s on %d GPU%s (efficiency "
        "%.1f%%)\n",
        *r.throughput.scaling, *r.baseline_tokens_per_s / 1e3,
        static_cast<int>(r.gpus), r.gpus == 1 ? "" : "s",
        100 * *r.throughput.efficiency);
  }
  std::fflush(stdout);
}

absl::Status Run(const TrainStepOptions& o) {
  const bool data_parallel = bench::UsesCommunicator(o);
  double gemm_tflops = 0;
  {
    ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                     Context::Create(Device::Cuda(0)));
    ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(context->device()));
    if (absl::GetFlag(FLAGS_gemm_rate)) {
      ASSIGN_OR_RETURN(gemm_tflops, bench::GemmTflops(*context, 8192));
    }
    std::printf("device: %s; bf16 GEMM 8192^3: %s\n", info.name.c_str(),
                gemm_tflops > 0
                    ? absl::StrFormat("%.0f TFLOP/s", gemm_tflops).c_str()
                    : "not measured (--gemm_rate=false)");
  }
  std::printf(
      "model: %d layers, width %d, %d heads, vocab %d; batch %d x %d "
      "tokens%s, bf16\n",
      static_cast<int>(o.layers), static_cast<int>(o.width),
      static_cast<int>(o.heads), static_cast<int>(o.vocab),
      static_cast<int>(o.batch), static_cast<int>(o.seq),
      data_parallel ? " per GPU" : "");
  if (data_parallel) {
    std::printf("data parallel: %d GPU%s over NCCL, %s%s\n",
                static_cast<int>(o.gpus), o.gpus == 1 ? "" : "s",
                Collectives(o).c_str(),
                o.baseline ? "; one GPU alone first, for the scaling" : "");
  }
  const bool profile = absl::GetFlag(FLAGS_profile);
  std::vector<Result> results;
  for (const std::string& head : bench::LmHeads(o)) {
    std::optional<double> baseline_tokens_per_s;
    if (data_parallel && o.baseline) {
      ASSIGN_OR_RETURN(Result alone,
                       RunHead(o, head, 1, /*data_parallel=*/false, profile));
      Summarize(o, gemm_tflops, std::nullopt, alone);
      PrintResult(o, alone);
      baseline_tokens_per_s = alone.throughput.tokens_per_s_total;
    }
    ASSIGN_OR_RETURN(Result result,
                     RunHead(o, head, static_cast<int>(o.gpus), data_parallel,
                             profile && !data_parallel));
    Summarize(o, gemm_tflops, baseline_tokens_per_s, result);
    PrintResult(o, result);
    results.push_back(result);
  }
  std::printf(
      "\n| head | GPUs | ms/step | tokens/s per GPU | tokens/s in all | "
      "scaling | peak GB | MFU (of %.0f) | of GEMM rate |\n"
      "|---|---|---|---|---|---|---|---|---|\n",
      o.peak_tflops);
  for (const Result& r : results) {
    std::printf(
        "| %s | %d | %.2f | %.0fK | %.0fK | %s | %.2f | %.1f%% | %.1f%% |\n",
        r.head.c_str(), static_cast<int>(r.gpus), r.step_ms,
        r.throughput.tokens_per_s_per_gpu / 1e3,
        r.throughput.tokens_per_s_total / 1e3,
        r.throughput.scaling.has_value()
            ? absl::StrFormat("%.3fx", *r.throughput.scaling).c_str()
            : "-",
        r.rank0.peak_gb, 100 * r.mfu, 100 * r.gemm_fraction);
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_json), std::ios::app);
    for (const Result& r : results) {
      out << absl::StrFormat(
          "{\"head\": \"%s\", \"attention\": \"%s\", "
          "\"attention_deterministic\": %s, \"batch\": %d, "
          "\"seq\": %d, \"gpus\": %d, "
          "\"communicator\": %s, \"bucket_mib\": %s, \"zero1\": %s, "
          "\"step_ms\": %.4f, \"tokens_per_s\": %.1f, "
          "\"tokens_per_s_per_gpu\": %.1f, \"tokens_per_s_total\": %.1f, "
          "\"baseline_tokens_per_s\": %s, \"scaling\": %s, \"peak_gb\": %.4f, "
          "\"mfu\": %.4f, \"gemm_tflops\": %.1f, \"loss\": %.4f}\n",
          r.head, absl::GetFlag(FLAGS_attention),
          absl::GetFlag(FLAGS_attention_deterministic) ? "true" : "false",
          o.batch, o.seq, r.gpus, r.communicator ? "true" : "false",
          r.communicator ? BucketMib(o) : "null",
          o.zero1 && r.communicator ? "true" : "false", r.step_ms,
          r.throughput.tokens_per_s_total, r.throughput.tokens_per_s_per_gpu,
          r.throughput.tokens_per_s_total,
          JsonNumber(r.baseline_tokens_per_s, 1),
          JsonNumber(r.throughput.scaling, 4), r.rank0.peak_gb, r.mfu,
          gemm_tflops, r.rank0.loss);
    }
    if (!out) {
      return absl::InternalError(absl::StrCat(
          "writing --json=", absl::GetFlag(FLAGS_json), " failed"));
    }
  }
  return absl::OkStatus();
}
#else   // !LOSSRT_WITH_CUDA
absl::Status Run(const TrainStepOptions&) {
  return absl::UnavailableError("built without CUDA; it measures a GPU");
}
#endif  // LOSSRT_WITH_CUDA

}  // namespace
}  // namespace lossrt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times training steps of a GPT-2-small-shaped model on one GPU or, with "
      "--gpus=N, data-parallel on N GPUs over NCCL. See the flags with "
      "--helpfull.");
  absl::ParseCommandLine(argc, argv);
  const lossrt::bench::TrainStepOptions options = lossrt::OptionsFromFlags();
  absl::Status status =
      lossrt::bench::CheckTrainStepOptions(options, lossrt::CudaDeviceCount());
  if (status.ok()) {
    // --attention: a known kernel that this build has.
    const absl::StatusOr<lossrt::ops::AttentionKernel> kernel =
        lossrt::ops::ParseAttentionKernel(absl::GetFlag(FLAGS_attention));
    status = kernel.ok() ? lossrt::ops::AttentionKernelBuilt(*kernel)
                         : kernel.status();
    if (!status.ok()) {
      status = absl::InvalidArgumentError(
          absl::StrCat("--attention: ", status.message()));
    }
  }
  if (status.ok()) status = lossrt::Run(options);
  if (!status.ok()) {
    std::fprintf(stderr, "train_step: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
