// Benchmark of the fused linear cross-entropy
// (`bazel run -c opt //bench:linear_cross_entropy`). For each shape of the
// issue (bf16 hidden and weight, loss and every gradient; d_hidden bf16,
// d_weight f32) it measures in one run, each as the median of CUDA-event
// timings after warm-up:
// - the three plain cuBLAS GEMMs of the same shapes (logits, d_hidden,
//   d_weight; bf16): the ceiling;
// - the unfused path: a GEMM into full fp32 logits, the cross-entropy kernels
//   on them (ce::LaunchRows, bf16 gradient in place), the two gradient GEMMs;
//   and its parts (the GEMMs alone, the cross-entropy kernel alone);
// - the fused call at the default 1 GiB budget (also with a bf16 d_weight,
//   summed over the chunks in fp32 and, fp32_gradient_accumulation off, in
//   bf16), and the curve of its time against max_workspace_bytes from 64 MiB to
//   4 GiB;
// with the peak device memory beyond inputs and gradient outputs (the context
// allocator's peak), and checks the fused results against the unfused ones
// (exit status 1 when they differ). The compact table comes last. Without a
// GPU it runs the CPU backend on small shapes and says so.
#include "loss/linear_cross_entropy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "loss/linear_cross_entropy_internal.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

#ifdef LOSSRT_WITH_CUDA
#include "bench/bench_util.h"
#include "loss/cross_entropy_cuda.h"
#include "loss/kernel_args.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#endif

ABSL_FLAG(std::string, shapes,
          "4096x4096x128256,16384x4096x128256,16384x768x50304,8192x2304x256000",
          "comma-separated NxHxV (tokens x hidden x vocab)");
ABSL_FLAG(std::string, cpu_shapes, "256x64x2000,512x128x8000",
          "shapes for the CPU fallback");
ABSL_FLAG(std::string, budgets_mib, "64,128,256,512,1024,2048,4096",
          "max_workspace_bytes of the curve, in MiB");
ABSL_FLAG(int, repeats, 7,
          "timed repetitions per measurement (median reported)");
ABSL_FLAG(int, warmup, 2, "untimed repetitions first");
ABSL_FLAG(bool, overlap_streams, true,
          "run the cross-entropy kernels on a second stream");
ABSL_FLAG(bool, validate_targets, true,
          "time with the target range check (one read-back per call, the op's "
          "default)");
ABSL_FLAG(std::string, json, "",
          "write the results as JSON lines to this path");
ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda[:N]");
ABSL_FLAG(std::string, schedule, "auto",
          "the fused calls' schedule: auto, token_chunks, two_pass, "
          "vocab_slices or compact_chunks");
ABSL_FLAG(std::string, extras, "",
          "extras of the fused calls (CrossEntropyExtras), a comma-separated "
          "subset of predicted,accuracy,entropy,logprob; empty: none");
ABSL_FLAG(float, entropy_weight, 0.0f,
          "entropy_weight of the fused calls (0: off)");
ABSL_FLAG(std::string, chunk_rows, "0",
          "comma-separated chunk_rows of the curve's calls (0: the "
          "planner's choice); the curve runs once for each");
ABSL_FLAG(bool, plans_only, false,
          "print the GPU plans (and the cost model's estimates) of --shapes x "
          "--budgets_mib x --chunk_rows with --schedule, and time nothing "
          "(runs without a GPU)");
ABSL_FLAG(bool, operand_dtype_logits, false,
          "LinearCrossEntropyOptions::operand_dtype_logits of the fused calls "
          "and printed plans (bf16 logits where a plan runs token chunks)");
ABSL_FLAG(std::string, plans_d_weight, "f32",
          "--plans_only: the d_weight dtype of the printed plans, f32 or bf16");
ABSL_FLAG(bool, plans_fp32_gradient_accumulation, true,
          "--plans_only: LinearCrossEntropyOptions::fp32_gradient_accumulation "
          "of the printed plans (a bf16 d_weight summed in fp32 or in bf16)");
ABSL_FLAG(
    bool, forward, false,
    "also time the curve's forward pass alone (LinearCrossEntropyForward: "
    "loss only)");

namespace lossrt {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

struct Shape3 {
  int64_t n, h, v;
  std::string Name() const { return absl::StrCat(n, "x", h, "x", v); }
};

absl::StatusOr<std::vector<Shape3>> ParseShapes(const std::string& text) {
  std::vector<Shape3> shapes;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, 'x');
    Shape3 s;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &s.n) ||
        !absl::SimpleAtoi(parts[1], &s.h) ||
        !absl::SimpleAtoi(parts[2], &s.v)) {
      return InvalidArgument("bad shape '", item, "': expected NxHxV");
    }
    shapes.push_back(s);
  }
  return shapes;
}

absl::StatusOr<std::vector<int64_t>> ParseChunkRows(const std::string& text) {
  std::vector<int64_t> rows;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(item, &value) || value < 0)
      return InvalidArgument("bad --chunk_rows entry '", item, "'");
    rows.push_back(value);
  }
  if (rows.empty()) rows.push_back(0);
  return rows;
}

absl::StatusOr<std::vector<int64_t>> ParseBudgets(const std::string& text) {
  std::vector<int64_t> budgets;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t mib = 0;
    if (!absl::SimpleAtoi(item, &mib) || mib <= 0)
      return InvalidArgument("bad budget '", item, "'");
    budgets.push_back(mib * kMiB);
  }
  return budgets;
}

