// The linear layer: argument checks, the Eigen CPU path and the cuBLASLt GPU
// path.
#include "graph/ops/linear.h"

#include <Eigen/Core>

#include "graph/ops/activation.h"
#include "graph/ops/linear_cudnn.h"
#include "graph/ops/op_checks.h"
#include "runtime/status.h"
#include "runtime/tensor_checks.h"

#ifdef LOSSRT_WITH_CUDA
#include "graph/ops/linear_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace ops {
namespace {

template <typename T>
using Matrix =
    Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Vector = Eigen::Matrix<T, 1, Eigen::Dynamic>;

struct Sizes {
  int64_t rows, in, out;
};

absl::StatusOr<Sizes> CheckOperands(const Context& context, const Tensor& x,
                                    const Tensor& weight, const Tensor* bias) {
  RETURN_IF_ERROR(CheckActivationDType(context, x.dtype, "linear x"));
  if (x.rank() != 2 || weight.rank() != 2) {
    return InvalidArgument("linear: x and weight must be 2-D, got ",
                           x.ShapeString(), " and ", weight.ShapeString());
  }
  const Sizes sizes{x.dim(0), x.dim(1), weight.dim(0)};
  if (sizes.in == 0) return InvalidArgument("linear: zero input features");
  RETURN_IF_ERROR(CheckTensor(context, x, {-1, -1}, {x.dtype}, "linear x"));
  RETURN_IF_ERROR(CheckTensor(context, weight, {sizes.out, sizes.in}, {x.dtype},
                              "linear weight"));
  if (bias != nullptr) {
    RETURN_IF_ERROR(
        CheckTensor(context, *bias, {sizes.out}, {x.dtype}, "linear bias"));
  }
  return sizes;
}

template <typename T>
void ForwardCpu(const Sizes& s, const Tensor& x, const Tensor& weight,
                const Tensor* bias, const Tensor* residual, const Tensor& y) {
  Eigen::Map<const Matrix<T>> x_m(x.data_as<T>(), s.rows, s.in);
  Eigen::Map<const Matrix<T>> w_m(weight.data_as<T>(), s.out, s.in);
  Eigen::Map<Matrix<T>> y_m(y.data_as<T>(), s.rows, s.out);
  if (residual != nullptr) {
    // The product goes to a temporary first: y may be the residual.
    Eigen::Map<const Matrix<T>> r_m(residual->data_as<T>(), s.rows, s.out);
    y_m = r_m + x_m * w_m.transpose();
  } else {
    y_m.noalias() = x_m * w_m.transpose();
  }
  if (bias != nullptr) {
    Eigen::Map<const Vector<T>> b_v(bias->data_as<T>(), s.out);
    y_m.rowwise() += b_v;
  }
}

// T: activations; A: accumulator (the gradients of the parameters).
template <typename T, typename A>
void BackwardCpu(const Sizes& s, const Tensor& x, const Tensor& weight,
                 const Tensor& dy, const Tensor* dx, bool accumulate_dx,
                 const Tensor& d_weight, const Tensor* d_bias) {
  Eigen::Map<const Matrix<T>> x_m(x.data_as<T>(), s.rows, s.in);
  Eigen::Map<const Matrix<T>> w_m(weight.data_as<T>(), s.out, s.in);
  Eigen::Map<const Matrix<T>> dy_m(dy.data_as<T>(), s.rows, s.out);
  if (dx != nullptr) {
    Eigen::Map<Matrix<T>> dx_m(dx->data_as<T>(), s.rows, s.in);
    if (accumulate_dx) {
      dx_m.noalias() += dy_m * w_m;
    } else {
      dx_m.noalias() = dy_m * w_m;
    }
  }
  Eigen::Map<Matrix<A>> dw_m(d_weight.data_as<A>(), s.out, s.in);
  dw_m.noalias() += (dy_m.transpose() * x_m).template cast<A>();
  if (d_bias != nullptr) {
    Eigen::Map<Vector<A>> db_v(d_bias->data_as<A>(), s.out);
    db_v += dy_m.colwise().sum().template cast<A>();
  }
}

#ifdef LOSSRT_WITH_CUDA
// Row-major [rows, cols] seen by cuBLASLt (column-major) as [cols, rows].
GemmOperand RowMajor(const Tensor& t, cublasOperation_t op) {
  GemmOperand operand;
  operand.data = t.data;
  operand.type = CudaType(t.dtype);
  operand.rows = t.dim(1);
  operand.cols = t.dim(0);
  operand.ld = t.dim(1);
  operand.op = op;
  return operand;
}

// The forward GEMM: column-major y^T [out, rows] = op(w^T [in, out]) = w
// [out, in] times x^T [in, rows] (+ bias).
GemmCall ForwardCall(const Sizes& s, const Tensor& x, const Tensor& weight,
                     const Tensor* bias, const Tensor& y) {
  GemmCall call;
  call.a = RowMajor(weight, CUBLAS_OP_T);
  call.b = RowMajor(x, CUBLAS_OP_N);
  call.d = y.data;
  call.d_type = CudaType(y.dtype);
  call.m = s.out;
  call.n = s.rows;
  call.ld_d = s.out;
  call.bias = bias != nullptr ? bias->data : nullptr;
  return call;
}

// The input-gradient GEMM: dx^T [in, rows] = (or +=) w^T [in, out] (w read as
// stored) times dy^T.
GemmCall InputGradientCall(const Sizes& s, const Tensor& weight,
                           const Tensor& dy, const Tensor& dx,
                           bool accumulate) {
  GemmCall call;
  call.a = RowMajor(weight, CUBLAS_OP_N);
  call.b = RowMajor(dy, CUBLAS_OP_N);
  call.d = dx.data;
  call.d_type = CudaType(dx.dtype);
  call.m = s.in;
  call.n = s.rows;
  call.ld_d = s.in;
  call.beta = accumulate ? 1.0f : 0.0f;
  return call;
}
#endif

// dx [rows, in] = (or +=) dy [rows, out] @ weight [out, in]: the input's
// gradient alone (operands already checked).
absl::Status InputGradient(Context& context, const Sizes& s,
                           const Tensor& weight, const Tensor& dy,
                           const Tensor& dx, bool accumulate) {
  if (context.device().is_cpu()) {
    auto run = [&](auto zero) {
      using T = decltype(zero);
      Eigen::Map<const Matrix<T>> w_m(weight.data_as<T>(), s.out, s.in);
      Eigen::Map<const Matrix<T>> dy_m(dy.data_as<T>(), s.rows, s.out);
      Eigen::Map<Matrix<T>> dx_m(dx.data_as<T>(), s.rows, s.in);
      if (accumulate) {
        dx_m.noalias() += dy_m * w_m;
      } else {
        dx_m.noalias() = dy_m * w_m;
      }
    };
    if (dx.dtype == DType::kF64) {
      run(0.0);
    } else {
      run(0.0f);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  if (s.rows == 0) return absl::OkStatus();
  if (s.out == 0) {
    if (!accumulate) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
          dx.data, 0, dx.numel() * DTypeSize(dx.dtype), stream));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(GemmRunner * gemm, ContextGemmRunner(context));
  return gemm->Run(InputGradientCall(s, weight, dy, dx, accumulate), stream);
#else
  return absl::UnavailableError("linear on a CUDA device: built without CUDA");
#endif
}

// y = x weight^T (+ bias) (+ residual), the residual in the GEMM's epilogue
// on a GPU.
absl::Status Forward(Context& context, const Tensor& x, const Tensor& weight,
                     const Tensor* bias, const Tensor* residual,
                     const Tensor& y) {
  ASSIGN_OR_RETURN(const Sizes s, CheckOperands(context, x, weight, bias));
  RETURN_IF_ERROR(
      CheckTensor(context, y, {s.rows, s.out}, {x.dtype}, "linear y"));
  if (residual != nullptr) {
    RETURN_IF_ERROR(CheckTensor(context, *residual, {s.rows, s.out}, {x.dtype},
                                "linear residual"));
    RETURN_IF_ERROR(CheckDisjoint(
        {&y, "linear y"}, {{&x, "x"}, {&weight, "weight"}, {bias, "bias"}}));
    if (y.data != residual->data) {
      RETURN_IF_ERROR(
          CheckDisjoint({&y, "linear y"}, {{residual, "residual"}}));
    }
  }
  if (s.rows == 0 || s.out == 0) return absl::OkStatus();
  if (context.device().is_cpu()) {
    if (x.dtype == DType::kF64) {
      ForwardCpu<double>(s, x, weight, bias, residual, y);
    } else {
      ForwardCpu<float>(s, x, weight, bias, residual, y);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(GemmRunner * gemm, ContextGemmRunner(context));
  GemmCall call = ForwardCall(s, x, weight, bias, y);
  if (residual != nullptr) {
    call.c = residual->data;  // D = W x^T (+ bias) + 1 * residual
    call.beta = 1.0f;
  }
  return gemm->Run(call, stream);
#else
  return absl::UnavailableError("linear on a CUDA device: built without CUDA");
#endif
}

}  // namespace

int64_t LinearBackwardWorkspaceBytes(const Device& device, int64_t rows,
                                     int64_t out_features) {
#ifdef LOSSRT_WITH_CUDA
  if (device.is_cuda()) {
    // The bias gradient's partial column sums.
    return ColumnSumChunks(rows) * out_features * int64_t{sizeof(float)};
  }
#endif
  return 0;
}

absl::Status LinearForward(Context& context, const Tensor& x,
                           const Tensor& weight, const Tensor* bias,
                           const Tensor& y) {
  return Forward(context, x, weight, bias, nullptr, y);
}

absl::Status LinearResidualForward(Context& context, const Tensor& x,
                                   const Tensor& weight, const Tensor* bias,
                                   const Tensor& residual, const Tensor& y) {
  return Forward(context, x, weight, bias, &residual, y);
}

absl::Status LinearBackward(Context& context, const Tensor& x,
                            const Tensor& weight, const Tensor& dy,
                            const Tensor* dx, bool accumulate_dx,
                            const Tensor& d_weight, const Tensor* d_bias) {
  ASSIGN_OR_RETURN(const Sizes s, CheckOperands(context, x, weight, nullptr));
  const DType acc = AccumulatorDType(x.dtype);
  RETURN_IF_ERROR(
      CheckTensor(context, dy, {s.rows, s.out}, {x.dtype}, "linear dy"));
  if (dx != nullptr) {
    RETURN_IF_ERROR(
        CheckTensor(context, *dx, {s.rows, s.in}, {x.dtype}, "linear dx"));
  }
  RETURN_IF_ERROR(
      CheckTensor(context, d_weight, {s.out, s.in}, {acc}, "linear d_weight"));
  if (d_bias != nullptr) {
    RETURN_IF_ERROR(
        CheckTensor(context, *d_bias, {s.out}, {acc}, "linear d_bias"));
  }
  if (context.device().is_cpu()) {
    if (x.dtype == DType::kF64) {
      BackwardCpu<double, double>(s, x, weight, dy, dx, accumulate_dx, d_weight,
                                  d_bias);
    } else {
      BackwardCpu<float, float>(s, x, weight, dy, dx, accumulate_dx, d_weight,
                                d_bias);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(GemmRunner * gemm, ContextGemmRunner(context));
  if (dx != nullptr)
    RETURN_IF_ERROR(InputGradient(context, s, weight, dy, *dx, accumulate_dx));
  if (s.rows == 0 || s.out == 0) return absl::OkStatus();
  // d_weight^T [in, out] += x^T [in, rows] times dy [rows, out] (fp32 out).
  GemmCall call;
  call.a = RowMajor(x, CUBLAS_OP_N);
  call.b = RowMajor(dy, CUBLAS_OP_T);
  call.d = d_weight.data;
  call.d_type = CUDA_R_32F;
  call.m = s.in;
  call.n = s.out;
  call.ld_d = s.in;
  call.beta = 1.0f;
  RETURN_IF_ERROR(gemm->Run(call, stream));
  if (d_bias != nullptr) {
    // d_bias += the column sums of dy, by our kernel rather than cuBLASLt's
    // BGRADB epilogue: on the H200 that epilogue ran as a reduction kernel of
    // its own after the GEMM, below the copy rate (bench/RESULTS.md, What was
    // tried and dropped).
    ASSIGN_OR_RETURN(void* scratch,
                     context.Workspace(LinearBackwardWorkspaceBytes(
                         context.device(), s.rows, s.out)));
    CUDA_RETURN_IF_ERROR(LaunchAddColumnSums(
        dy.data, dy.dtype == DType::kBF16, s.rows, s.out,
        static_cast<float*>(scratch), d_bias->data_as<float>(), stream));
  }
  return absl::OkStatus();
#else
  return absl::UnavailableError("linear on a CUDA device: built without CUDA");
#endif
}

absl::Status GeluGemmEngineBuilt(GeluGemmEngine engine) {
  return engine == GeluGemmEngine::kCudnn ? linear_cudnn::CheckBuiltWithCudnn()
                                          : absl::OkStatus();
}

absl::Status LinearGeluForward(Context& context, const Tensor& x,
                               const Tensor& weight, const Tensor* bias,
                               const Tensor& a, const Tensor& h,
                               GeluGemmEngine engine) {
  ASSIGN_OR_RETURN(const Sizes s, CheckOperands(context, x, weight, bias));
  RETURN_IF_ERROR(
      CheckTensor(context, a, {s.rows, s.out}, {x.dtype}, "linear-gelu a"));
  RETURN_IF_ERROR(
      CheckTensor(context, h, {s.rows, s.out}, {x.dtype}, "linear-gelu h"));
  RETURN_IF_ERROR(CheckDisjoint(
      {&a, "linear-gelu a"},
      {{&x, "x"}, {&weight, "weight"}, {bias, "bias"}, {&h, "h"}}));
  RETURN_IF_ERROR(CheckDisjoint(
      {&h, "linear-gelu h"}, {{&x, "x"}, {&weight, "weight"}, {bias, "bias"}}));
  const bool cuda = context.device().is_cuda();
  if (cuda && engine == GeluGemmEngine::kCudnn) {
    RETURN_IF_ERROR(linear_cudnn::CheckBuiltWithCudnn());
    if (x.dtype != DType::kBF16) {
      return absl::UnimplementedError(
          "linear-gelu: the cuDNN engine takes bf16 only");
    }
  }
  if (s.rows == 0 || s.out == 0) return absl::OkStatus();
#ifdef LOSSRT_WITH_CUDA
  if (cuda && engine != GeluGemmEngine::kCublasLt && x.dtype == DType::kBF16 &&
      linear_cudnn::CheckBuiltWithCudnn().ok()) {
    ASSIGN_OR_RETURN(ScopedDevice scoped,
                     ScopedDevice::Enter(context.device().ordinal));
    const linear_cudnn::GeluForwardShape shape{s.rows, s.in, s.out,
                                               bias != nullptr};
    const absl::Status fused = linear_cudnn::GeluForward(
        context, shape, x.data, weight.data,
        bias != nullptr ? bias->data : nullptr, a.data, h.data);
    // kAuto falls back where cuDNN has no plan for the shape.
    if (engine == GeluGemmEngine::kCudnn || !absl::IsUnimplemented(fused)) {
      return fused;
    }
  }
  if (cuda && s.out % 8 == 0) {
    ASSIGN_OR_RETURN(ScopedDevice scoped,
                     ScopedDevice::Enter(context.device().ordinal));
    ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
    ASSIGN_OR_RETURN(GemmRunner * gemm, ContextGemmRunner(context));
    // LinearForward's GEMM, with the GELU and its saved input in the
    // epilogue.
    GemmCall call = ForwardCall(s, x, weight, bias, a);
    call.epilogue = GemmEpilogue::kGeluAux;
    call.aux = h.data;
    call.ld_aux = s.out;
    const absl::Status fused = gemm->Run(call, stream);
    if (!absl::IsUnimplemented(fused)) return fused;
  }
#endif
  // The two ops: h, then a from it.
  RETURN_IF_ERROR(LinearForward(context, x, weight, bias, h));
  return GeluForward(context, h, a);
}

absl::Status LinearGeluBackwardInput(Context& context, const Tensor& weight,
                                     const Tensor& dy, const Tensor& h,
                                     const Tensor& d_h) {
  ASSIGN_OR_RETURN(const Sizes s, CheckOperands(context, h, weight, nullptr));
  RETURN_IF_ERROR(
      CheckTensor(context, dy, {s.rows, s.out}, {h.dtype}, "linear-gelu dy"));
  RETURN_IF_ERROR(
      CheckTensor(context, d_h, {s.rows, s.in}, {h.dtype}, "linear-gelu d_h"));
  RETURN_IF_ERROR(CheckDisjoint({&d_h, "linear-gelu d_h"},
                                {{&weight, "weight"}, {&dy, "dy"}, {&h, "h"}}));
  if (s.rows == 0) return absl::OkStatus();
#ifdef LOSSRT_WITH_CUDA
  if (context.device().is_cuda() && s.in % 8 == 0 && s.out > 0) {
    ASSIGN_OR_RETURN(ScopedDevice scoped,
                     ScopedDevice::Enter(context.device().ordinal));
    ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
    ASSIGN_OR_RETURN(GemmRunner * gemm, ContextGemmRunner(context));
    // LinearBackward's dx GEMM, with gelu'(h) applied in its epilogue.
    GemmCall call = InputGradientCall(s, weight, dy, d_h, /*accumulate=*/false);
    call.epilogue = GemmEpilogue::kDGelu;
    call.aux = h.data;
    call.ld_aux = s.in;
    const absl::Status fused = gemm->Run(call, stream);
    if (!absl::IsUnimplemented(fused)) return fused;
  }
#endif
  // The two ops: dy @ weight into d_h, then the GELU's backward in place.
  RETURN_IF_ERROR(InputGradient(context, s, weight, dy, d_h,
                                /*accumulate=*/false));
  return GeluBackward(context, h, d_h, d_h, /*accumulate=*/false);
}

}  // namespace ops
}  // namespace lossrt
