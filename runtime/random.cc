// Random fills on the CPU (a loop over RandomValue) or the GPU (LaunchFillRandom).
#include "runtime/random.h"

#include "runtime/dtype.h"
#include "runtime/random_kernels.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/random_cuda.h"
#endif

namespace lossrt {
namespace {

void FillHost(const Tensor& tensor, const RandomParams& params) {
  const int64_t n = tensor.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double value = RandomValue(params, static_cast<uint64_t>(i));
    switch (tensor.dtype) {
      case DType::kF32:
        tensor.data_as<float>()[i] = static_cast<float>(value);
        break;
      case DType::kF64:
        tensor.data_as<double>()[i] = value;
        break;
      case DType::kBF16:
        tensor.data_as<uint16_t>()[i] = FloatToBf16Bits(static_cast<float>(value));
        break;
      case DType::kF16:
        tensor.data_as<uint16_t>()[i] = FloatToF16Bits(static_cast<float>(value));
        break;
      case DType::kI32:
        tensor.data_as<int32_t>()[i] = static_cast<int32_t>(value);
        break;
      case DType::kI64:
        tensor.data_as<int64_t>()[i] = static_cast<int64_t>(value);
        break;
    }
  }
}

absl::Status Fill(const Tensor& tensor, const RandomParams& params, Context& context) {
  if (tensor.numel() == 0) return absl::OkStatus();
  if (tensor.data == nullptr) return InvalidArgument("random fill: null data");
  if (!tensor.is_contiguous()) return InvalidArgument("random fill: tensor must be contiguous");
  if (tensor.device != context.device()) {
    return InvalidArgument("random fill: tensor on ", tensor.device.ToString(), ", context on ",
                           context.device().ToString());
  }
  if (tensor.device.is_cpu()) {
    FillHost(tensor, params);
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(
      LaunchFillRandom(tensor.data, static_cast<int>(tensor.dtype), tensor.numel(), params, stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError("random fill on a device: built without CUDA");
#endif
}

}  // namespace

absl::Status FillUniform(const Tensor& tensor, uint64_t seed, float low, float high, Context& context) {
  if (!IsFloating(tensor.dtype)) return InvalidArgument("FillUniform: needs a floating dtype, got ", DTypeName(tensor.dtype));
  if (!(low < high)) return InvalidArgument("FillUniform: low (", low, ") must be below high (", high, ")");
  return Fill(tensor, RandomParams{RandomKind::kUniform, seed, low, high}, context);
}

absl::Status FillNormal(const Tensor& tensor, uint64_t seed, float mean, float stddev, Context& context) {
  if (!IsFloating(tensor.dtype)) return InvalidArgument("FillNormal: needs a floating dtype, got ", DTypeName(tensor.dtype));
  if (!(stddev >= 0)) return InvalidArgument("FillNormal: stddev must be >= 0, got ", stddev);
  return Fill(tensor, RandomParams{RandomKind::kNormal, seed, mean, stddev}, context);
}

absl::Status FillRandomInt(const Tensor& tensor, uint64_t seed, int64_t low, int64_t high, Context& context) {
  if (tensor.dtype != DType::kI32 && tensor.dtype != DType::kI64) {
    return InvalidArgument("FillRandomInt: needs i32 or i64, got ", DTypeName(tensor.dtype));
  }
  if (!(low < high)) return InvalidArgument("FillRandomInt: low (", low, ") must be below high (", high, ")");
  return Fill(tensor, RandomParams{RandomKind::kInt, seed, static_cast<double>(low), static_cast<double>(high)},
              context);
}

}  // namespace lossrt