absl::StatusOr<LinearCrossEntropySchedule> ScheduleFromFlag() {
  const std::string schedule = absl::GetFlag(FLAGS_schedule);
  if (schedule == "auto") return LinearCrossEntropySchedule::kAuto;
  if (schedule == "token_chunks")
    return LinearCrossEntropySchedule::kTokenChunks;
  if (schedule == "two_pass") return LinearCrossEntropySchedule::kTwoPass;
  if (schedule == "vocab_slices")
    return LinearCrossEntropySchedule::kVocabSlices;
  if (schedule == "compact_chunks")
    return LinearCrossEntropySchedule::kCompactChunks;
  return InvalidArgument(
      "--schedule: auto, token_chunks, two_pass, vocab_slices or "
      "compact_chunks, not '",
      schedule, "'");
}

std::string Json(
    const std::vector<std::pair<std::string, std::string>>& fields) {
  std::vector<std::string> parts;
  for (const auto& [key, value] : fields)
    parts.push_back(absl::StrCat("\"", key, "\": ", value));
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}
std::string Quote(const std::string& text) {
  return absl::StrCat("\"", text, "\"");
}
std::string Num(double value) { return absl::StrFormat("%.6g", value); }

// The problem's tensors on a context's device.
struct Tensors {
  OwnedTensor hidden, weight, targets, loss, d_hidden, d_weight, d_weight_bf16;
  // The outputs --extras asks for.
  OwnedTensor predicted, accuracy, entropy, logprob;
  CrossEntropyExtras extras;
  bool has_extras = false;
  LinearCrossEntropyInputs Inputs() const {
    return {hidden.view, weight.view, std::nullopt, targets.view};
  }
  const CrossEntropyExtras* Extras() const {
    return has_extras ? &extras : nullptr;
  }
};

// The extras that --extras names, allocated for N tokens.
absl::Status MakeExtras(Allocator& a, int64_t n, Tensors& t) {
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_extras), ',', absl::SkipEmpty())) {
    if (name == "predicted") {
      ASSIGN_OR_RETURN(t.predicted, EmptyTensor(a, DType::kI32, {n}));
      t.extras.predicted = t.predicted.view;
    } else if (name == "accuracy") {
      ASSIGN_OR_RETURN(t.accuracy, EmptyTensor(a, DType::kF32, {}));
      t.extras.accuracy = t.accuracy.view;
    } else if (name == "entropy") {
      ASSIGN_OR_RETURN(t.entropy, EmptyTensor(a, DType::kF32, {n}));
      t.extras.entropy = t.entropy.view;
    } else if (name == "logprob") {
      ASSIGN_OR_RETURN(t.logprob, EmptyTensor(a, DType::kF32, {n}));
      t.extras.target_logprob = t.logprob.view;
    } else {
      return InvalidArgument("--extras: unknown extra '", name,
                             "' (predicted, accuracy, entropy, logprob)");
    }
    t.has_extras = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensors> MakeTensors(Context& context, const Shape3& s,
                                    uint64_t seed) {
  Tensors t;
  Allocator& a = context.allocator();
  ASSIGN_OR_RETURN(t.hidden, EmptyTensor(a, DType::kBF16, {s.n, s.h}));
  ASSIGN_OR_RETURN(t.weight, EmptyTensor(a, DType::kBF16, {s.v, s.h}));
  ASSIGN_OR_RETURN(t.targets, EmptyTensor(a, DType::kI64, {s.n}));
  ASSIGN_OR_RETURN(t.loss, EmptyTensor(a, DType::kF32, {}));
  ASSIGN_OR_RETURN(t.d_hidden, EmptyTensor(a, DType::kBF16, {s.n, s.h}));
  ASSIGN_OR_RETURN(t.d_weight, EmptyTensor(a, DType::kF32, {s.v, s.h}));
  ASSIGN_OR_RETURN(t.d_weight_bf16, EmptyTensor(a, DType::kBF16, {s.v, s.h}));
  RETURN_IF_ERROR(MakeExtras(a, s.n, t));
  // As in the peers' harness: hidden ~ 0.5 N(0, 1), weight ~ N(0, 1/H).
  RETURN_IF_ERROR(FillNormal(t.hidden.view, seed, 0.0f, 0.5f, context));
  RETURN_IF_ERROR(FillNormal(t.weight.view, seed + 1, 0.0f,
                             1.0f / std::sqrt(static_cast<float>(s.h)),
                             context));
  RETURN_IF_ERROR(FillRandomInt(t.targets.view, seed + 2, 0, s.v, context));
  return t;
}

// The plan the op makes for this call (the options' schedule and streams).
std::string PlanText(const Shape3& s, int64_t budget, DType d_weight,
                     const LinearCrossEntropyOptions& options,
                     DeviceKind device,
                     lce::Pass pass = lce::Pass::kForwardBackward) {
  lce::PlanInput in;
  in.pass = pass;
  in.device = device;
  in.tokens = s.n;
  in.hidden = s.h;
  in.vocab = s.v;
  in.operand_type = DType::kBF16;
  in.d_hidden_type = DType::kBF16;
  in.d_weight_type = d_weight;
  in.max_workspace_bytes = budget;
  in.overlap_streams = options.overlap_streams;
  in.schedule = options.schedule;
  in.chunk_rows = options.chunk_rows;
  in.fp32_gradient_accumulation = options.fp32_gradient_accumulation;
  in.operand_dtype_logits = options.operand_dtype_logits;
  const absl::StatusOr<lce::Plan> plan = lce::MakePlan(in);
  if (!plan.ok()) return std::string(plan.status().message());
  return absl::StrFormat("%s; model %.2f ms", plan->ToString(),
                         plan->estimated_seconds * 1e3);
}

// ---------------------------------------------------------------------------------------
// CPU fallback.

absl::Status RunCpu() {
  ASSIGN_OR_RETURN(std::vector<Shape3> shapes,
                   ParseShapes(absl::GetFlag(FLAGS_cpu_shapes)));
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                   Context::Create(Device::Cpu()));
  std::printf(
      "No GPU: timing the CPU backend (Eigen, one thread) on small shapes "
      "instead.\n");
  std::printf("These numbers say nothing about the GPU targets.\n\n");
  std::printf("%-16s %10s %12s %12s  %s\n", "N x H x V", "budget", "fused ms",
              "peak MiB", "plan");
  std::vector<std::string> json;
  for (const Shape3& s : shapes) {
    ASSIGN_OR_RETURN(Tensors t, MakeTensors(*context, s, 1234));
    for (int64_t budget : {int64_t{1} << 30, int64_t{4} * kMiB}) {
      LinearCrossEntropyOptions options;
      options.max_workspace_bytes = budget;
      options.cross_entropy.entropy_weight =
          absl::GetFlag(FLAGS_entropy_weight);
      const LinearCrossEntropyGradients grads{t.d_hidden.view, t.d_weight.view,
                                              std::nullopt};
      std::vector<double> times;
      int64_t peak = 0;
      for (int i = 0;
           i < absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_repeats);
           ++i) {
        context->allocator().ReleaseCache();
        const int64_t base = context->allocator().current_bytes();
        context->allocator().ResetPeak();
        const auto start = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(LinearCrossEntropyForwardBackward(
            *context, t.Inputs(), options, t.loss.view, nullptr, grads, nullptr,
            t.Extras()));
        const double ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - start)
                              .count();
        peak = context->allocator().peak_bytes() - base;
        if (i >= absl::GetFlag(FLAGS_warmup)) times.push_back(ms);
      }
      std::nth_element(times.begin(), times.begin() + times.size() / 2,
                       times.end());
      const double ms = times[times.size() / 2];
      const std::string plan =
          PlanText(s, budget, DType::kF32, options, DeviceKind::kCpu);
      std::printf("%-16s %7lld MiB %12.2f %12.1f  %s (loss %.5f)\n",
                  s.Name().c_str(), static_cast<long long>(budget / kMiB), ms,
                  static_cast<double>(peak) / kMiB, plan.c_str(),
                  *t.loss.view.data_as<float>());
      json.push_back(Json({{"device", Quote("cpu")},
                           {"shape", Quote(s.Name())},
                           {"budget_bytes", Num(budget)},
                           {"fused_ms", Num(ms)},
                           {"peak_extra_bytes", Num(peak)},
                           {"plan", Quote(plan)}}));
    }
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_json));
    for (const std::string& line : json) out << line << "\n";
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// GPU.

