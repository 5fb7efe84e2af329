// Benchmark of the cross-entropy op (`bazel run -c opt //bench:cross_entropy`):
// for each vocab of the workload of record (tokens 16384, vocab 4096..131072)
// and each dtype, the median time of forward (loss only), backward (from a
// saved lse) and fused forward+backward, as GB/s, as a fraction of the HBM peak
// (from the memory clock and bus width) and of the device-to-device copy rate
// measured at the start of the same run. On a GPU each case also times two
// plain kernels over the same bytes, the ceilings of that size (small sizes
// stay below the large-copy rate: launch, ramp and tail weigh on them): a
// read-and-sum for the forward, which only reads the logits, and a copy for
// backward and fused, which also write as many gradient bytes. Without a GPU
// it runs the CPU backend on a smaller size and says so.
#include "loss/cross_entropy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

#ifdef LOSSRT_WITH_CUDA
#include "bench/bench_util.h"
#include "bench/ceiling_kernels.h"
#include "loss/cross_entropy_cuda.h"
#include "loss/cross_entropy_tuning.h"
#include "loss/kernel_args.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#endif

ABSL_FLAG(int64_t, tokens, 16384, "tokens (rows of the logits)");
ABSL_FLAG(std::string, vocabs, "4096,8192,16384,32768,65536,131072",
          "comma-separated vocab sizes");
ABSL_FLAG(std::string, dtypes, "f32,bf16", "logits dtypes: f32, bf16, f16");
ABSL_FLAG(int, repeats, 30, "timed repetitions per case (median reported)");
ABSL_FLAG(int, warmup, 5, "untimed repetitions first");
ABSL_FLAG(bool, validate_targets, false,
          "time with the target range check (a one-block scan and a host "
          "read-back per call)");
ABSL_FLAG(float, label_smoothing, 0.0f,
          "label smoothing of every timed call (0: off; on, the kernels take "
          "their options path)");
ABSL_FLAG(float, softcap, 0.0f, "soft cap of every timed call (0: off)");
ABSL_FLAG(float, z_loss, 0.0f, "z-loss scale of every timed call (0: off)");
ABSL_FLAG(std::string, extras, "",
          "extras of the forward and fused calls (CrossEntropyExtras), a "
          "comma-separated subset of predicted,accuracy,entropy,logprob; "
          "empty: none");
ABSL_FLAG(float, entropy_weight, 0.0f,
          "entropy_weight of every timed call (0: off); the backward reads a "
          "saved entropy, as after a forward that returned it");
ABSL_FLAG(bool, class_weights, false,
          "random class weights in [0.5, 1.5] on every timed call");
ABSL_FLAG(int, ignore_every, 0,
          "set every Nth target to ignore_index (-100); 0: none");
ABSL_FLAG(std::string, json, "",
          "write the results as JSON lines to this path");
ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda[:N]");
ABSL_FLAG(bool, sweep, false,
          "GPU only: time the row kernels' launch variants (slice size, "
          "stages, pieces per thread, "
          "cluster limit) through the internal launchers, to pick the "
          "automatic choice");

