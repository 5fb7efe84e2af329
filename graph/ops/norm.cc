// LayerNorm and RMSNorm: argument checks, the CPU loops (float and double,
// reductions in double) and the dispatch to the CUDA kernels
// (graph/ops/norm_cuda.h).
#include "graph/ops/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/ops/op_checks.h"
#include "runtime/dtype.h"
#include "runtime/int_math.h"
#include "runtime/status.h"
#include "runtime/tensor_checks.h"

#ifdef LOSSRT_WITH_CUDA
#include "graph/ops/norm_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace ops {
namespace {

// The GPU backward's first stage writes one partial row of d_gamma/d_beta per
// block. It runs one wave of the GPU (cuda::NormBackwardBlocks), but no more
// than one block per kMinRowsPerBackwardBlock rows, so that the partial rows
// stay few next to the rows they sum.
constexpr int64_t kMinRowsPerBackwardBlock = 16;
// The most blocks per SM cuda::NormBackwardBlocks picks (2048 threads an SM
// over its 128-thread blocks).
constexpr int64_t kMaxBackwardBlocksPerSm = 16;
// SMs assumed when the count cannot be queried (more than any GPU has yet).
constexpr int64_t kFallbackSms = 256;

int64_t MaxBackwardBlocks(int64_t rows) {
  return CeilDiv(rows, kMinRowsPerBackwardBlock);
}

absl::Status CheckEps(float eps) {
  if (!(eps >= 0.0f) || !std::isfinite(eps)) {
    return InvalidArgument("eps must be finite and >= 0, got ", eps);
  }
  return absl::OkStatus();
}

struct Dims {
  int64_t rows = 0;
  int64_t cols = 0;
};

// x [rows, C] in an activation dtype with C >= 1, and gamma [C] in x's dtype.
absl::StatusOr<Dims> CheckInput(const Context& context, const Tensor& x,
                                const Tensor& gamma) {
  RETURN_IF_ERROR(CheckActivationDType(context, x.dtype, "x"));
  RETURN_IF_ERROR(CheckTensor(context, x, {-1, -1}, {x.dtype}, "x"));
  const Dims dims{x.dim(0), x.dim(1)};
  if (dims.cols < 1) {
    return InvalidArgument("x: a norm needs at least one column, got ",
                           x.ShapeString());
  }
  RETURN_IF_ERROR(CheckTensor(context, gamma, {dims.cols}, {x.dtype}, "gamma"));
  return dims;
}

absl::Status NoCuda(const char* op) {
  return absl::UnavailableError(
      absl::StrCat(op, " on a CUDA device: built without CUDA"));
}

// ---------------------------------------------------------------------------
// CPU. T is float or double (activations, and the statistics and parameter
// gradients, which share T on the CPU); reductions are in double.

template <typename T>
void ForwardCpu(const T* x, const T* gamma, const T* beta, int64_t rows,
                int64_t cols, double eps, bool rms, T* y, T* mean, T* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x_row = x + r * cols;
    double mu = 0.0;
    if (!rms) {
      for (int64_t c = 0; c < cols; ++c) mu += x_row[c];
      mu /= static_cast<double>(cols);
    }
    double squares = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double d = x_row[c] - mu;
      squares += d * d;
    }
    const double rs =
        1.0 / std::sqrt(squares / static_cast<double>(cols) + eps);
    if (!rms) mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
    T* y_row = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      double value = (x_row[c] - mu) * rs * gamma[c];
      if (beta != nullptr) value += beta[c];
      y_row[c] = static_cast<T>(value);
    }
  }
}