#ifdef LOSSRT_WITH_CUDA

// C (column-major m x n) = op(A) op(B) through plain cuBLAS (cublasGemmEx, fp32
// compute).
absl::Status Gemm(cublasHandle_t handle, cublasOperation_t op_a,
                  cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
                  const void* a, cudaDataType a_type, int64_t lda,
                  const void* b, cudaDataType b_type, int64_t ldb, void* c,
                  cudaDataType c_type, int64_t ldc) {
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      handle, op_a, op_b, static_cast<int>(m), static_cast<int>(n),
      static_cast<int>(k), &alpha, a, a_type, static_cast<int>(lda), b, b_type,
      static_cast<int>(ldb), &beta, c, c_type, static_cast<int>(ldc),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// logits[N, V] (ld ldl, type) = hidden @ weight^T; d_hidden = G @ weight;
// d_weight = G^T @ hidden with G [N, V] bf16 of row stride ldg.
absl::Status LogitsGemm(cublasHandle_t handle, const Shape3& s,
                        const Tensors& t, void* logits, cudaDataType type,
                        int64_t ldl) {
  return Gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, s.v, s.n, s.h,
              t.weight.view.data, CUDA_R_16BF, s.h, t.hidden.view.data,
              CUDA_R_16BF, s.h, logits, type, ldl);
}
absl::Status DHiddenGemm(cublasHandle_t handle, const Shape3& s,
                         const Tensors& t, const void* g, int64_t ldg) {
  return Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.h, s.n, s.v,
              t.weight.view.data, CUDA_R_16BF, s.h, g, CUDA_R_16BF, ldg,
              t.d_hidden.view.data, CUDA_R_16BF, s.h);
}
absl::Status DWeightGemm(cublasHandle_t handle, const Shape3& s,
                         const Tensors& t, const void* g, int64_t ldg,
                         void* d_weight, cudaDataType type) {
  return Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, s.h, s.v, s.n,
              t.hidden.view.data, CUDA_R_16BF, s.h, g, CUDA_R_16BF, ldg,
              d_weight, type, s.h);
}

