// Benchmark of the causal attention op (`bazel run -c opt //bench:attention`):
// for each head dim (64, 128), context (1024..8192) and GPU kernel of
// --kernels (default: auto, what the graph calls, and cudnn, cuDNN's fused
// attention), the median time of the op's public forward and backward
// (graph/ops/attention.h; bf16) over batch = batch_tokens / seq sequences and
// --heads heads, as TFLOP/s and as a fraction of a dense bf16 cuBLASLt 8192^3
// GEMM measured at the start of the same run. Kernels that this build lacks
// (cudnn without cuDNN at build time) are left out with a note.
//
// FLOPs follow the FlashAttention convention: the causal forward counts its two
// matmuls over half the score square, 2 * 2 * B * H * S^2 * D / 2; the backward
// counts 2.5x that (five matmuls against two). Inputs rotate over at least two
// sets, together several times the L2 cache. Once per shape, one (batch, head)
// pair of the GPU's out, lse and d_qkv is checked against the CPU op (f32) on
// the same bf16 inputs. Without a GPU it runs the CPU backend (f32) on a tiny
// size and says so.
//
//   ./bazelw run -c opt //bench:attention -- --seqs=1024,8192 --head_dims=128
//       --kernels=flash,cudnn --json=/tmp/attention.jsonl
#include "graph/ops/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
#include "runtime/cuda_context.h"
#endif

ABSL_FLAG(std::string, seqs, "1024,2048,4096,8192",
          "comma-separated contexts (sequence lengths)");
ABSL_FLAG(std::string, head_dims, "64,128",
          "comma-separated head dims (GPU: multiples of 8 up to 128)");
ABSL_FLAG(int64_t, batch_tokens, 16384,
          "tokens per call, batch x seq: batch = batch_tokens / seq (each seq "
          "must divide it)");
ABSL_FLAG(int64_t, heads, 12,
          "attention heads (12: width 768 at head dim 64, 1536 at 128)");
ABSL_FLAG(int, repeats, 20, "timed repetitions per case (median reported)");
ABSL_FLAG(int, warmup, 5, "untimed repetitions first");
ABSL_FLAG(bool, check, true,
          "check one (batch, head) pair per shape against the CPU op");
ABSL_FLAG(std::string, json, "",
          "write the results as JSON lines to this path (one per shape and "
          "op)");
ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda[:N]");
ABSL_FLAG(std::string, kernels, "auto,cudnn",
          "comma-separated GPU kernels to time side by side: auto (the "
          "default options, as the graph calls the op), flash, cudnn, cublas, "
          "cudnn_atomic (cuDNN with CausalAttentionOptions::deterministic "
          "false: dQ added with atomics)");