// `sums` is 2 * cols doubles of scratch: the d_gamma and d_beta column sums,
// added to d_gamma/d_beta at the end (one rounding each).
template <typename T>
void BackwardCpu(const T* x, const T* gamma, const T* mean, const T* rstd,
                 const T* dy, int64_t rows, int64_t cols, bool rms, T* dx,
                 bool accumulate_dx, T* d_gamma, T* d_beta, double* sums) {
  double* sum_gamma = sums;
  double* sum_beta = sums + cols;
  std::fill(sums, sums + 2 * cols, 0.0);
  const double inv_cols = 1.0 / static_cast<double>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x_row = x + r * cols;
    const T* dy_row = dy + r * cols;
    T* dx_row = dx + r * cols;
    // The saved statistics, as the forward rounded them to T.
    const double mu = rms ? 0.0 : static_cast<double>(mean[r]);
    const double rs = rstd[r];
    double sum_g = 0.0;
    double sum_gx = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xh = (x_row[c] - mu) * rs;
      const double g = static_cast<double>(dy_row[c]) * gamma[c];
      sum_g += g;
      sum_gx += g * xh;
      sum_gamma[c] += dy_row[c] * xh;
      sum_beta[c] += dy_row[c];
    }
    const double mean_g = rms ? 0.0 : sum_g * inv_cols;
    const double mean_gx = sum_gx * inv_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const double xh = (x_row[c] - mu) * rs;
      const double g = static_cast<double>(dy_row[c]) * gamma[c];
      double value = rs * (g - mean_g - xh * mean_gx);
      if (accumulate_dx) value += dx_row[c];
      dx_row[c] = static_cast<T>(value);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    d_gamma[c] = static_cast<T>(d_gamma[c] + sum_gamma[c]);
    if (d_beta != nullptr) d_beta[c] = static_cast<T>(d_beta[c] + sum_beta[c]);
  }
}

// ---------------------------------------------------------------------------
// Shared by LayerNorm and RMSNorm (mean and beta null for RMSNorm).