struct Measured {
  double ms = 0;
  int64_t peak = 0;  // allocator peak beyond what was live before
};

// Times `fn` and measures the allocator's peak over one more call.
absl::StatusOr<Measured> Measure(Context& context,
                                 const std::function<absl::Status()>& fn) {
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  Measured m;
  ASSIGN_OR_RETURN(m.ms, bench::MedianMs(stream, absl::GetFlag(FLAGS_warmup),
                                         absl::GetFlag(FLAGS_repeats),
                                         [&](int) { return fn(); }));
  RETURN_IF_ERROR(context.Synchronize());
  // A freed block up to twice a request's size is reused and counted whole:
  // start clean.
  context.allocator().ReleaseCache();
  const int64_t base = context.allocator().current_bytes();
  context.allocator().ResetPeak();
  RETURN_IF_ERROR(fn());
  RETURN_IF_ERROR(context.Synchronize());
  m.peak = context.allocator().peak_bytes() - base;
  return m;
}

// Relative norm difference of the first `rows` rows of two [rows, cols] device
// tensors.
absl::StatusOr<double> HeadDifference(Context& context, const Tensor& a,
                                      const Tensor& b, int64_t rows) {
  ASSIGN_OR_RETURN(std::unique_ptr<Context> cpu,
                   Context::Create(Device::Cpu()));
  auto load = [&](const Tensor& t) -> absl::StatusOr<std::vector<double>> {
    Tensor head = t;
    head.shape[0] = std::min(rows, t.dim(0));
    ASSIGN_OR_RETURN(OwnedTensor host,
                     EmptyTensor(cpu->allocator(), t.dtype, head.shape));
    RETURN_IF_ERROR(CopyTensor(head, host.view, context));
    std::vector<double> values(host.view.numel());
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = t.dtype == DType::kF32
                      ? host.view.data_as<float>()[i]
                      : Bf16BitsToFloat(host.view.data_as<uint16_t>()[i]);
    }
    return values;
  };
  ASSIGN_OR_RETURN(std::vector<double> x, load(a));
  ASSIGN_OR_RETURN(std::vector<double> y, load(b));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (x[i] - y[i]) * (x[i] - y[i]);
    norm += y[i] * y[i];
  }
  // NaN (from either side) compares as a mismatch.
  if (!std::isfinite(diff) || !std::isfinite(norm)) return 1.0;
  return norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? 1.0 : 0.0);
}

struct ShapeResult {
  Shape3 shape;
  double gemms_ms = 0;
  double unfused_gemms_ms = 0;  // the unfused path's GEMMs alone
  double ce_only_ms = 0;        // its cross-entropy kernel alone
  Measured unfused, fused;
  // Absent where a forced --schedule cannot run a bf16 d_weight at the default
  // budget (token chunks accumulate it in an fp32 copy of the weight's size).
  std::optional<Measured> fused_bf16;
  // d_weight bf16 summed over the chunks in bf16
  // (fp32_gradient_accumulation = false).
  std::optional<Measured> fused_bf16_sums;
  std::string fused_plan, fused_bf16_plan, fused_bf16_sums_plan;
  struct Point {
    int64_t budget = 0;
    int64_t chunk_rows = 0;  // chunk_rows (0: the planner's)
    Measured fused;
    double forward_ms = -1;  // --forward: the forward pass alone
    std::string plan, forward_plan;
  };
  std::vector<Point> curve;
  double check_loss = 0, check_d_hidden = 0, check_d_weight = 0;
};