namespace lossrt {
namespace {

// Largest relative errors of the GPU against the CPU backend on the first rows.
struct Check {
  double lse_error = -1;
  double grad_error = -1;
};

// Median microseconds of the fastest plain kernels over one case's logits
// bytes: a read-and-sum (read_us) and a copy to another buffer (copy_us). 0
// where not measured (the CPU backend).
struct Ceilings {
  double read_us = 0;
  double copy_us = 0;
};

struct Row {
  std::string dtype;
  int64_t vocab;
  std::string op;
  double us;
  double bytes;
  Check check;
  Ceilings ceilings;
};

// Runs the fused op on the GPU, then the CPU backend on copies of the first
// rows, and compares lse and gradients: a guard that the timed kernels compute
// the right thing.
absl::StatusOr<Check> CheckAgainstCpu(Context& gpu, const Tensor& logits,
                                      const Tensor& targets, const Tensor& lse,
                                      const Tensor& grad,
                                      CrossEntropyOptions options) {
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1),
                rows = std::min<int64_t>(tokens, 16);
  ASSIGN_OR_RETURN(OwnedTensor loss,
                   EmptyTensor(gpu.allocator(), DType::kF32, {}));
  RETURN_IF_ERROR(CrossEntropyForwardBackward(gpu, logits, targets, options,
                                              loss.view, &lse, grad));
  ASSIGN_OR_RETURN(std::unique_ptr<Context> cpu,
                   Context::Create(Device::Cpu()));
  auto head = [&](const Tensor& t) {
    Tensor view = t;
    view.shape[0] = rows;
    return view;
  };
  ASSIGN_OR_RETURN(OwnedTensor host_logits,
                   EmptyTensor(cpu->allocator(), logits.dtype, {rows, vocab}));
  ASSIGN_OR_RETURN(OwnedTensor host_targets,
                   EmptyTensor(cpu->allocator(), targets.dtype, {rows}));
  ASSIGN_OR_RETURN(OwnedTensor gpu_lse,
                   EmptyTensor(cpu->allocator(), DType::kF32, {rows}));
  ASSIGN_OR_RETURN(OwnedTensor gpu_grad,
                   EmptyTensor(cpu->allocator(), grad.dtype, {rows, vocab}));
  RETURN_IF_ERROR(CopyTensor(head(logits), host_logits.view, gpu));
  RETURN_IF_ERROR(CopyTensor(head(targets), host_targets.view, gpu));
  RETURN_IF_ERROR(CopyTensor(head(lse), gpu_lse.view, gpu));
  RETURN_IF_ERROR(CopyTensor(head(grad), gpu_grad.view, gpu));
  OwnedTensor host_weights;
  if (options.class_weights.has_value()) {
    ASSIGN_OR_RETURN(host_weights,
                     EmptyTensor(cpu->allocator(), DType::kF32, {vocab}));
    RETURN_IF_ERROR(CopyTensor(*options.class_weights, host_weights.view, gpu));
    options.class_weights = host_weights.view;
  }
  // Sum reduction scaled by 1/tokens gives the rows' share of the full batch's
  // mean.
  options.reduction = Reduction::kSum;
  ASSIGN_OR_RETURN(OwnedTensor cpu_loss,
                   EmptyTensor(cpu->allocator(), DType::kF32, {}));
  ASSIGN_OR_RETURN(OwnedTensor cpu_lse,
                   EmptyTensor(cpu->allocator(), DType::kF32, {rows}));
  ASSIGN_OR_RETURN(OwnedTensor cpu_grad,
                   EmptyTensor(cpu->allocator(), grad.dtype, {rows, vocab}));
  ASSIGN_OR_RETURN(OwnedTensor scale,
                   EmptyTensor(cpu->allocator(), DType::kF32, {}));
  scale.view.data_as<float>()[0] = 1.0f / static_cast<float>(tokens);
  RETURN_IF_ERROR(CrossEntropyForwardBackward(
      *cpu, host_logits.view, host_targets.view, options, cpu_loss.view,
      &cpu_lse.view, cpu_grad.view, &scale.view));
  auto value = [](const Tensor& t, int64_t i) -> double {
    switch (t.dtype) {
      case DType::kBF16:
        return Bf16BitsToFloat(t.data_as<uint16_t>()[i]);
      case DType::kF16:
        return F16BitsToFloat(t.data_as<uint16_t>()[i]);
      default:
        return t.data_as<float>()[i];
    }
  };
  Check check{0, 0};
  double grad_max = 0, grad_diff = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double a = gpu_lse.view.data_as<float>()[r],
                 b = cpu_lse.view.data_as<float>()[r];
    check.lse_error = std::max(check.lse_error,
                               std::abs(a - b) / std::max(std::abs(b), 1e-30));
  }
  for (int64_t i = 0; i < rows * vocab; ++i) {
    const double a = value(gpu_grad.view, i), b = value(cpu_grad.view, i);
    grad_max = std::max(grad_max, std::abs(b));
    grad_diff = std::max(grad_diff, std::abs(a - b));
  }
  if (!(check.lse_error <= 1.0)) check.lse_error = 1.0;  // NaN shows as 1
  check.grad_error =
      grad_max > 0 && grad_diff == grad_diff ? grad_diff / grad_max : 1.0;
  return check;
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16") return DType::kF16;
  return InvalidArgument("unknown dtype ", name);
}