absl::Status Forward(Context& context, bool rms, const Tensor& x,
                     const Tensor& gamma, const Tensor* beta, float eps,
                     const Tensor& y, const Tensor* mean, const Tensor& rstd) {
  ASSIGN_OR_RETURN(const Dims dims, CheckInput(context, x, gamma));
  if (beta != nullptr) {
    RETURN_IF_ERROR(
        CheckTensor(context, *beta, {dims.cols}, {x.dtype}, "beta"));
  }
  RETURN_IF_ERROR(CheckEps(eps));
  const DType stats_dtype = AccumulatorDType(x.dtype);
  RETURN_IF_ERROR(
      CheckTensor(context, y, {dims.rows, dims.cols}, {x.dtype}, "y"));
  if (mean != nullptr) {
    RETURN_IF_ERROR(
        CheckTensor(context, *mean, {dims.rows}, {stats_dtype}, "mean"));
  }
  RETURN_IF_ERROR(
      CheckTensor(context, rstd, {dims.rows}, {stats_dtype}, "rstd"));
  const Named inputs[] = {{&x, "x"}, {&gamma, "gamma"}, {beta, "beta"}};
  RETURN_IF_ERROR(CheckDisjoint({&y, "y"}, {inputs[0], inputs[1], inputs[2]}));
  if (mean != nullptr) {
    RETURN_IF_ERROR(CheckDisjoint(
        {mean, "mean"}, {inputs[0], inputs[1], inputs[2], {&y, "y"}}));
  }
  RETURN_IF_ERROR(CheckDisjoint(
      {&rstd, "rstd"},
      {inputs[0], inputs[1], inputs[2], {&y, "y"}, {mean, "mean"}}));
  if (dims.rows == 0) return absl::OkStatus();

  if (context.device().is_cpu()) {
    auto run = [&](auto type_tag) {
      using T = decltype(type_tag);
      ForwardCpu<T>(x.data_as<const T>(), gamma.data_as<const T>(),
                    beta != nullptr ? beta->data_as<const T>() : nullptr,
                    dims.rows, dims.cols, eps, rms, y.data_as<T>(),
                    mean != nullptr ? mean->data_as<T>() : nullptr,
                    rstd.data_as<T>());
    };
    if (x.dtype == DType::kF64) {
      run(double{});
    } else {
      run(float{});
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  cuda::NormForwardArgs args;
  args.x = x.data;
  args.gamma = gamma.data;
  args.beta = beta != nullptr ? beta->data : nullptr;
  args.rows = dims.rows;
  args.cols = dims.cols;
  args.eps = eps;
  args.rms = rms;
  args.bf16 = x.dtype == DType::kBF16;
  args.y = y.data;
  args.mean = mean != nullptr ? mean->data_as<float>() : nullptr;
  args.rstd = rstd.data_as<float>();
  CUDA_RETURN_IF_ERROR(cuda::LaunchNormForward(args, stream));
  return absl::OkStatus();
#else
  return NoCuda(rms ? "RmsNormForward" : "LayerNormForward");
#endif
}

absl::Status Backward(Context& context, bool rms, const Tensor& x,
                      const Tensor& gamma, const Tensor* mean,
                      const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                      bool accumulate_dx, const Tensor& d_gamma,
                      const Tensor* d_beta) {
  ASSIGN_OR_RETURN(const Dims dims, CheckInput(context, x, gamma));
  const DType acc_dtype = AccumulatorDType(x.dtype);
  if (mean != nullptr) {
    RETURN_IF_ERROR(
        CheckTensor(context, *mean, {dims.rows}, {acc_dtype}, "mean"));
  }
  RETURN_IF_ERROR(CheckTensor(context, rstd, {dims.rows}, {acc_dtype}, "rstd"));
  RETURN_IF_ERROR(
      CheckTensor(context, dy, {dims.rows, dims.cols}, {x.dtype}, "dy"));
  RETURN_IF_ERROR(
      CheckTensor(context, dx, {dims.rows, dims.cols}, {x.dtype}, "dx"));
  RETURN_IF_ERROR(
      CheckTensor(context, d_gamma, {dims.cols}, {acc_dtype}, "d_gamma"));
  if (d_beta != nullptr) {
    RETURN_IF_ERROR(
        CheckTensor(context, *d_beta, {dims.cols}, {acc_dtype}, "d_beta"));
  }
  const Named x_in{&x, "x"};
  const Named gamma_in{&gamma, "gamma"};
  const Named mean_in{mean, "mean"};
  const Named rstd_in{&rstd, "rstd"};
  const Named dy_in{&dy, "dy"};
  RETURN_IF_ERROR(
      CheckDisjoint({&dx, "dx"}, {x_in, gamma_in, mean_in, rstd_in, dy_in}));
  RETURN_IF_ERROR(
      CheckDisjoint({&d_gamma, "d_gamma"},
                    {x_in, gamma_in, mean_in, rstd_in, dy_in, {&dx, "dx"}}));
  if (d_beta != nullptr) {
    RETURN_IF_ERROR(CheckDisjoint({d_beta, "d_beta"}, {x_in,
                                                       gamma_in,
                                                       mean_in,
                                                       rstd_in,
                                                       dy_in,
                                                       {&dx, "dx"},
                                                       {&d_gamma, "d_gamma"}}));
  }
  if (dims.rows == 0) return absl::OkStatus();

  if (context.device().is_cpu()) {
    ASSIGN_OR_RETURN(void* workspace,
                     context.Workspace(NormBackwardWorkspaceBytes(
                         context.device(), dims.rows, dims.cols)));
    auto run = [&](auto type_tag) {
      using T = decltype(type_tag);
      BackwardCpu<T>(x.data_as<const T>(), gamma.data_as<const T>(),
                     mean != nullptr ? mean->data_as<const T>() : nullptr,
                     rstd.data_as<const T>(), dy.data_as<const T>(), dims.rows,
                     dims.cols, rms, dx.data_as<T>(), accumulate_dx,
                     d_gamma.data_as<T>(),
                     d_beta != nullptr ? d_beta->data_as<T>() : nullptr,
                     static_cast<double*>(workspace));
    };
    if (x.dtype == DType::kF64) {
      run(double{});
    } else {
      run(float{});
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  cuda::NormBackwardArgs args;
  args.x = x.data;
  args.gamma = gamma.data;
  args.mean = mean != nullptr ? mean->data_as<const float>() : nullptr;
  args.rstd = rstd.data_as<const float>();
  args.dy = dy.data;
  args.rows = dims.rows;
  args.cols = dims.cols;
  args.rms = rms;
  args.bf16 = x.dtype == DType::kBF16;
  args.dx = dx.data;
  args.accumulate_dx = accumulate_dx;
  args.d_gamma = d_gamma.data_as<float>();
  args.d_beta = d_beta != nullptr ? d_beta->data_as<float>() : nullptr;
  int num_sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &num_sms, cudaDevAttrMultiProcessorCount, context.device().ordinal));
  CUDA_RETURN_IF_ERROR(cuda::NormBackwardBlocks(
      args, num_sms, static_cast<int>(MaxBackwardBlocks(dims.rows)),
      &args.blocks));
  // At most NormBackwardWorkspaceBytes: blocks <= 16 * num_sms.
  ASSIGN_OR_RETURN(void* workspace,
                   context.Workspace(2 * int64_t{args.blocks} * dims.cols *
                                     static_cast<int64_t>(sizeof(float))));
  args.partials = static_cast<float*>(workspace);
  CUDA_RETURN_IF_ERROR(cuda::LaunchNormBackward(args, stream));
  return absl::OkStatus();
#else
  return NoCuda(rms ? "RmsNormBackward" : "LayerNormBackward");
#endif
}

}  // namespace

int64_t NormBackwardWorkspaceBytes(const Device& device, int64_t rows,
                                   int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  if (device.is_cpu()) {
    return 2 * cols * static_cast<int64_t>(sizeof(double));
  }
  int64_t num_sms = kFallbackSms;
#ifdef LOSSRT_WITH_CUDA
  int queried = 0;
  if (cudaDeviceGetAttribute(&queried, cudaDevAttrMultiProcessorCount,
                             device.ordinal) == cudaSuccess &&
      queried > 0) {
    num_sms = queried;
  }
#endif
  // d_gamma and d_beta partial rows, f32, for the most blocks the backward
  // can pick.
  const int64_t blocks =
      std::min(MaxBackwardBlocks(rows), kMaxBackwardBlocksPerSm * num_sms);
  return 2 * blocks * cols * static_cast<int64_t>(sizeof(float));
}

absl::Status LayerNormForward(Context& context, const Tensor& x,
                              const Tensor& gamma, const Tensor* beta,
                              float eps, const Tensor& y, const Tensor& mean,
                              const Tensor& rstd) {
  return Forward(context, /*rms=*/false, x, gamma, beta, eps, y, &mean, rstd);
}

absl::Status LayerNormBackward(Context& context, const Tensor& x,
                               const Tensor& gamma, const Tensor& mean,
                               const Tensor& rstd, const Tensor& dy,
                               const Tensor& dx, bool accumulate_dx,
                               const Tensor& d_gamma, const Tensor* d_beta) {
  return Backward(context, /*rms=*/false, x, gamma, &mean, rstd, dy, dx,
                  accumulate_dx, d_gamma, d_beta);
}

absl::Status RmsNormForward(Context& context, const Tensor& x,
                            const Tensor& gamma, float eps, const Tensor& y,
                            const Tensor& rstd) {
  return Forward(context, /*rms=*/true, x, gamma, /*beta=*/nullptr, eps, y,
                 /*mean=*/nullptr, rstd);
}

absl::Status RmsNormBackward(Context& context, const Tensor& x,
                             const Tensor& gamma, const Tensor& rstd,
                             const Tensor& dy, const Tensor& dx,
                             bool accumulate_dx, const Tensor& d_gamma) {
  return Backward(context, /*rms=*/true, x, gamma, /*mean=*/nullptr, rstd, dy,
                  dx, accumulate_dx, d_gamma, /*d_beta=*/nullptr);
}

}  // namespace ops
}  // namespace lossrt