absl::StatusOr<ShapeResult> RunShape(Context& context, const Shape3& s,
                                     const std::vector<int64_t>& budgets) {
  ShapeResult r;
  r.shape = s;
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(cublasHandle_t handle, CublasHandleOf(context));
  RETURN_IF_ERROR(context.cublaslt_workspace().status());
  ASSIGN_OR_RETURN(Tensors t, MakeTensors(context, s, 20261129));

  // The ceiling: three bf16 GEMMs through a full bf16 [N, V] buffer (not
  // counted as ours).
  {
    ASSIGN_OR_RETURN(Buffer g, context.allocator().Allocate(s.n * s.v * 2));
    ASSIGN_OR_RETURN(
        Measured m, Measure(context, [&]() -> absl::Status {
          RETURN_IF_ERROR(LogitsGemm(handle, s, t, g.data(), CUDA_R_16BF, s.v));
          RETURN_IF_ERROR(DHiddenGemm(handle, s, t, g.data(), s.v));
          return DWeightGemm(handle, s, t, g.data(), s.v,
                             t.d_weight_bf16.view.data, CUDA_R_16BF);
        }));
    r.gemms_ms = m.ms;
  }

  // Unfused: fp32 logits [N, V], the cross-entropy kernels (bf16 gradient in
  // place), two GEMMs. Its gradients are kept for the check.
  float unfused_loss = 0;
  ASSIGN_OR_RETURN(OwnedTensor ref_d_hidden,
                   EmptyTensor(context.allocator(), DType::kBF16, {s.n, s.h}));
  ASSIGN_OR_RETURN(OwnedTensor ref_d_weight,
                   EmptyTensor(context.allocator(), DType::kF32, {s.v, s.h}));
  {
    int num_sms = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
        &num_sms, cudaDevAttrMultiProcessorCount, context.device().ordinal));
    auto unfused = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(Buffer logits,
                       context.allocator().Allocate(s.n * s.v * 4));
      ASSIGN_OR_RETURN(Buffer scratch,
                       context.allocator().Allocate(256 + s.n * 4));
      auto* stats = scratch.data_as<ce::TargetStats>();
      float* row_loss = reinterpret_cast<float*>(scratch.data_as<char>() + 256);
      RETURN_IF_ERROR(LogitsGemm(handle, s, t, logits.data(), CUDA_R_32F, s.v));
      CUDA_RETURN_IF_ERROR(ce::LaunchTargetStats(
          t.targets.view.data, true, s.n, s.v, -100, nullptr, stats, stream));
      ce::RowArgs args = ce::MakeRowArgs(
          logits.data(), DType::kF32, s.v, s.n, s.v, t.targets.view.data,
          /*targets_i64=*/true, CrossEntropyOptions());
      args.stats = stats;
      args.row_loss = row_loss;
      args.grad = logits.data();
      args.grad_type = DType::kBF16;
      args.grad_stride = 2 * s.v;
      CUDA_RETURN_IF_ERROR(ce::LaunchRows(args, num_sms, stream));
      CUDA_RETURN_IF_ERROR(ce::LaunchSumRows(
          row_loss, s.n, t.loss.view.data_as<float>(), stream));
      RETURN_IF_ERROR(DHiddenGemm(handle, s, t, logits.data(), 2 * s.v));
      return DWeightGemm(handle, s, t, logits.data(), 2 * s.v,
                         t.d_weight.view.data, CUDA_R_32F);
    };
    ASSIGN_OR_RETURN(r.unfused, Measure(context, unfused));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(&unfused_loss, t.loss.view.data, 4, cudaMemcpyDeviceToHost));
    RETURN_IF_ERROR(CopyTensor(t.d_hidden.view, ref_d_hidden.view, context));
    RETURN_IF_ERROR(CopyTensor(t.d_weight.view, ref_d_weight.view, context));

    // Its parts: the GEMMs alone (fp32 logits, then the gradient GEMMs reading
    // bf16 dlogits with the in-place row stride), and the cross-entropy kernel
    // alone (fp32 logits in, bf16 gradient out).
    ASSIGN_OR_RETURN(Buffer logits,
                     context.allocator().Allocate(s.n * s.v * 4));
    ASSIGN_OR_RETURN(Buffer grad, context.allocator().Allocate(s.n * s.v * 2));
    ASSIGN_OR_RETURN(Buffer scratch,
                     context.allocator().Allocate(256 + s.n * 4));
    auto* stats = scratch.data_as<ce::TargetStats>();
    ASSIGN_OR_RETURN(
        Measured gemms, Measure(context, [&]() -> absl::Status {
          RETURN_IF_ERROR(
              LogitsGemm(handle, s, t, logits.data(), CUDA_R_32F, s.v));
          RETURN_IF_ERROR(DHiddenGemm(handle, s, t, logits.data(), 2 * s.v));
          return DWeightGemm(handle, s, t, logits.data(), 2 * s.v,
                             t.d_weight.view.data, CUDA_R_32F);
        }));
    r.unfused_gemms_ms = gemms.ms;
    RETURN_IF_ERROR(LogitsGemm(handle, s, t, logits.data(), CUDA_R_32F, s.v));
    CUDA_RETURN_IF_ERROR(ce::LaunchTargetStats(
        t.targets.view.data, true, s.n, s.v, -100, nullptr, stats, stream));
    ASSIGN_OR_RETURN(
        Measured ce_only, Measure(context, [&]() -> absl::Status {
          ce::RowArgs args = ce::MakeRowArgs(
              logits.data(), DType::kF32, s.v, s.n, s.v, t.targets.view.data,
              /*targets_i64=*/true, CrossEntropyOptions());
          args.stats = stats;
          args.row_loss =
              reinterpret_cast<float*>(scratch.data_as<char>() + 256);
          args.grad = grad.data();
          args.grad_type = DType::kBF16;
          args.grad_stride = s.v;
          CUDA_RETURN_IF_ERROR(ce::LaunchRows(args, num_sms, stream));
          return absl::OkStatus();
        }));
    r.ce_only_ms = ce_only.ms;
  }
  LinearCrossEntropyOptions options;
  options.overlap_streams = absl::GetFlag(FLAGS_overlap_streams);
  ASSIGN_OR_RETURN(options.schedule, ScheduleFromFlag());
  options.cross_entropy.validate_targets =
      absl::GetFlag(FLAGS_validate_targets);
  options.cross_entropy.entropy_weight = absl::GetFlag(FLAGS_entropy_weight);
  options.operand_dtype_logits = absl::GetFlag(FLAGS_operand_dtype_logits);
  auto fused = [&](int64_t budget, const Tensor& d_weight,
                   bool fp32_sums = true) {
    return [&, budget, d_weight, fp32_sums]() -> absl::Status {
      LinearCrossEntropyOptions o = options;
      o.max_workspace_bytes = budget;
      o.fp32_gradient_accumulation = fp32_sums;
      return LinearCrossEntropyForwardBackward(
          context, t.Inputs(), o, t.loss.view, nullptr,
          {t.d_hidden.view, d_weight, std::nullopt}, nullptr, t.Extras());
    };
  };
  const int64_t default_budget =
      LinearCrossEntropyOptions().max_workspace_bytes;
  ASSIGN_OR_RETURN(r.fused,
                   Measure(context, fused(default_budget, t.d_weight.view)));
  r.fused_plan =
      PlanText(s, default_budget, DType::kF32, options, DeviceKind::kCuda);
  float fused_loss = 0;
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&fused_loss, t.loss.view.data, 4, cudaMemcpyDeviceToHost));
  r.check_loss = std::fabs(fused_loss - unfused_loss) /
                 std::max(std::fabs(unfused_loss), 1e-30f);
  ASSIGN_OR_RETURN(r.check_d_hidden, HeadDifference(context, t.d_hidden.view,
                                                    ref_d_hidden.view, 512));
  ASSIGN_OR_RETURN(r.check_d_weight, HeadDifference(context, t.d_weight.view,
                                                    ref_d_weight.view, 512));
  // A bf16 d_weight at the default budget, summed over the chunks in fp32
  // and in bf16. With a forced schedule a point that cannot plan is "not
  // run", with kAuto an error.
  auto time_bf16_d_weight = [&](bool fp32_sums, std::optional<Measured>& out,
                                std::string& plan) -> absl::Status {
    LinearCrossEntropyOptions o = options;
    o.fp32_gradient_accumulation = fp32_sums;
    plan = PlanText(s, default_budget, DType::kBF16, o, DeviceKind::kCuda);
    absl::StatusOr<Measured> m = Measure(
        context, fused(default_budget, t.d_weight_bf16.view, fp32_sums));
    if (m.ok()) {
      out = *m;
    } else if (options.schedule == LinearCrossEntropySchedule::kAuto) {
      return m.status();
    } else {
      plan = absl::StrCat("not run: ", m.status().message());
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(time_bf16_d_weight(true, r.fused_bf16, r.fused_bf16_plan));
  RETURN_IF_ERROR(
      time_bf16_d_weight(false, r.fused_bf16_sums, r.fused_bf16_sums_plan));
  ASSIGN_OR_RETURN(std::vector<int64_t> chunk_rows,
                   ParseChunkRows(absl::GetFlag(FLAGS_chunk_rows)));
  const bool time_forward = absl::GetFlag(FLAGS_forward);
  for (int64_t rows : chunk_rows) {
    options.chunk_rows = rows;
    for (int64_t budget : budgets) {
      ShapeResult::Point point;
      point.budget = budget;
      point.chunk_rows = rows;
      point.plan = PlanText(s, budget, DType::kF32, options, DeviceKind::kCuda);
      // Chunk rows the budget cannot hold: say so, and time the rest.
      const absl::StatusOr<Measured> m =
          Measure(context, fused(budget, t.d_weight.view));
      if (!m.ok()) {
        std::printf("  %-18s %5lld MiB, chunk rows %lld: %s\n",
                    s.Name().c_str(), static_cast<long long>(budget / kMiB),
                    static_cast<long long>(rows),
                    m.status().ToString().c_str());
        continue;
      }
      point.fused = *m;
      std::string forward_text;
      if (time_forward) {
        LinearCrossEntropyOptions o = options;
        o.max_workspace_bytes = budget;
        ASSIGN_OR_RETURN(Measured f, Measure(context, [&]() {
                           return LinearCrossEntropyForward(context, t.Inputs(),
                                                            o, t.loss.view);
                         }));
        point.forward_ms = f.ms;
        point.forward_plan = PlanText(s, budget, DType::kF32, options,
                                      DeviceKind::kCuda, lce::Pass::kForward);
        forward_text =
            absl::StrFormat("; forward %.2f ms [%s]", f.ms, point.forward_plan);
      }
      std::printf(
          "  %-18s %5lld MiB, chunk rows %5lld: %8.2f ms (%.2fx), peak %7.1f "
          "MiB  [%s]%s\n",
          s.Name().c_str(), static_cast<long long>(budget / kMiB),
          static_cast<long long>(rows), point.fused.ms,
          point.fused.ms / r.gemms_ms,
          static_cast<double>(point.fused.peak) / kMiB, point.plan.c_str(),
          forward_text.c_str());
      std::fflush(stdout);
      r.curve.push_back(std::move(point));
    }
  }
  context.allocator().ReleaseCache();
  return r;
}

// Issue 21's targets, as ratios to the three GEMMs: at 1 GiB by hidden size,
// at 256 MiB and 64 MiB for every shape.
double TargetRatio(int64_t h) {
  return h >= 4096 ? 1.02 : h >= 2304 ? 1.12 : 1.15;
}
constexpr double kTarget256MiB = 1.25;
constexpr double kTarget64MiB = 1.5;

// ", <budget> met" or ", <budget> MISSED" for the curve's first point at
// `budget` (nothing when the curve has none).
std::string SmallBudgetVerdict(const std::vector<ShapeResult::Point>& curve,
                               int64_t budget, double gemms_ms, double target) {
  for (const ShapeResult::Point& point : curve) {
    if (point.budget != budget) continue;
    return absl::StrFormat(
        ", %lldMiB (<=%.2fx) %s", static_cast<long long>(budget / kMiB), target,
        point.fused.ms / gemms_ms <= target ? "met" : "MISSED");
  }
  return "";
}

absl::Status RunGpu(const Device& device) {
  ASSIGN_OR_RETURN(std::vector<Shape3> shapes,
                   ParseShapes(absl::GetFlag(FLAGS_shapes)));
  ASSIGN_OR_RETURN(std::vector<int64_t> budgets,
                   ParseBudgets(absl::GetFlag(FLAGS_budgets_mib)));
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(device));
  ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(device));
  std::printf(
      "linear cross-entropy on %s: bf16 hidden/weight, loss + d_hidden (bf16) "
      "+ "
      "d_weight (f32); median of %d after %d warm-up; overlap_streams=%d, "
      "validate_targets=%d\n",
      info.name.c_str(), absl::GetFlag(FLAGS_repeats),
      absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_overlap_streams),
      absl::GetFlag(FLAGS_validate_targets));
  std::printf("\ntime vs max_workspace_bytes (fused, d_weight f32):\n");
  std::vector<ShapeResult> results;
  for (const Shape3& s : shapes) {
    ASSIGN_OR_RETURN(ShapeResult r, RunShape(*context, s, budgets));
    results.push_back(std::move(r));
  }

  std::vector<std::string> json;
  bool checks_ok = true;
  std::printf(
      "\nchecks (fused vs unfused, first 512 rows of the gradients):\n");
  for (const ShapeResult& r : results) {
    // (16-bit logits, --operand_dtype_logits, are held to the same 1e-5: the
    // mean loss averages their roundings out.)
    const bool ok = r.check_loss < 1e-5 && r.check_d_hidden < 1e-2 &&
                    r.check_d_weight < 1e-2;
    checks_ok = checks_ok && ok;
    std::printf("  %-18s loss %.1e, d_hidden %.1e, d_weight %.1e: %s\n",
                r.shape.Name().c_str(), r.check_loss, r.check_d_hidden,
                r.check_d_weight, ok ? "ok" : "MISMATCH");
  }
  std::printf(
      "\nunfused path's parts: GEMMs (fp32 logits, bf16 dlogits) and the "
      "cross-entropy kernel alone (fp32 in, bf16 gradient out):\n");
  for (const ShapeResult& r : results) {
    const double bytes = 6.0 * r.shape.n * r.shape.v;
    std::printf(
        "  %-18s GEMMs %8.2f ms (%.2fx), cross-entropy %7.2f ms (%.0f GB/s)\n",
        r.shape.Name().c_str(), r.unfused_gemms_ms,
        r.unfused_gemms_ms / r.gemms_ms, r.ce_only_ms,
        bytes / (r.ce_only_ms * 1e-3) / 1e9);
  }
  std::printf("\nplans at the default budget: \n");
  for (const ShapeResult& r : results) {
    std::printf(
        "  %-18s d_weight f32: %s\n  %-18s d_weight bf16: %s\n  %-18s "
        "d_weight bf16, bf16 sums: %s\n",
        r.shape.Name().c_str(), r.fused_plan.c_str(), "",
        r.fused_bf16_plan.c_str(), "", r.fused_bf16_sums_plan.c_str());
  }

  std::printf(
      "\nlinear cross-entropy, bf16, loss + all gradients (ms; MiB = peak "
      "beyond inputs "
      "and gradient outputs; x = / 3 GEMMs)\n");
  std::printf("%-18s %8s | %17s | %24s | %16s | %16s | %16s | %s\n",
              "N x H x V", "3 GEMMs", "unfused ms/MiB", "fused 1GiB ms/MiB/x",
              "256MiB ms/x", "dW bf16 1GiB", "bf16 sums 1GiB", "target");
  for (const ShapeResult& r : results) {
    const Measured* at256 = nullptr;
    for (const ShapeResult::Point& point : r.curve) {
      if (point.budget == 256 * kMiB && at256 == nullptr) at256 = &point.fused;
    }
    const double target = TargetRatio(r.shape.h);
    const double ratio = r.fused.ms / r.gemms_ms;
    std::string c256 = at256 != nullptr
                           ? absl::StrFormat("%7.2f / %.2fx", at256->ms,
                                             at256->ms / r.gemms_ms)
                           : "-";
    const std::string bf16 =
        r.fused_bf16.has_value()
            ? absl::StrFormat("%7.2f / %.2fx", r.fused_bf16->ms,
                              r.fused_bf16->ms / r.gemms_ms)
            : "-";
    const std::string bf16_sums =
        r.fused_bf16_sums.has_value()
            ? absl::StrFormat("%7.2f / %.2fx", r.fused_bf16_sums->ms,
                              r.fused_bf16_sums->ms / r.gemms_ms)
            : "-";
    std::printf(
        "%-18s %8.2f | %8.2f / %6.0f | %8.2f / %5.0f / %.2fx | %16s | %16s | "
        "%16s | <=%.2fx %s%s\n",
        r.shape.Name().c_str(), r.gemms_ms, r.unfused.ms,
        static_cast<double>(r.unfused.peak) / kMiB, r.fused.ms,
        static_cast<double>(r.fused.peak) / kMiB, ratio, c256.c_str(),
        bf16.c_str(), bf16_sums.c_str(), target,
        ratio <= target ? "met" : "MISSED",
        (SmallBudgetVerdict(r.curve, 256 * kMiB, r.gemms_ms, kTarget256MiB) +
         SmallBudgetVerdict(r.curve, 64 * kMiB, r.gemms_ms, kTarget64MiB))
            .c_str());
    std::vector<std::string> curve;
    for (const ShapeResult::Point& point : r.curve) {
      std::vector<std::pair<std::string, std::string>> fields = {
          {"budget_bytes", Num(point.budget)},
          {"chunk_rows", Num(point.chunk_rows)},
          {"ms", Num(point.fused.ms)},
          {"peak_extra_bytes", Num(point.fused.peak)},
          {"plan", Quote(point.plan)}};
      if (point.forward_ms >= 0) {
        fields.push_back({"forward_ms", Num(point.forward_ms)});
        fields.push_back({"forward_plan", Quote(point.forward_plan)});
      }
      curve.push_back(Json(fields));
    }
    json.push_back(Json(
        {{"device", Quote(info.name)},
         {"N", Num(r.shape.n)},
         {"H", Num(r.shape.h)},
         {"V", Num(r.shape.v)},
         {"gemms_3_ms", Num(r.gemms_ms)},
         {"unfused_ms", Num(r.unfused.ms)},
         {"unfused_peak_extra_bytes", Num(r.unfused.peak)},
         {"unfused_gemms_ms", Num(r.unfused_gemms_ms)},
         {"ce_only_ms", Num(r.ce_only_ms)},
         {"fused_ms", Num(r.fused.ms)},
         {"fused_peak_extra_bytes", Num(r.fused.peak)},
         {"fused_plan", Quote(r.fused_plan)},
         {"operand_dtype_logits",
          absl::GetFlag(FLAGS_operand_dtype_logits) ? "true" : "false"},
         {"fused_dweight_bf16_ms",
          r.fused_bf16.has_value() ? Num(r.fused_bf16->ms) : "null"},
         {"fused_dweight_bf16_peak_extra_bytes",
          r.fused_bf16.has_value() ? Num(r.fused_bf16->peak) : "null"},
         {"fused_dweight_bf16_plan", Quote(r.fused_bf16_plan)},
         {"fused_dweight_bf16_sums_ms",
          r.fused_bf16_sums.has_value() ? Num(r.fused_bf16_sums->ms) : "null"},
         {"fused_dweight_bf16_sums_peak_extra_bytes",
          r.fused_bf16_sums.has_value() ? Num(r.fused_bf16_sums->peak)
                                        : "null"},
         {"fused_dweight_bf16_sums_plan", Quote(r.fused_bf16_sums_plan)},
         {"check_loss_rel", Num(r.check_loss)},
         {"check_d_hidden_rel", Num(r.check_d_hidden)},
         {"check_d_weight_rel", Num(r.check_d_weight)},
         {"curve", absl::StrCat("[", absl::StrJoin(curve, ", "), "]")}}));
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_json));
    for (const std::string& line : json) out << line << "\n";
  }
  if (!checks_ok)
    return absl::InternalError("fused results differ from the unfused path");
  return absl::OkStatus();
}