#ifdef LOSSRT_WITH_CUDA
// Times the plain read-and-sum and copy kernels over the first `bytes` bytes
// of `inputs`, used in turn like the ops' timings so that every read misses
// L2, the copies writing to `dst`. Keeps the fastest grid (and copy variant)
// of each: a ceiling is what the best plain kernel reaches at this size.
absl::StatusOr<Ceilings> MeasureCeilings(Context& context,
                                         const std::vector<OwnedTensor>& inputs,
                                         void* dst, int64_t bytes, int sm_count,
                                         int warmup, int repeats) {
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  // Written only if the sum is impossible: it keeps the loads alive.
  ASSIGN_OR_RETURN(Buffer sink, context.allocator().Allocate(sizeof(float)));
  const int sets = static_cast<int>(inputs.size());
  auto median_us = [&](const std::function<cudaError_t(const void*)>& launch)
      -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(
        double ms,
        bench::MedianMs(stream, warmup, repeats, [&](int i) -> absl::Status {
          CUDA_RETURN_IF_ERROR(launch(inputs[i % sets].view.data));
          return absl::OkStatus();
        }));
    return ms * 1e3;
  };
  Ceilings ceilings{std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::infinity()};
  // No one grid wins at every size (bench/plots/ceilings_h200_2026-11-30p.txt:
  // 8, 16 or 32 blocks per SM for the read), so each is tried.
  for (int blocks_per_sm : {8, 16, 32}) {
    ASSIGN_OR_RETURN(double us, median_us([&](const void* src) {
                       return bench::LaunchReadSum(
                           src, bytes, blocks_per_sm * sm_count,
                           sink.data_as<float>(), stream);
                     }));
    ceilings.read_us = std::min(ceilings.read_us, us);
  }
  for (bench::CopyVariant variant : bench::kCopyVariants) {
    for (int blocks_per_sm : {2, 4, 8, 16}) {
      ASSIGN_OR_RETURN(double us, median_us([&](const void* src) {
                         return bench::LaunchCopy(src, dst, bytes, variant,
                                                  blocks_per_sm * sm_count,
                                                  stream);
                       }));
      ceilings.copy_us = std::min(ceilings.copy_us, us);
    }
  }
  return ceilings;
}

