// AdamW: argument checks, the step's constants (computed once in double), the
// CPU backend (plain loops over float or double) and the dispatch to the CUDA
// kernels. Every check runs before anything is written.
#include "graph/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "runtime/dtype.h"
#include "runtime/int_math.h"
#include "runtime/status.h"
#include "runtime/tensor_checks.h"

#ifdef LOSSRT_WITH_CUDA
#include "graph/optim/adamw_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace optim {
namespace {

constexpr int64_t kAlign = 256;
// The GPU norm's first stage: at least this many elements per block (16 per
// thread of 512), and at most kMaxNormPartials blocks. The grid depends on n
// alone, so the order of summation, and the result, do not change run to run.
constexpr int64_t kNormElementsPerBlock = 512 * 16;
constexpr int64_t kMaxNormPartials = 1024;

int64_t NormPartials(int64_t n) {
  if (n <= 0) return 0;
  return std::min(kMaxNormPartials, CeilDiv(n, kNormElementsPerBlock));
}

// InvalidArgument when any two of `tensors` overlap.
absl::Status CheckNoOverlaps(std::initializer_list<Named> tensors) {
  for (auto a = tensors.begin(); a != tensors.end(); ++a) {
    for (auto b = a + 1; b != tensors.end(); ++b) {
      if (a->tensor != nullptr && b->tensor != nullptr &&
          Overlaps(*a->tensor, *b->tensor)) {
        return InvalidArgument(a->name, " and ", b->name, " overlap");
      }
    }
  }
  return absl::OkStatus();
}

// The master dtypes of a device: f32, and f64 on the CPU.
absl::Status CheckMasterTensor(const Context& context, const Tensor& tensor,
                               int64_t n, absl::string_view name) {
  if (context.device().is_cpu()) {
    return CheckTensor(context, tensor, {n}, {DType::kF32, DType::kF64}, name);
  }
  return CheckTensor(context, tensor, {n}, {DType::kF32}, name);
}

// norm: [] or [1], f32 (or f64 for f64 gradients), on the context's device.
absl::Status CheckNorm(const Context& context, const Tensor& norm,
                       DType grads_dtype) {
  if (norm.rank() > 1 || norm.numel() != 1) {
    return InvalidArgument("norm: expected a scalar ([] or [1]), got ",
                           norm.ShapeString());
  }
  if (grads_dtype == DType::kF64) {
    RETURN_IF_ERROR(CheckDType(norm, {DType::kF32, DType::kF64}, "norm"));
  } else {
    RETURN_IF_ERROR(CheckDType(norm, {DType::kF32}, "norm"));
  }
  if (norm.device != context.device()) {
    return InvalidArgument("norm is on ", norm.device.ToString(),
                           ", the context on ", context.device().ToString());
  }
  if (norm.data == nullptr) return InvalidArgument("norm has no data");
  return absl::OkStatus();
}

// Gradients of any shape: contiguous, on the device, a master dtype, at most
// kMaxKernelElements elements. Returns their count.
absl::StatusOr<int64_t> CheckGrads(const Context& context,
                                   const Tensor& grads) {
  if (grads.device != context.device()) {
    return InvalidArgument("grads is on ", grads.device.ToString(),
                           ", the context on ", context.device().ToString());
  }
  if (context.device().is_cpu()) {
    RETURN_IF_ERROR(CheckDType(grads, {DType::kF32, DType::kF64}, "grads"));
  } else {
    RETURN_IF_ERROR(CheckDType(grads, {DType::kF32}, "grads"));
  }
  for (int64_t d : grads.shape) {
    if (d < 0)
      return InvalidArgument("grads: negative dim in ", grads.ShapeString());
  }
  if (!grads.is_contiguous()) {
    return InvalidArgument("grads must be contiguous: ", grads.ShapeString());
  }
  const int64_t n = grads.numel();
  if (n > kMaxKernelElements) {
    return InvalidArgument("grads has ", n,
                           " elements, more than the limit of ",
                           kMaxKernelElements);
  }
  if (n > 0 && grads.data == nullptr)
    return InvalidArgument("grads has no data");
  return n;
}

absl::Status CheckOptions(const AdamWOptions& options, float lr, int64_t step) {
  if (!(options.beta1 >= 0.0f && options.beta1 < 1.0f)) {
    return InvalidArgument("beta1 must be in [0, 1), got ", options.beta1);
  }
  if (!(options.beta2 >= 0.0f && options.beta2 < 1.0f)) {
    return InvalidArgument("beta2 must be in [0, 1), got ", options.beta2);
  }
  if (!(options.eps > 0.0f) || !std::isfinite(options.eps)) {
    return InvalidArgument("eps must be finite and > 0, got ", options.eps);
  }
  if (!(options.weight_decay >= 0.0f) || !std::isfinite(options.weight_decay)) {
    return InvalidArgument("weight_decay must be finite and >= 0, got ",
                           options.weight_decay);
  }
  if (std::isnan(options.max_grad_norm) || options.max_grad_norm == INFINITY) {
    return InvalidArgument(
        "max_grad_norm must be finite (<= 0: no clipping), got ",
        options.max_grad_norm);
  }
  if (!(lr >= 0.0f) || !std::isfinite(lr)) {
    return InvalidArgument("lr must be finite and >= 0, got ", lr);
  }
  if (step < 1) return InvalidArgument("step is 1-based, got ", step);
  return absl::OkStatus();
}

absl::Status CheckState(const Context& context, const AdamWState& state,
                        const Tensor& norm) {
  const Tensor& params = state.params;
  RETURN_IF_ERROR(CheckMasterTensor(context, params, -1, "params"));
  const int64_t n = params.dim(0);
  for (const Named& named : {Named{&state.grads, "grads"}, Named{&state.m, "m"},
                             Named{&state.v, "v"}}) {
    RETURN_IF_ERROR(
        CheckTensor(context, *named.tensor, {n}, {params.dtype}, named.name));
  }
  const Tensor* copy =
      state.compute_copy.has_value() ? &*state.compute_copy : nullptr;
  if (copy != nullptr) {
    if (context.device().is_cpu()) {
      RETURN_IF_ERROR(CheckTensor(context, *copy, {n},
                                  {DType::kF32, DType::kF64}, "compute_copy"));
    } else {
      RETURN_IF_ERROR(CheckTensor(context, *copy, {n},
                                  {DType::kF32, DType::kBF16}, "compute_copy"));
    }
  }
  if (state.decay_count < 0 || state.decay_count > n) {
    return InvalidArgument("decay_count must be in [0, n = ", n, "], got ",
                           state.decay_count);
  }
  RETURN_IF_ERROR(CheckNorm(context, norm, params.dtype));
  return CheckNoOverlaps({{&params, "params"},
                          {&state.grads, "grads"},
                          {&state.m, "m"},
                          {&state.v, "v"},
                          {copy, "compute_copy"},
                          {&norm, "norm"}});
}

// The step's constants, in double; each backend rounds them to its type once.
struct StepConstants {
  double beta1, beta2, one_minus_beta1, one_minus_beta2;
  double step_size;       // lr / (1 - beta1^t)
  double inv_sqrt_bias2;  // 1 / sqrt(1 - beta2^t)
  double eps;
  double decay_factor;  // 1 - lr * weight_decay
  double max_grad_norm;
};

StepConstants MakeConstants(const AdamWOptions& options, float lr,
                            int64_t step) {
  const double beta1 = options.beta1, beta2 = options.beta2;
  const double t = static_cast<double>(step);
  StepConstants k;
  k.beta1 = beta1;
  k.beta2 = beta2;
  k.one_minus_beta1 = 1.0 - beta1;
  k.one_minus_beta2 = 1.0 - beta2;
  k.step_size = static_cast<double>(lr) / (1.0 - std::pow(beta1, t));
  k.inv_sqrt_bias2 = 1.0 / std::sqrt(1.0 - std::pow(beta2, t));
  k.eps = options.eps;
  k.decay_factor =
      1.0 - static_cast<double>(lr) * static_cast<double>(options.weight_decay);
  k.max_grad_norm = options.max_grad_norm;
  return k;
}

// ---- CPU backend ----

// Sum of squares in double, four interleaved accumulators in a fixed order.
template <typename T>
double SumSquaresCpu(const T* grads, int64_t n) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const double g = static_cast<double>(grads[i + k]);
      acc[k] += g * g;
    }
  }
  for (; i < n; ++i) {
    const double g = static_cast<double>(grads[i]);
    acc[0] += g * g;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

void GradientNormCpu(const Tensor& grads, int64_t n, const Tensor& norm) {
  const double sum = grads.dtype == DType::kF64
                         ? SumSquaresCpu(grads.data_as<const double>(), n)
                         : SumSquaresCpu(grads.data_as<const float>(), n);
  const double value = std::sqrt(sum);
  if (norm.dtype == DType::kF64) {
    *norm.data_as<double>() = value;
  } else {
    *norm.data_as<float>() = static_cast<float>(value);
  }
}

// T: the masters' type; C: the compute copy's (ignored when `copy` is null).
// The same float operations, in the same order, as the CUDA kernel.
template <typename T, typename C>
void UpdateCpu(const AdamWState& state, const StepConstants& constants, T scale,
               C* copy) {
  const int64_t n = state.params.dim(0);
  T* params = state.params.data_as<T>();
  const T* grads = state.grads.data_as<const T>();
  T* m = state.m.data_as<T>();
  T* v = state.v.data_as<T>();
  const T beta1 = static_cast<T>(constants.beta1);
  const T beta2 = static_cast<T>(constants.beta2);
  const T one_minus_beta1 = static_cast<T>(constants.one_minus_beta1);
  const T one_minus_beta2 = static_cast<T>(constants.one_minus_beta2);
  const T step_size = static_cast<T>(constants.step_size);
  const T inv_sqrt_bias2 = static_cast<T>(constants.inv_sqrt_bias2);
  const T eps = static_cast<T>(constants.eps);
  const T decay_factor = static_cast<T>(constants.decay_factor);
  for (int64_t i = 0; i < n; ++i) {
    const T g = grads[i] * scale;
    const T m_new = beta1 * m[i] + one_minus_beta1 * g;
    const T v_new = beta2 * v[i] + one_minus_beta2 * (g * g);
    T p = params[i];
    if (i < state.decay_count) p = p * decay_factor;
    const T denom = std::sqrt(v_new) * inv_sqrt_bias2 + eps;
    p = p - step_size * (m_new / denom);
    m[i] = m_new;
    v[i] = v_new;
    params[i] = p;
    if (copy != nullptr) copy[i] = static_cast<C>(p);
  }
}

// min(1, max_norm / (norm + 1e-6)) in T (std::fmin, like the GPU's fminf,
// gives 1 for a NaN norm), or 1 without clipping.
template <typename T>
T ClipScaleCpu(const Tensor& norm, double max_grad_norm) {
  if (!(max_grad_norm > 0.0)) return T(1);
  const T value = norm.dtype == DType::kF64
                      ? static_cast<T>(*norm.data_as<const double>())
                      : static_cast<T>(*norm.data_as<const float>());
  const T max_norm = static_cast<T>(max_grad_norm);
  return std::fmin(T(1), max_norm / (value + static_cast<T>(1e-6)));
}

template <typename T>
void StepCpu(const AdamWState& state, const StepConstants& constants,
             const Tensor& norm) {
  const T scale = ClipScaleCpu<T>(norm, constants.max_grad_norm);
  if (!state.compute_copy.has_value()) {
    UpdateCpu<T, T>(state, constants, scale, nullptr);
  } else if (state.compute_copy->dtype == DType::kF64) {
    UpdateCpu<T, double>(state, constants, scale,
                         state.compute_copy->data_as<double>());
  } else {
    UpdateCpu<T, float>(state, constants, scale,
                        state.compute_copy->data_as<float>());
  }
}

#ifdef LOSSRT_WITH_CUDA
// The fused update kernel of AdamWStep, reading the clip scale's norm from
// device memory.
absl::Status LaunchUpdate(const AdamWState& state,
                          const StepConstants& constants, const Tensor& norm,
                          cudaStream_t stream) {
  const int64_t n = state.params.dim(0);
  AdamWKernelArgs args;
  args.params = state.params.data_as<float>();
  args.grads = state.grads.data_as<const float>();
  args.m = state.m.data_as<float>();
  args.v = state.v.data_as<float>();
  if (state.compute_copy.has_value()) {
    args.compute_copy = state.compute_copy->data;
    args.copy_dtype = state.compute_copy->dtype;
  }
  args.norm = norm.data_as<const float>();
  args.n = n;
  args.decay_count = state.decay_count;
  args.max_grad_norm = static_cast<float>(constants.max_grad_norm);
  args.beta1 = static_cast<float>(constants.beta1);
  args.beta2 = static_cast<float>(constants.beta2);
  args.one_minus_beta1 = static_cast<float>(constants.one_minus_beta1);
  args.one_minus_beta2 = static_cast<float>(constants.one_minus_beta2);
  args.step_size = static_cast<float>(constants.step_size);
  args.inv_sqrt_bias2 = static_cast<float>(constants.inv_sqrt_bias2);
  args.eps = static_cast<float>(constants.eps);
  args.decay_factor = static_cast<float>(constants.decay_factor);
  CUDA_RETURN_IF_ERROR(LaunchAdamW(args, stream));
  return absl::OkStatus();
}
#endif

// sum_squares: [] or [1] f64 on the context's device.
absl::Status CheckSumOfSquares(const Context& context,
                               const Tensor& sum_squares) {
  if (sum_squares.rank() > 1 || sum_squares.numel() != 1) {
    return InvalidArgument("sum_squares: expected a scalar ([] or [1]), got ",
                           sum_squares.ShapeString());
  }
  RETURN_IF_ERROR(CheckDType(sum_squares, {DType::kF64}, "sum_squares"));
  if (sum_squares.device != context.device()) {
    return InvalidArgument("sum_squares is on ", sum_squares.device.ToString(),
                           ", the context on ", context.device().ToString());
  }
  if (sum_squares.data == nullptr) {
    return InvalidArgument("sum_squares has no data");
  }
  return absl::OkStatus();
}

}  // namespace