namespace lossrt {
namespace {

// The GEMM whose rate is the ceiling: n^3, bf16.
constexpr int64_t kGemmSize = 8192;

// Errors of one (batch, head) pair against the CPU op: out and d_qkv as the
// largest absolute difference over the reference's largest magnitude (d_qkv:
// the worst of its q, k and v parts), lse as the largest absolute difference.
// -1: not checked. A NaN shows as 1.
struct Check {
  double out_error = -1;
  double lse_error = -1;
  double dqkv_error = -1;
};

// A --kernels entry: the op's kernel and its backward's determinism.
struct KernelEntry {
  ops::AttentionKernel kernel = ops::AttentionKernel::kAuto;
  bool deterministic = true;
  const char* name() const {
    return deterministic ? ops::AttentionKernelName(kernel) : "cudnn_atomic";
  }
};

struct Row {
  KernelEntry kernel;
  int64_t head_dim = 0;
  int64_t seq = 0;
  int64_t batch = 0;
  int64_t heads = 0;
  double forward_us = 0;
  double backward_us = 0;
  double forward_flops = 0;  // the convention's count; backward: 2.5x
  Check check;
};

// One set of the op's tensors. qkv [rows, 3C], out and d_out [rows, C], lse
// [batch, heads, seq], d_qkv [rows, 3C]; rows = batch * seq, C = heads * D.
struct Set {
  OwnedTensor qkv, out, lse, d_out, d_qkv;
};

// Causal forward FLOPs by the FlashAttention convention: two matmuls
// (Q K^T and P V) of 2 * S^2 * D each per (batch, head), over half the square.
double ForwardFlops(int64_t batch, int64_t heads, int64_t seq,
                    int64_t head_dim) {
  return 2.0 * 2.0 * batch * heads * static_cast<double>(seq) * seq * head_dim /
         2.0;
}
constexpr double kBackwardFlopsRatio = 2.5;

// --kernels: the kernels this build has, in the order given (at least one).
absl::StatusOr<std::vector<KernelEntry>> ParseKernels(const std::string& text) {
  std::vector<KernelEntry> kernels;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    KernelEntry entry;
    if (piece == "cudnn_atomic") {
      entry.kernel = ops::AttentionKernel::kCudnn;
      entry.deterministic = false;
    } else {
      const absl::StatusOr<ops::AttentionKernel> kernel =
          ops::ParseAttentionKernel(piece);
      if (!kernel.ok()) {
        return InvalidArgument("--kernels: ", kernel.status().message());
      }
      entry.kernel = *kernel;
    }
    const absl::Status built = ops::AttentionKernelBuilt(entry.kernel);
    if (built.ok()) {
      kernels.push_back(entry);
    } else {
      std::printf("note: leaving out --kernels entry %s: %s\n", entry.name(),
                  std::string(built.message()).c_str());
    }
  }
  if (kernels.empty()) {
    return InvalidArgument("--kernels names no kernel that this build has");
  }
  return kernels;
}

absl::StatusOr<std::vector<int64_t>> ParseList(const std::string& text,
                                               const char* flag) {
  std::vector<int64_t> values;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t value;
    if (!absl::SimpleAtoi(piece, &value) || value < 1) {
      return InvalidArgument("--", flag, ": bad entry '", piece,
                             "' (positive integers, comma-separated)");
    }
    values.push_back(value);
  }
  if (values.empty()) return InvalidArgument("--", flag, " is empty");
  return values;
}

// Element i of a host tensor of f32 or bf16 as a float.
float ValueAt(const std::vector<uint16_t>& bf16, const std::vector<float>& f32,
              bool is_bf16, int64_t i) {
  return is_bf16 ? Bf16BitsToFloat(bf16[i]) : f32[i];
}

// The `rows` x `cols` block at row `row0` of a 2-D tensor `t` (any device),
// copied to the host as floats.
absl::StatusOr<std::vector<float>> RowsToHost(Context& context, const Tensor& t,
                                              int64_t row0, int64_t rows) {
  const int64_t cols = t.dim(1);
  const int64_t size = DTypeSize(t.dtype);
  Tensor block = Tensor::Of(static_cast<char*>(t.data) + row0 * cols * size,
                            t.dtype, {rows, cols}, t.device);
  const bool is_bf16 = t.dtype == DType::kBF16;
  std::vector<uint16_t> bits(is_bf16 ? rows * cols : 0);
  std::vector<float> floats(is_bf16 ? 0 : rows * cols);
  void* host = is_bf16 ? static_cast<void*>(bits.data())
                       : static_cast<void*>(floats.data());
  RETURN_IF_ERROR(CopyTensor(
      block, Tensor::Of(host, t.dtype, {rows, cols}, Device::Cpu()), context));
  std::vector<float> values(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    values[i] = ValueAt(bits, floats, is_bf16, i);
  }
  return values;
}

// Largest |a(i) - b(i)| over i < n; with `relative`, over the largest |b(i)|
// (b is the reference). NaN shows as 1.
double MaxError(int64_t n, const std::function<double(int64_t)>& a,
                const std::function<double(int64_t)>& b, bool relative) {
  double diff = 0, scale = 0;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const double x = a(i), y = b(i), d = std::abs(x - y);
    if (!(d == d)) nan = true;
    diff = std::max(diff, d);
    scale = std::max(scale, std::abs(y));
  }
  if (nan) return 1.0;
  if (!relative) return diff;
  return scale > 0 ? diff / scale : diff;
}