// Times LaunchRows / LaunchBackward over launch variants; prints GB/s against
// the copy rate.
absl::Status Sweep(Context& context, int64_t tokens,
                   const std::vector<int64_t>& vocabs, double copy_rate) {
  struct Variant {
    const char* name;
    int kernel = 0, blocks_per_sm = 0, warps_per_row = 0, fast_sum = 0,
        l2_prefetch = 0, one_row_per_group = 0, exchange = 0;
  };
  // ce::LaunchTuning's fields: kernel 0 automatic, 1 the fused kernel without
  // the next-row variant; warp/gN: N warps share a forward row; exact/fast:
  // the forward's exponential sum; nopf/pf: the fused kernel's L2 prefetch
  // off or on; np: one row a CTA group (not persistent); pers: the
  // backward's persistent grid; barrier: the fused clusters' barrier
  // exchange in place of the mbarrier one.
  std::vector<Variant> variants;
  auto add = [&](const char* name, auto set) {
    Variant variant;
    variant.name = name;
    set(variant);
    variants.push_back(variant);
  };
  add("auto", [](Variant&) {});
  add("cluster", [](Variant& v) { v.kernel = 1; });
  add("warp/g1", [](Variant& v) { v.warps_per_row = 1; });
  add("warp/g2", [](Variant& v) { v.warps_per_row = 2; });
  add("warp/g4", [](Variant& v) { v.warps_per_row = 4; });
  add("auto/exact", [](Variant& v) { v.fast_sum = 1; });
  add("auto/fast", [](Variant& v) { v.fast_sum = 2; });
  add("auto/nopf", [](Variant& v) { v.l2_prefetch = -1; });
  add("auto/pf", [](Variant& v) { v.l2_prefetch = 1; });
  add("auto/np", [](Variant& v) { v.one_row_per_group = 1; });
  add("bwd/pers", [](Variant& v) { v.one_row_per_group = -1; });
  add("fused/barrier", [](Variant& v) { v.exchange = -1; });

  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(context.device()));
  std::printf(
      "\nsweep: tokens=%lld; %%copy of fwd counts one read, fused/bwd "
      "read+write\n",
      static_cast<long long>(tokens));
  std::printf("%5s %7s %-11s %10s %10s %10s %9s %9s %9s\n", "dtype", "vocab",
              "variant", "fwd%copy", "fused%copy", "bwd%copy", "fwd_us",
              "fused_us", "bwd_us");
  uint64_t seed = 1234;
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (int64_t vocab : vocabs) {
      ASSIGN_OR_RETURN(OwnedTensor logits, EmptyTensor(context.allocator(),
                                                       dtype, {tokens, vocab}));
      ASSIGN_OR_RETURN(OwnedTensor grad, EmptyTensor(context.allocator(), dtype,
                                                     {tokens, vocab}));
      ASSIGN_OR_RETURN(OwnedTensor targets,
                       EmptyTensor(context.allocator(), DType::kI64, {tokens}));
      ASSIGN_OR_RETURN(OwnedTensor row_loss,
                       EmptyTensor(context.allocator(), DType::kF32, {tokens}));
      ASSIGN_OR_RETURN(OwnedTensor lse,
                       EmptyTensor(context.allocator(), DType::kF32, {tokens}));
      ASSIGN_OR_RETURN(Buffer stats,
                       context.allocator().Allocate(sizeof(ce::TargetStats)));
      RETURN_IF_ERROR(FillNormal(logits.view, ++seed, 0.0f, 2.0f, context));
      RETURN_IF_ERROR(FillRandomInt(targets.view, ++seed, 0, vocab, context));
      CUDA_RETURN_IF_ERROR(ce::LaunchTargetStats(
          targets.view.data, true, tokens, vocab, -100, nullptr,
          stats.data_as<ce::TargetStats>(), stream));
      const double bytes =
          static_cast<double>(tokens) * vocab * DTypeSize(dtype);
      // The forward's arguments (automatic launch) over this case's buffers.
      auto forward_args = [&] {
        ce::RowArgs args = ce::MakeRowArgs(
            logits.view.data, dtype, vocab, tokens, vocab, targets.view.data,
            /*targets_i64=*/true, CrossEntropyOptions());
        args.grad_type = dtype;
        args.stats = stats.data_as<ce::TargetStats>();
        args.row_loss = row_loss.view.data_as<float>();
        args.lse = lse.view.data_as<float>();
        return args;
      };
      for (const Variant& variant : variants) {
        // 16-bit rows have only the fast sum's kernels.
        if (variant.fast_sum == 1 && dtype != DType::kF32) continue;
        const ce::RowArgs args = forward_args();
        ce::LaunchTuning tuning;
        tuning.kernel = static_cast<ce::KernelChoice>(variant.kernel);
        tuning.blocks_per_sm = variant.blocks_per_sm;
        tuning.warps_per_row = variant.warps_per_row;
        tuning.fast_sum = variant.fast_sum;
        tuning.l2_prefetch = variant.l2_prefetch;
        tuning.one_row_per_group = variant.one_row_per_group;
        tuning.exchange = variant.exchange;
        double pct[3], us[3];
        for (int op = 0; op < 3; ++op) {
          ce::RowArgs run = args;
          if (op > 0) {
            run.grad = grad.view.data;
            run.grad_stride = vocab;
          }
          auto fn = [&](int) -> absl::Status {
            CUDA_RETURN_IF_ERROR(
                op == 2
                    ? ce::LaunchBackwardTuned(run, tuning, info.sm_count,
                                              stream)
                    : ce::LaunchRowsTuned(run, tuning, info.sm_count, stream));
            return absl::OkStatus();
          };
          auto ms = bench::MedianMs(stream, 3, 15, fn);
          if (!ms.ok()) {
            pct[op] = us[op] = -1;
            cudaGetLastError();
            continue;
          }
          us[op] = *ms * 1e3;
          pct[op] =
              100 * (op == 0 ? bytes : 2 * bytes) / (*ms * 1e-3) / copy_rate;
        }
        std::printf("%5s %7lld %-11s %10.1f %10.1f %10.1f %9.1f %9.1f %9.1f\n",
                    DTypeName(dtype), static_cast<long long>(vocab),
                    variant.name, pct[0], pct[1], pct[2], us[0], us[1], us[2]);
      }
      // The forward's launches apart (automatic kernel): the row kernel
      // alone, after the target scan, before the loss sum, and all three as
      // the op runs them.
      ASSIGN_OR_RETURN(Buffer loss,
                       context.allocator().Allocate(sizeof(float)));
      double split_us[4];
      for (int parts = 0; parts < 4; ++parts) {
        const bool scan = parts & 1, sum = parts & 2;
        ce::RowArgs run = forward_args();
        run.follows_scan = scan;
        auto fn = [&](int) -> absl::Status {
          if (scan) {
            CUDA_RETURN_IF_ERROR(ce::LaunchTargetStats(
                targets.view.data, true, tokens, vocab, -100, nullptr,
                stats.data_as<ce::TargetStats>(), stream));
          }
          CUDA_RETURN_IF_ERROR(ce::LaunchRows(run, info.sm_count, stream));
          if (sum) {
            CUDA_RETURN_IF_ERROR(
                ce::LaunchSumRows(row_loss.view.data_as<float>(), tokens,
                                  loss.data_as<float>(), stream, true));
          }
          return absl::OkStatus();
        };
        ASSIGN_OR_RETURN(double ms, bench::MedianMs(stream, 3, 15, fn));
        split_us[parts] = ms * 1e3;
      }
      std::printf(
          "%5s %7lld split: rows %.1f, scan+rows %.1f, rows+sum %.1f, "
          "scan+rows+sum %.1f us\n",
          DTypeName(dtype), static_cast<long long>(vocab), split_us[0],
          split_us[1], split_us[2], split_us[3]);
      RETURN_IF_ERROR(context.Synchronize());
    }
  return absl::OkStatus();
}
#endif