int64_t AdamWWorkspaceBytes(const Device& device, int64_t n) {
  if (device.is_cpu()) return 0;
  const int64_t bytes = NormPartials(n) * static_cast<int64_t>(sizeof(double));
  return RoundUp(bytes, kAlign);
}

absl::Status GradientNorm(Context& context, const Tensor& grads,
                          const Tensor& norm) {
  ASSIGN_OR_RETURN(const int64_t n, CheckGrads(context, grads));
  RETURN_IF_ERROR(CheckNorm(context, norm, grads.dtype));
  RETURN_IF_ERROR(CheckNoOverlaps({{&grads, "grads"}, {&norm, "norm"}}));
  if (context.device().is_cpu()) {
    GradientNormCpu(grads, n, norm);
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(void* workspace,
                   context.Workspace(AdamWWorkspaceBytes(context.device(), n)));
  CUDA_RETURN_IF_ERROR(LaunchGradNorm(
      grads.data_as<const float>(), n, static_cast<double*>(workspace),
      static_cast<int>(NormPartials(n)), norm.data_as<float>(), stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError(
      "GradientNorm on a CUDA device: built without CUDA");
#endif
}

absl::Status AdamWStep(Context& context, const AdamWState& state,
                       const AdamWOptions& options, float lr, int64_t step,
                       const Tensor& norm) {
  RETURN_IF_ERROR(CheckOptions(options, lr, step));
  RETURN_IF_ERROR(CheckState(context, state, norm));
  const int64_t n = state.params.dim(0);
  const StepConstants constants = MakeConstants(options, lr, step);
  if (context.device().is_cpu()) {
    GradientNormCpu(state.grads, n, norm);
    if (state.params.dtype == DType::kF64) {
      StepCpu<double>(state, constants, norm);
    } else {
      StepCpu<float>(state, constants, norm);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(void* workspace,
                   context.Workspace(AdamWWorkspaceBytes(context.device(), n)));
  CUDA_RETURN_IF_ERROR(LaunchGradNorm(
      state.grads.data_as<const float>(), n, static_cast<double*>(workspace),
      static_cast<int>(NormPartials(n)), norm.data_as<float>(), stream));
  return LaunchUpdate(state, constants, norm, stream);
#else
  return absl::UnavailableError(
      "AdamWStep on a CUDA device: built without CUDA");
#endif
}

absl::Status GradientSumOfSquares(Context& context, const Tensor& grads,
                                  const Tensor& sum_squares) {
  ASSIGN_OR_RETURN(const int64_t n, CheckGrads(context, grads));
  RETURN_IF_ERROR(CheckSumOfSquares(context, sum_squares));
  RETURN_IF_ERROR(
      CheckNoOverlaps({{&grads, "grads"}, {&sum_squares, "sum_squares"}}));
  if (context.device().is_cpu()) {
    *sum_squares.data_as<double>() =
        grads.dtype == DType::kF64
            ? SumSquaresCpu(grads.data_as<const double>(), n)
            : SumSquaresCpu(grads.data_as<const float>(), n);
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(void* workspace,
                   context.Workspace(AdamWWorkspaceBytes(context.device(), n)));
  CUDA_RETURN_IF_ERROR(LaunchGradSumOfSquares(
      grads.data_as<const float>(), n, static_cast<double*>(workspace),
      static_cast<int>(NormPartials(n)), sum_squares.data_as<double>(),
      stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError(
      "GradientSumOfSquares on a CUDA device: built without CUDA");
#endif
}

absl::Status AdamWStepWithSumOfSquares(Context& context,
                                       const AdamWState& state,
                                       const AdamWOptions& options, float lr,
                                       int64_t step, const Tensor& sum_squares,
                                       const Tensor& norm) {
  RETURN_IF_ERROR(CheckOptions(options, lr, step));
  RETURN_IF_ERROR(CheckState(context, state, norm));
  RETURN_IF_ERROR(CheckSumOfSquares(context, sum_squares));
  const Tensor* copy =
      state.compute_copy.has_value() ? &*state.compute_copy : nullptr;
  RETURN_IF_ERROR(CheckNoOverlaps({{&state.params, "params"},
                                   {&state.grads, "grads"},
                                   {&state.m, "m"},
                                   {&state.v, "v"},
                                   {copy, "compute_copy"},
                                   {&norm, "norm"},
                                   {&sum_squares, "sum_squares"}}));
  const StepConstants constants = MakeConstants(options, lr, step);
  if (context.device().is_cpu()) {
    const double value = std::sqrt(*sum_squares.data_as<const double>());
    if (norm.dtype == DType::kF64) {
      *norm.data_as<double>() = value;
    } else {
      *norm.data_as<float>() = static_cast<float>(value);
    }
    if (state.params.dtype == DType::kF64) {
      StepCpu<double>(state, constants, norm);
    } else {
      StepCpu<float>(state, constants, norm);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(LaunchNormFromSumOfSquares(
      sum_squares.data_as<const double>(), norm.data_as<float>(), stream));
  return LaunchUpdate(state, constants, norm, stream);
#else
  return absl::UnavailableError(
      "AdamWStepWithSumOfSquares on a CUDA device: built without CUDA");
#endif
}

}  // namespace optim
}  // namespace lossrt