// Checks pair (b, h) of `set` (the op's forward and backward outputs on
// `context`) against the CPU op run in f32 on that pair's q, k, v and d_out as
// the set holds them (so bf16 inputs are the same numbers on both sides).
absl::StatusOr<Check> CheckPair(Context& context, const Set& set, int64_t batch,
                                int64_t seq, int64_t heads, int64_t head_dim,
                                int64_t b, int64_t h) {
  const int64_t channels = heads * head_dim, d3 = 3 * head_dim;
  RETURN_IF_ERROR(context.Synchronize());
  ASSIGN_OR_RETURN(std::vector<float> qkv,  // [seq, 3C]
                   RowsToHost(context, set.qkv.view, b * seq, seq));
  ASSIGN_OR_RETURN(std::vector<float> out,  // [seq, C]
                   RowsToHost(context, set.out.view, b * seq, seq));
  ASSIGN_OR_RETURN(std::vector<float> d_out,  // [seq, C]
                   RowsToHost(context, set.d_out.view, b * seq, seq));
  ASSIGN_OR_RETURN(std::vector<float> d_qkv,  // [seq, 3C]
                   RowsToHost(context, set.d_qkv.view, b * seq, seq));
  // lse [batch, heads, seq] seen as [batch * heads, seq]: row b * heads + h.
  const Tensor lse_rows = Tensor::Of(set.lse.view.data, set.lse.view.dtype,
                                     {batch * heads, seq}, set.lse.view.device);
  ASSIGN_OR_RETURN(std::vector<float> lse,  // [seq]
                   RowsToHost(context, lse_rows, b * heads + h, 1));

  ASSIGN_OR_RETURN(std::unique_ptr<Context> cpu,
                   Context::Create(Device::Cpu()));
  ASSIGN_OR_RETURN(OwnedTensor ref_qkv,
                   EmptyTensor(cpu->allocator(), DType::kF32, {seq, d3}));
  ASSIGN_OR_RETURN(OwnedTensor ref_d_out,
                   EmptyTensor(cpu->allocator(), DType::kF32, {seq, head_dim}));
  ASSIGN_OR_RETURN(OwnedTensor ref_out,
                   EmptyTensor(cpu->allocator(), DType::kF32, {seq, head_dim}));
  ASSIGN_OR_RETURN(OwnedTensor ref_lse,
                   EmptyTensor(cpu->allocator(), DType::kF32, {1, 1, seq}));
  ASSIGN_OR_RETURN(OwnedTensor ref_d_qkv,
                   EmptyTensor(cpu->allocator(), DType::kF32, {seq, d3}));
  // Column of part p (0 q, 1 k, 2 v), element j of head h in a [*, 3C] row.
  auto column = [&](int64_t p, int64_t j) {
    return p * channels + h * head_dim + j;
  };
  float* q1 = ref_qkv.view.data_as<float>();
  float* g1 = ref_d_out.view.data_as<float>();
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t p = 0; p < 3; ++p) {
      for (int64_t j = 0; j < head_dim; ++j) {
        q1[t * d3 + p * head_dim + j] = qkv[t * 3 * channels + column(p, j)];
      }
    }
    for (int64_t j = 0; j < head_dim; ++j) {
      g1[t * head_dim + j] = d_out[t * channels + h * head_dim + j];
    }
  }
  RETURN_IF_ERROR(cpu->ReserveWorkspace(ops::CausalAttentionWorkspaceBytes(
      cpu->device(), DType::kF32, 1, seq, 1, head_dim)));
  RETURN_IF_ERROR(ops::CausalAttentionForward(*cpu, ref_qkv.view, 1, seq, 1,
                                              ref_out.view, ref_lse.view));
  RETURN_IF_ERROR(ops::CausalAttentionBackward(
      *cpu, ref_qkv.view, ref_out.view, ref_lse.view, ref_d_out.view, 1, seq, 1,
      ref_d_qkv.view, /*accumulate=*/false));

  const float* o1 = ref_out.view.data_as<float>();
  const float* l1 = ref_lse.view.data_as<float>();
  const float* dq1 = ref_d_qkv.view.data_as<float>();
  Check check;
  check.out_error = MaxError(
      seq * head_dim,
      [&](int64_t i) {
        return out[(i / head_dim) * channels + h * head_dim + i % head_dim];
      },
      [&](int64_t i) { return o1[i]; }, /*relative=*/true);
  check.lse_error = MaxError(
      seq, [&](int64_t i) { return lse[i]; }, [&](int64_t i) { return l1[i]; },
      /*relative=*/false);
  check.dqkv_error = 0;
  for (int64_t p = 0; p < 3; ++p) {
    check.dqkv_error = std::max(
        check.dqkv_error,
        MaxError(
            seq * head_dim,
            [&](int64_t i) {
              return d_qkv[(i / head_dim) * 3 * channels +
                           column(p, i % head_dim)];
            },
            [&](int64_t i) {
              return dq1[(i / head_dim) * d3 + p * head_dim + i % head_dim];
            },
            /*relative=*/true));
  }
  return check;
}