absl::Status Run() {
  ASSIGN_OR_RETURN(Device device, ParseDevice(absl::GetFlag(FLAGS_device)));
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(device));
  int64_t tokens = absl::GetFlag(FLAGS_tokens);
  std::vector<int64_t> vocabs;
  for (absl::string_view piece :
       absl::StrSplit(absl::GetFlag(FLAGS_vocabs), ',')) {
    int64_t vocab;
    if (!absl::SimpleAtoi(piece, &vocab))
      return InvalidArgument("bad vocab ", piece);
    vocabs.push_back(vocab);
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  double copy_rate = 0, hbm_peak = 0;
  std::string device_name = "cpu";
#ifdef LOSSRT_WITH_CUDA
  int sm_count = 0;  // sizes the ceiling kernels' grids
#endif
  if (device.is_cpu()) {
    tokens = std::min<int64_t>(tokens, 256);
    std::printf(
        "No GPU: running the CPU backend on %lld tokens (a smaller size than "
        "the GPU workload).\n",
        static_cast<long long>(tokens));
  } else {
#ifdef LOSSRT_WITH_CUDA
    ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(device));
    device_name = info.name;
    sm_count = info.sm_count;
    hbm_peak = info.PeakMemoryBandwidthBytesPerSecond();
    ASSIGN_OR_RETURN(copy_rate,
                     bench::CopyBandwidth(*context, int64_t{2} << 30));
    std::printf(
        "%s: %d SMs, HBM peak %.0f GB/s (memory clock x bus width), copy %.0f "
        "GB/s (measured now)\n",
        info.name.c_str(), info.sm_count, hbm_peak / 1e9, copy_rate / 1e9);
#endif
  }
