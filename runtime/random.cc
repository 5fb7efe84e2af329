// Random fills on the CPU (a loop over RandomValue) or the GPU
// (LaunchFillRandom).
#include "runtime/random.h"

#include <cmath>
#include <cstdint>
#include <limits>

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

// The 16-bit pattern next below `bits` (bf16 and f16 alike: sign and
// magnitude).
uint16_t NextBelow16(uint16_t bits) {
  if ((bits & 0x7fffu) == 0)
    return 0x8001u;  // below +-0: the smallest negative subnormal
  return (bits & 0x8000u) ? bits + 1 : bits - 1;
}

// The largest value of `dtype` below `high` (see RandomParams::below_b).
double LargestBelow(DType dtype, float high) {
  switch (dtype) {
    case DType::kF64:
      return std::nextafter(static_cast<double>(high),
                            -std::numeric_limits<double>::infinity());
    case DType::kBF16: {
      uint16_t bits = FloatToBf16Bits(high);
      if (Bf16BitsToFloat(bits) >= high) bits = NextBelow16(bits);
      return Bf16BitsToFloat(bits);
    }
    case DType::kF16: {
      uint16_t bits = FloatToF16Bits(high);
      if (F16BitsToFloat(bits) >= high) bits = NextBelow16(bits);
      return F16BitsToFloat(bits);
    }
    default:
      return std::nextafter(high, -std::numeric_limits<float>::infinity());
  }
}

void FillHost(const Tensor& tensor, const RandomParams& params) {
  const int64_t n = tensor.numel();
  const bool uniform = params.kind == RandomKind::kUniform;
  for (int64_t i = 0; i < n; ++i) {
    const double value = RandomValue(params, static_cast<uint64_t>(i));
    switch (tensor.dtype) {
      case DType::kF32: {
        float rounded = static_cast<float>(value);
        if (uniform && rounded >= params.b)
          rounded = static_cast<float>(params.below_b);
        tensor.data_as<float>()[i] = rounded;
        break;
      }
      case DType::kF64:
        tensor.data_as<double>()[i] =
            uniform && value >= params.b ? params.below_b : value;
        break;
      case DType::kBF16: {
        uint16_t bits = FloatToBf16Bits(static_cast<float>(value));
        if (uniform && Bf16BitsToFloat(bits) >= params.b) {
          bits = FloatToBf16Bits(static_cast<float>(params.below_b));
        }
        tensor.data_as<uint16_t>()[i] = bits;
        break;
      }
      case DType::kF16: {
        uint16_t bits = FloatToF16Bits(static_cast<float>(value));
        if (uniform && F16BitsToFloat(bits) >= params.b) {
          bits = FloatToF16Bits(static_cast<float>(params.below_b));
        }
        tensor.data_as<uint16_t>()[i] = bits;
        break;
      }
      case DType::kI32:
        tensor.data_as<int32_t>()[i] = static_cast<int32_t>(value);
        break;
      case DType::kI64:
        tensor.data_as<int64_t>()[i] = static_cast<int64_t>(value);
        break;
    }
  }
}

absl::Status Fill(const Tensor& tensor, const RandomParams& params,
                  Context& context) {
  if (tensor.numel() == 0) return absl::OkStatus();
  if (tensor.data == nullptr) return InvalidArgument("random fill: null data");
  if (!tensor.is_contiguous())
    return InvalidArgument("random fill: tensor must be contiguous");
  if (tensor.device != context.device()) {
    return InvalidArgument("random fill: tensor on ", tensor.device.ToString(),
                           ", context on ", context.device().ToString());
  }
  if (tensor.device.is_cpu()) {
    FillHost(tensor, params);
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(LaunchFillRandom(tensor.data, tensor.dtype,
                                        tensor.numel(), params, stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError("random fill on a device: built without CUDA");
#endif
}

}  // namespace

absl::Status FillUniform(const Tensor& tensor, uint64_t seed, float low,
                         float high, Context& context) {
  if (!IsFloating(tensor.dtype))
    return InvalidArgument("FillUniform: needs a floating dtype, got ",
                           DTypeName(tensor.dtype));
  if (!(low < high))
    return InvalidArgument("FillUniform: low (", low, ") must be below high (",
                           high, ")");
  return Fill(tensor,
              RandomParams{RandomKind::kUniform, seed, low, high,
                           LargestBelow(tensor.dtype, high)},
              context);
}

absl::Status FillNormal(const Tensor& tensor, uint64_t seed, float mean,
                        float stddev, Context& context) {
  if (!IsFloating(tensor.dtype))
    return InvalidArgument("FillNormal: needs a floating dtype, got ",
                           DTypeName(tensor.dtype));
  if (!(stddev >= 0))
    return InvalidArgument("FillNormal: stddev must be >= 0, got ", stddev);
  return Fill(tensor, RandomParams{RandomKind::kNormal, seed, mean, stddev},
              context);
}

absl::Status FillRandomInt(const Tensor& tensor, uint64_t seed, int64_t low,
                           int64_t high, Context& context) {
  if (tensor.dtype != DType::kI32 && tensor.dtype != DType::kI64) {
    return InvalidArgument("FillRandomInt: needs i32 or i64, got ",
                           DTypeName(tensor.dtype));
  }
  if (!(low < high))
    return InvalidArgument("FillRandomInt: low (", low,
                           ") must be below high (", high, ")");
  if (tensor.dtype == DType::kI32 &&
      (low < std::numeric_limits<int32_t>::min() ||
       high - 1 > std::numeric_limits<int32_t>::max())) {
    // Converting an out-of-range value to int32_t is undefined behaviour.
    return InvalidArgument("FillRandomInt: [", low, ", ", high,
                           ") does not fit i32");
  }
  return Fill(tensor,
              RandomParams{RandomKind::kInt, seed, static_cast<double>(low),
                           static_cast<double>(high)},
              context);
}

}  // namespace lossrt