// Median milliseconds of fn(i) on the context's device: CUDA events after
// warm-up on a GPU, a steady clock over three calls on the CPU.
absl::StatusOr<double> MedianMs(Context& context, int warmup, int repeats,
                                const std::function<absl::Status(int)>& fn) {
  if (context.device().is_cpu()) {
    std::vector<double> times;
    for (int i = 0; i < 3; ++i) {
      const auto start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(fn(i));
      times.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
    std::sort(times.begin(), times.end());
    return times[1];
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  return bench::MedianMs(stream, warmup, repeats, fn);
#else
  return absl::UnavailableError("built without CUDA");
#endif
}

absl::Status Run() {
  ASSIGN_OR_RETURN(Device device, ParseDevice(absl::GetFlag(FLAGS_device)));
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(device));
  ASSIGN_OR_RETURN(std::vector<int64_t> seqs,
                   ParseList(absl::GetFlag(FLAGS_seqs), "seqs"));
  ASSIGN_OR_RETURN(std::vector<int64_t> head_dims,
                   ParseList(absl::GetFlag(FLAGS_head_dims), "head_dims"));
  int64_t batch_tokens = absl::GetFlag(FLAGS_batch_tokens);
  int64_t heads = absl::GetFlag(FLAGS_heads);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (repeats < 1 || warmup < 0) {
    return InvalidArgument("--repeats must be >= 1 and --warmup >= 0, got ",
                           repeats, " and ", warmup);
  }
  if (heads < 1) return InvalidArgument("--heads must be >= 1, got ", heads);
  std::vector<KernelEntry> kernels = {KernelEntry{}};
  if (device.is_cuda()) {
    ASSIGN_OR_RETURN(kernels, ParseKernels(absl::GetFlag(FLAGS_kernels)));
  }
  std::string device_name = "cpu";
  DType dtype = DType::kBF16;
  double gemm_tflops = 0;
  int64_t l2_bytes = 0;
  if (device.is_cpu()) {
    // The CPU backend takes f32 (no bf16): a size that runs in a second.
    dtype = DType::kF32;
    seqs = {128};
    batch_tokens = 256;
    heads = 2;
    std::printf(
        "No GPU: running the CPU backend (f32) on batch 2 x seq 128, 2 heads, "
        "head dims %s (a tiny size, not the GPU workload; no GEMM rate).\n",
        absl::GetFlag(FLAGS_head_dims).c_str());
  } else {
#ifdef LOSSRT_WITH_CUDA
    ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(device));
    device_name = info.name;
    l2_bytes = info.l2_cache_bytes;
    ASSIGN_OR_RETURN(gemm_tflops, bench::GemmTflops(*context, kGemmSize));
    std::printf(
        "%s: %d SMs, L2 %.0f MiB; bf16 cuBLASLt GEMM %lld^3: %.0f TFLOP/s "
        "(measured now)\n",
        info.name.c_str(), info.sm_count, l2_bytes / 1048576.0,
        static_cast<long long>(kGemmSize), gemm_tflops);
#endif
  }
  for (int64_t seq : seqs) {
    if (batch_tokens % seq != 0) {
      return InvalidArgument("--batch_tokens ", batch_tokens,
                             " is not a multiple of seq ", seq);
    }
  }
  const bool check = absl::GetFlag(FLAGS_check);
  uint64_t seed = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  std::vector<Row> rows;
  for (int64_t head_dim : head_dims) {
    for (int64_t seq : seqs) {
      Row shape;
      shape.head_dim = head_dim;
      shape.seq = seq;
      shape.batch = batch_tokens / seq;
      shape.heads = heads;
      shape.forward_flops = ForwardFlops(shape.batch, heads, seq, head_dim);
      const int64_t tokens = shape.batch * seq, channels = heads * head_dim;
      const int64_t size = DTypeSize(dtype);
      const int64_t set_bytes = tokens * channels * size * 8 +
                                shape.batch * heads * seq * 4;  // + lse
      // At least two sets, together at least four times the L2 cache, so that
      // no call finds its inputs in L2 from the call before.
      const int sets = static_cast<int>(std::min<int64_t>(
          16,
          std::max<int64_t>(2, (4 * l2_bytes + set_bytes - 1) / set_bytes)));
      std::vector<Set> data(sets);
      for (Set& s : data) {
        ASSIGN_OR_RETURN(s.qkv, EmptyTensor(context->allocator(), dtype,
                                            {tokens, 3 * channels}));
        ASSIGN_OR_RETURN(s.out, EmptyTensor(context->allocator(), dtype,
                                            {tokens, channels}));
        ASSIGN_OR_RETURN(s.lse, EmptyTensor(context->allocator(), DType::kF32,
                                            {shape.batch, heads, seq}));
        ASSIGN_OR_RETURN(s.d_out, EmptyTensor(context->allocator(), dtype,
                                              {tokens, channels}));
        ASSIGN_OR_RETURN(s.d_qkv, EmptyTensor(context->allocator(), dtype,
                                              {tokens, 3 * channels}));
        RETURN_IF_ERROR(FillNormal(s.qkv.view, ++seed, 0.0f, 1.0f, *context));
        RETURN_IF_ERROR(FillNormal(s.d_out.view, ++seed, 0.0f, 1.0f, *context));
      }
      for (const KernelEntry& kernel : kernels) {
        Row row = shape;
        row.kernel = kernel;
        ops::CausalAttentionOptions options;
        options.kernel = kernel.kernel;
        options.deterministic = kernel.deterministic;
        // The Context overload: exact for cuDNN, whose graphs it builds (so
        // that the timed calls only run them).
        ASSIGN_OR_RETURN(
            const int64_t workspace,
            ops::CausalAttentionWorkspaceBytes(*context, dtype, row.batch, seq,
                                               heads, head_dim, options));
        RETURN_IF_ERROR(context->ReserveWorkspace(workspace));
        auto forward = [&](int i) {
          const Set& s = data[i % sets];
          return ops::CausalAttentionForward(*context, s.qkv.view, row.batch,
                                             seq, heads, s.out.view, s.lse.view,
                                             options);
        };
        auto backward = [&](int i) {
          const Set& s = data[i % sets];
          return ops::CausalAttentionBackward(
              *context, s.qkv.view, s.out.view, s.lse.view, s.d_out.view,
              row.batch, seq, heads, s.d_qkv.view, /*accumulate=*/false,
              options);
        };
        // Every set's out and lse first: the backward reads them.
        for (int i = 0; i < sets; ++i) RETURN_IF_ERROR(forward(i));
        ASSIGN_OR_RETURN(double forward_ms,
                         MedianMs(*context, warmup, repeats, forward));
        ASSIGN_OR_RETURN(double backward_ms,
                         MedianMs(*context, warmup, repeats, backward));
        row.forward_us = forward_ms * 1e3;
        row.backward_us = backward_ms * 1e3;
        if (check) {
          // The last sequence and a middle head: both offsets nonzero.
          ASSIGN_OR_RETURN(row.check,
                           CheckPair(*context, data[0], row.batch, seq, heads,
                                     head_dim, row.batch - 1, heads / 2));
        }
        RETURN_IF_ERROR(context->Synchronize());
        rows.push_back(row);
        std::fflush(stdout);
      }
    }
  }

  const std::string timing =
      device.is_cpu()
          ? std::string("CPU: steady clock, median of 3")
          : absl::StrFormat("CUDA events, median of %d after %d warm-up",
                            repeats, warmup);
  std::printf(
      "\ncausal attention, %s, batch x seq = %lld tokens, %lld heads, %s; %s\n",
      DTypeName(dtype), static_cast<long long>(batch_tokens),
      static_cast<long long>(heads), device_name.c_str(), timing.c_str());
  std::printf(
      "FLOPs (FlashAttention convention): forward 2*2*B*H*S^2*D/2 (two "
      "matmuls, half the square), backward 2.5x forward; %%gemm: of the bf16 "
      "GEMM rate %s\n",
      gemm_tflops > 0 ? "above" : "(not measured on the CPU)");
  if (check) {
    std::printf(
        "errors: one (batch, head) pair against the CPU op in f32 on the same "
        "inputs; out, d_qkv: max |diff| / max |ref|; lse: max |diff|\n");
  }
  std::printf(
      "| %-12s | %4s | %5s | %5s | %5s | %10s | %8s | %6s | %10s | %8s | %6s "
      "| %9s | %9s | %9s |\n",
      "kernel", "D", "seq", "batch", "heads", "fwd_us", "fwd_TF/s", "%gemm",
      "bwd_us", "bwd_TF/s", "%gemm", "out_err", "lse_err", "dqkv_err");
  std::printf(
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      "\n");
  std::ofstream json;
  if (!absl::GetFlag(FLAGS_json).empty()) {
    json.open(absl::GetFlag(FLAGS_json));
    if (!json) {
      return absl::InternalError(absl::StrCat(
          "cannot open --json=", absl::GetFlag(FLAGS_json), " for writing"));
    }
  }
  for (const Row& row : rows) {
    const double forward_tflops =
                     row.forward_flops / (row.forward_us * 1e-6) / 1e12,
                 backward_tflops = kBackwardFlopsRatio * row.forward_flops /
                                   (row.backward_us * 1e-6) / 1e12;
    auto fraction = [&](double tflops) {
      return gemm_tflops > 0 ? tflops / gemm_tflops : 0.0;
    };
    auto percent = [&](double tflops) {
      return gemm_tflops > 0 ? absl::StrFormat("%.1f", 100 * fraction(tflops))
                             : std::string("-");
    };
    auto error = [](double e) {
      return e >= 0 ? absl::StrFormat("%.2e", e) : std::string("-");
    };
    const char* kernel = device.is_cpu() ? "cpu" : row.kernel.name();
    std::printf(
        "| %-12s | %4lld | %5lld | %5lld | %5lld | %10.1f | %8.2f | %6s | "
        "%10.1f | %8.2f | %6s | %9s | %9s | %9s |\n",
        kernel, static_cast<long long>(row.head_dim),
        static_cast<long long>(row.seq), static_cast<long long>(row.batch),
        static_cast<long long>(row.heads), row.forward_us, forward_tflops,
        percent(forward_tflops).c_str(), row.backward_us, backward_tflops,
        percent(backward_tflops).c_str(), error(row.check.out_error).c_str(),
        error(row.check.lse_error).c_str(),
        error(row.check.dqkv_error).c_str());
    if (!json.is_open()) continue;
    for (int op = 0; op < 2; ++op) {
      const double us = op == 0 ? row.forward_us : row.backward_us;
      const double tflops = op == 0 ? forward_tflops : backward_tflops;
      json << absl::StrFormat(
          "{\"device\": \"%s\", \"dtype\": \"%s\", \"kernel\": \"%s\", "
          "\"op\": \"%s\", "
          "\"head_dim\": %d, \"seq\": %d, \"batch\": %d, \"heads\": %d, "
          "\"median_us\": %.2f, \"flops\": %.6e, \"tflops\": %.2f, "
          "\"gemm_tflops\": %.1f, \"gemm_fraction\": %.4f, "
          "\"out_error\": %.3e, \"lse_error\": %.3e, \"dqkv_error\": %.3e}\n",
          device_name, DTypeName(dtype), kernel,
          op == 0 ? "forward" : "backward", row.head_dim, row.seq, row.batch,
          row.heads, us,
          (op == 0 ? 1.0 : kBackwardFlopsRatio) * row.forward_flops, tflops,
          gemm_tflops, fraction(tflops), row.check.out_error,
          row.check.lse_error, row.check.dqkv_error);
    }
  }
  if (json.is_open() && !json) {
    return absl::InternalError(
        absl::StrCat("writing --json=", absl::GetFlag(FLAGS_json), " failed"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace lossrt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times the causal attention op's forward and backward (bf16 on a GPU) "
      "per head dim, context and kernel (--kernels), in TFLOP/s and as a "
      "fraction of a bf16 "
      "8192^3 cuBLASLt GEMM measured in the same run. FLOPs by the "
      "FlashAttention convention: forward 2*2*B*H*S^2*D/2 (two matmuls over "
      "half the causal square), backward 2.5x the forward. Without a GPU: a "
      "tiny CPU case. See the flags with --helpfull.");
  absl::ParseCommandLine(argc, argv);
  absl::Status status = lossrt::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "attention bench failed: %s\n",
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