#ifdef LOSSRT_WITH_CUDA
  if (absl::GetFlag(FLAGS_sweep) && device.is_cuda())
    return Sweep(*context, tokens, vocabs, copy_rate);
#endif
  CrossEntropyOptions options;
  options.validate_targets = absl::GetFlag(FLAGS_validate_targets);
  options.label_smoothing = absl::GetFlag(FLAGS_label_smoothing);
  options.softcap = absl::GetFlag(FLAGS_softcap);
  options.z_loss = absl::GetFlag(FLAGS_z_loss);
  options.entropy_weight = absl::GetFlag(FLAGS_entropy_weight);
  bool want_predicted = false, want_accuracy = false, want_entropy = false,
       want_logprob = false;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_extras), ',', absl::SkipEmpty())) {
    if (name == "predicted") {
      want_predicted = true;
    } else if (name == "accuracy") {
      want_accuracy = true;
    } else if (name == "entropy") {
      want_entropy = true;
    } else if (name == "logprob") {
      want_logprob = true;
    } else {
      return InvalidArgument("--extras: unknown extra '", name,
                             "' (predicted, accuracy, entropy, logprob)");
    }
  }
  const int ignore_every = absl::GetFlag(FLAGS_ignore_every);
  std::vector<Row> rows;
  uint64_t seed = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  for (absl::string_view dtype_name :
       absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',')) {
    ASSIGN_OR_RETURN(DType dtype, ParseDType(dtype_name));
    for (int64_t vocab : vocabs) {
      // Two input sets, each larger than the L2 cache, used in turn.
      constexpr int kSets = 2;
      std::vector<OwnedTensor> logits(kSets);
      for (int s = 0; s < kSets; ++s) {
        ASSIGN_OR_RETURN(logits[s], EmptyTensor(context->allocator(), dtype,
                                                {tokens, vocab}));
        RETURN_IF_ERROR(
            FillNormal(logits[s].view, ++seed, 0.0f, 2.0f, *context));
      }
      ASSIGN_OR_RETURN(OwnedTensor targets, EmptyTensor(context->allocator(),
                                                        DType::kI64, {tokens}));
      RETURN_IF_ERROR(FillRandomInt(targets.view, ++seed, 0, vocab, *context));
      if (ignore_every > 0) {
        std::vector<int64_t> host(tokens);
        const Tensor host_view =
            Tensor::Of(host.data(), DType::kI64, {tokens}, Device::Cpu());
        RETURN_IF_ERROR(CopyTensor(targets.view, host_view, *context));
        for (int64_t i = 0; i < tokens; i += ignore_every) host[i] = -100;
        RETURN_IF_ERROR(CopyTensor(host_view, targets.view, *context));
      }
      OwnedTensor weights;
      options.class_weights.reset();
      if (absl::GetFlag(FLAGS_class_weights)) {
        ASSIGN_OR_RETURN(
            weights, EmptyTensor(context->allocator(), DType::kF32, {vocab}));
        RETURN_IF_ERROR(
            FillUniform(weights.view, ++seed, 0.5f, 1.5f, *context));
        options.class_weights = weights.view;
      }
      ASSIGN_OR_RETURN(OwnedTensor grad, EmptyTensor(context->allocator(),
                                                     dtype, {tokens, vocab}));
      ASSIGN_OR_RETURN(OwnedTensor loss,
                       EmptyTensor(context->allocator(), DType::kF32, {}));
      ASSIGN_OR_RETURN(OwnedTensor lse, EmptyTensor(context->allocator(),
                                                    DType::kF32, {tokens}));
      ASSIGN_OR_RETURN(OwnedTensor grad_loss,
                       EmptyTensor(context->allocator(), DType::kF32, {}));
      RETURN_IF_ERROR(
          FillUniform(grad_loss.view, ++seed, 0.5f, 1.5f, *context));
      // The extras' outputs (--extras): null when none is asked for.
      OwnedTensor predicted, accuracy, entropy, logprob;
      CrossEntropyExtras extras;
      if (want_predicted) {
        ASSIGN_OR_RETURN(predicted, EmptyTensor(context->allocator(),
                                                DType::kI32, {tokens}));
        extras.predicted = predicted.view;
      }
      if (want_accuracy) {
        ASSIGN_OR_RETURN(accuracy,
                         EmptyTensor(context->allocator(), DType::kF32, {}));
        extras.accuracy = accuracy.view;
      }
      // The entropy is also the backward's saved entropy under
      // --entropy_weight (the forward's, as a trainer would pass it).
      if (want_entropy || options.entropy_weight != 0.0f) {
        ASSIGN_OR_RETURN(
            entropy, EmptyTensor(context->allocator(), DType::kF32, {tokens}));
        RETURN_IF_ERROR(
            FillUniform(entropy.view, ++seed, 0.5f, 5.0f, *context));
      }
      if (want_entropy) extras.entropy = entropy.view;
      const Tensor* saved_entropy =
          options.entropy_weight != 0.0f ? &entropy.view : nullptr;
      if (want_logprob) {
        ASSIGN_OR_RETURN(
            logprob, EmptyTensor(context->allocator(), DType::kF32, {tokens}));
        extras.target_logprob = logprob.view;
      }
      const CrossEntropyExtras* extras_arg =
          want_predicted || want_accuracy || want_entropy || want_logprob
              ? &extras
              : nullptr;
      RETURN_IF_ERROR(
          context->ReserveWorkspace(CrossEntropyWorkspaceBytes(tokens, vocab)));
      const double bytes_read =
          static_cast<double>(tokens) * vocab * DTypeSize(dtype);
      // Once per case, not per op: the ceilings depend only on the bytes. The
      // copies write to the gradient, as backward and fused do.
      Ceilings ceilings;
#ifdef LOSSRT_WITH_CUDA
      if (!device.is_cpu()) {
        ASSIGN_OR_RETURN(ceilings,
                         MeasureCeilings(*context, logits, grad.view.data,
                                         tokens * vocab * DTypeSize(dtype),
                                         sm_count, warmup, repeats));
      }
#endif
      struct Op {
        const char* name;
        double bytes;
        std::function<absl::Status(int)> fn;
      };
      std::vector<Op> ops = {
          {"forward", bytes_read,
           [&](int i) {
             return CrossEntropyForward(*context, logits[i % kSets].view,
                                        targets.view, options, loss.view,
                                        &lse.view, extras_arg);
           }},
          {"backward", 2 * bytes_read,
           [&](int i) {
             return CrossEntropyBackward(*context, logits[i % kSets].view,
                                         targets.view, lse.view, grad_loss.view,
                                         options, grad.view, saved_entropy);
           }},
          {"fused", 2 * bytes_read,
           [&](int i) {
             return CrossEntropyForwardBackward(
                 *context, logits[i % kSets].view, targets.view, options,
                 loss.view, &lse.view, grad.view, nullptr, extras_arg);
           }},
      };
      for (Op& op : ops) {
        double ms = 0;
        if (device.is_cpu()) {
          std::vector<double> times;
          for (int i = 0; i < 3; ++i) {
            auto start = std::chrono::steady_clock::now();
            RETURN_IF_ERROR(op.fn(i));
            times.push_back(std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - start)
                                .count());
          }
          std::sort(times.begin(), times.end());
          ms = times[1];
        } else {
#ifdef LOSSRT_WITH_CUDA
          ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(*context));
          ASSIGN_OR_RETURN(ms, bench::MedianMs(stream, warmup, repeats, op.fn));
#endif
        }
        rows.push_back(
            Row{std::string(dtype_name), vocab, op.name, ms * 1e3, op.bytes});
        rows.back().ceilings = ceilings;
      }
      RETURN_IF_ERROR(context->Synchronize());
      // The check scales the first rows' sum by 1 / tokens: the mean's
      // denominator only without class weights and ignored targets.
      if (!device.is_cpu() && !options.class_weights.has_value() &&
          ignore_every == 0) {
        ASSIGN_OR_RETURN(Check check,
                         CheckAgainstCpu(*context, logits[0].view, targets.view,
                                         lse.view, grad.view, options));
        rows.back().check = check;
      }
    }
  }
  std::printf(
      "\ncross-entropy, tokens=%lld, mean reduction, validate_targets=%d, "
      "label_smoothing=%g, softcap=%g, z_loss=%g, class_weights=%d, "
      "ignore_every=%d, %s\n",
      static_cast<long long>(tokens), options.validate_targets ? 1 : 0,
      options.label_smoothing, options.softcap, options.z_loss,
      absl::GetFlag(FLAGS_class_weights) ? 1 : 0, ignore_every,
      device_name.c_str());
  std::printf(
      "%%ceiling: plain-kernel time / ours; forward against the read ceiling, "
      "backward and fused against the copy ceiling\n");
  // The check columns stay last: only a case's last row has them.
  std::printf("%-5s %7s %-9s %10s %8s %8s %8s %12s %12s %8s %10s %10s\n",
              "dtype", "vocab", "op", "median_us", "GB/s", "%HBM", "%copy",
              "read_ceil_us", "copy_ceil_us", "%ceiling", "lse_err",
              "grad_err");
  std::ofstream json;
  if (!absl::GetFlag(FLAGS_json).empty()) json.open(absl::GetFlag(FLAGS_json));
  for (const Row& row : rows) {
    const double rate = row.bytes / (row.us * 1e-6);
    // The forward only reads the logits; backward and fused also write the
    // gradient, as many bytes again.
    const bool reads_only = row.op == "forward";
    const double ceiling_us =
        reads_only ? row.ceilings.read_us : row.ceilings.copy_us;
    const double ceiling_pct = ceiling_us > 0 ? 100 * ceiling_us / row.us : 0.0;
    std::printf("%-5s %7lld %-9s %10.1f %8.0f %8.1f %8.1f %12.1f %12.1f %8.1f",
                row.dtype.c_str(), static_cast<long long>(row.vocab),
                row.op.c_str(), row.us, rate / 1e9,
                hbm_peak > 0 ? 100 * rate / hbm_peak : 0.0,
                copy_rate > 0 ? 100 * rate / copy_rate : 0.0,
                row.ceilings.read_us, row.ceilings.copy_us, ceiling_pct);
    if (row.check.lse_error >= 0) {
      std::printf(" %10.2e %10.2e\n", row.check.lse_error,
                  row.check.grad_error);
    } else {
      std::printf("\n");
    }
    if (json.is_open()) {
      json << absl::StrFormat(
          "{\"device\": \"%s\", \"tokens\": %d, \"vocab\": %d, \"dtype\": "
          "\"%s\", \"op\": \"%s\", \"median_us\": %.2f, "
          "\"GBps\": %.1f, \"hbm_peak_GBps\": %.1f, \"copy_GBps\": %.1f, "
          "\"validate_targets\": %s, \"label_smoothing\": %g, "
          "\"softcap\": %g, \"z_loss\": %g, \"class_weights\": %s, "
          "\"ignore_every\": %d, \"extras\": \"%s\", \"entropy_weight\": %g, "
          "\"read_ceiling_us\": %.2f, "
          "\"copy_ceiling_us\": %.2f, \"%s\": %.1f}\n",
          device_name, tokens, row.vocab, row.dtype, row.op, row.us, rate / 1e9,
          hbm_peak / 1e9, copy_rate / 1e9,
          options.validate_targets ? "true" : "false", options.label_smoothing,
          options.softcap, options.z_loss,
          absl::GetFlag(FLAGS_class_weights) ? "true" : "false", ignore_every,
          absl::GetFlag(FLAGS_extras), options.entropy_weight,
          row.ceilings.read_us, row.ceilings.copy_us,
          reads_only ? "read_ceiling_pct" : "copy_ceiling_pct", ceiling_pct);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace lossrt

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status status = lossrt::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "cross_entropy bench failed: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
