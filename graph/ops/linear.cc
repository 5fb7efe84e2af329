// The linear layer: argument checks, the Eigen CPU path and the cuBLASLt GPU
// path.
#include "graph/ops/linear.h"

#include <Eigen/Core>

#include "graph/ops/op_checks.h"
#include "runtime/status.h"

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
                const Tensor* bias, const Tensor& y) {
  Eigen::Map<const Matrix<T>> x_m(x.data_as<T>(), s.rows, s.in);
  Eigen::Map<const Matrix<T>> w_m(weight.data_as<T>(), s.out, s.in);
  Eigen::Map<Matrix<T>> y_m(y.data_as<T>(), s.rows, s.out);
  y_m.noalias() = x_m * w_m.transpose();
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
#endif

}  // namespace

int64_t LinearBackwardWorkspaceBytes(const Device& device, int64_t rows,
                                     int64_t out_features) {
#ifdef LOSSRT_WITH_CUDA
  if (device.is_cuda()) {
    // The epilogue's bias gradient [out], then the fallback's partial sums.
    return (1 + ColumnSumChunks(rows)) * out_features * int64_t{sizeof(float)};
  }
#endif
  return 0;
}

absl::Status LinearForward(Context& context, const Tensor& x,
                           const Tensor& weight, const Tensor* bias,
                           const Tensor& y) {
  ASSIGN_OR_RETURN(const Sizes s, CheckOperands(context, x, weight, bias));
  RETURN_IF_ERROR(
      CheckTensor(context, y, {s.rows, s.out}, {x.dtype}, "linear y"));
  if (s.rows == 0 || s.out == 0) return absl::OkStatus();
  if (context.device().is_cpu()) {
    if (x.dtype == DType::kF64) {
      ForwardCpu<double>(s, x, weight, bias, y);
    } else {
      ForwardCpu<float>(s, x, weight, bias, y);
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(GemmRunner * gemm, ContextGemmRunner(context));
  // Column-major: y^T [out, rows] = op(w^T [in, out]) = w [out, in] times
  // x^T [in, rows].
  GemmCall call;
  call.a = RowMajor(weight, CUBLAS_OP_T);
  call.b = RowMajor(x, CUBLAS_OP_N);
  call.d = y.data;
  call.d_type = CudaType(y.dtype);
  call.m = s.out;
  call.n = s.rows;
  call.ld_d = s.out;
  call.bias = bias != nullptr ? bias->data : nullptr;
  return gemm->Run(call, stream);
#else
  return absl::UnavailableError("linear on a CUDA device: built without CUDA");
#endif
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
  if (dx != nullptr && s.rows > 0) {
    if (s.out == 0) {
      if (!accumulate_dx) {
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
            dx->data, 0, dx->numel() * DTypeSize(dx->dtype), stream));
      }
    } else {
      // dx^T [in, rows] = w^T [in, out] (w read as stored) times dy^T.
      GemmCall call;
      call.a = RowMajor(weight, CUBLAS_OP_N);
      call.b = RowMajor(dy, CUBLAS_OP_N);
      call.d = dx->data;
      call.d_type = CudaType(dx->dtype);
      call.m = s.in;
      call.n = s.rows;
      call.ld_d = s.in;
      call.beta = accumulate_dx ? 1.0f : 0.0f;
      RETURN_IF_ERROR(gemm->Run(call, stream));
    }
  }
  if (s.rows == 0 || s.out == 0) return absl::OkStatus();
  float* bias_gradient = nullptr;  // [out] f32
  float* partial_sums = nullptr;   // [ColumnSumChunks(rows), out] f32
  if (d_bias != nullptr) {
    ASSIGN_OR_RETURN(void* scratch,
                     context.Workspace(LinearBackwardWorkspaceBytes(
                         context.device(), s.rows, s.out)));
    bias_gradient = static_cast<float*>(scratch);
    partial_sums = bias_gradient + s.out;
  }
  // d_weight^T [in, out] += x^T [in, rows] times dy [rows, out] (fp32 out);
  // with a bias, the epilogue also sums dy over the rows (BGRADB), so dy is
  // read once for both gradients.
  GemmCall call;
  call.a = RowMajor(x, CUBLAS_OP_N);
  call.b = RowMajor(dy, CUBLAS_OP_T);
  call.d = d_weight.data;
  call.d_type = CUDA_R_32F;
  call.m = s.in;
  call.n = s.out;
  call.ld_d = s.in;
  call.beta = 1.0f;
  call.bias_gradient = bias_gradient;
  absl::Status fused = gemm->Run(call, stream);
  if (absl::IsUnimplemented(fused) && bias_gradient != nullptr) {
    // No epilogue algorithm for these operands: the plain GEMM, then the
    // column sums by a kernel.
    call.bias_gradient = nullptr;
    RETURN_IF_ERROR(gemm->Run(call, stream));
    CUDA_RETURN_IF_ERROR(LaunchAddColumnSums(dy.data, dy.dtype == DType::kBF16,
                                             s.rows, s.out, partial_sums,
                                             d_bias->data_as<float>(), stream));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(fused);
  if (d_bias != nullptr) {
    // d_bias += the epilogue's sums (a one-row column sum).
    CUDA_RETURN_IF_ERROR(LaunchAddColumnSums(bias_gradient, /*bf16=*/false, 1,
                                             s.out, partial_sums,
                                             d_bias->data_as<float>(), stream));
  }
  return absl::OkStatus();
#else
  return absl::UnavailableError("linear on a CUDA device: built without CUDA");
#endif
}

}  // namespace ops
}  // namespace lossrt