#endif  // LOSSRT_WITH_CUDA

// --plans_only: what the planner chooses on a GPU, without one.
absl::Status PrintPlans() {
  ASSIGN_OR_RETURN(std::vector<Shape3> shapes,
                   ParseShapes(absl::GetFlag(FLAGS_shapes)));
  ASSIGN_OR_RETURN(std::vector<int64_t> budgets,
                   ParseBudgets(absl::GetFlag(FLAGS_budgets_mib)));
  ASSIGN_OR_RETURN(std::vector<int64_t> chunk_rows,
                   ParseChunkRows(absl::GetFlag(FLAGS_chunk_rows)));
  LinearCrossEntropyOptions options;
  ASSIGN_OR_RETURN(options.schedule, ScheduleFromFlag());
  options.overlap_streams = absl::GetFlag(FLAGS_overlap_streams);
  options.fp32_gradient_accumulation =
      absl::GetFlag(FLAGS_plans_fp32_gradient_accumulation);
  options.operand_dtype_logits = absl::GetFlag(FLAGS_operand_dtype_logits);
  const std::string d_weight_flag = absl::GetFlag(FLAGS_plans_d_weight);
  if (d_weight_flag != "f32" && d_weight_flag != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--plans_d_weight: expected f32 or bf16, got '", d_weight_flag, "'"));
  }
  const DType d_weight = d_weight_flag == "f32" ? DType::kF32 : DType::kBF16;
  for (const Shape3& s : shapes) {
    for (int64_t rows : chunk_rows) {
      options.chunk_rows = rows;
      for (int64_t budget : budgets) {
        std::printf(
            "%-18s %5lld MiB, chunk rows %5lld: [%s]\n", s.Name().c_str(),
            static_cast<long long>(budget / kMiB), static_cast<long long>(rows),
            PlanText(s, budget, d_weight, options, DeviceKind::kCuda).c_str());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Main() {
  if (absl::GetFlag(FLAGS_plans_only)) return PrintPlans();
  ASSIGN_OR_RETURN(Device device, ParseDevice(absl::GetFlag(FLAGS_device)));
  if (device.is_cpu()) return RunCpu();
#ifdef LOSSRT_WITH_CUDA
  return RunGpu(device);
#else
  return absl::UnavailableError("built without CUDA");
#endif
}

}  // namespace
}  // namespace lossrt

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = lossrt::Main();
  if (!status.ok()) {
    std::fprintf(stderr, "linear_cross_entropy bench: %s\n",
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
