// Element types of tensors, their sizes and names, and host conversions for the
// 16-bit floating-point types (round to nearest even, as the GPU does).
#ifndef LOSSRT_RUNTIME_DTYPE_H_
#define LOSSRT_RUNTIME_DTYPE_H_

#include <cstdint>
#include <cstring>

namespace lossrt {

enum class DType { kF32, kBF16, kF16, kI32, kI64, kF64 };

constexpr int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI64:
    case DType::kF64:
      return 8;
  }
  return 0;
}

constexpr const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kF64:
      return "f64";
  }
  return "?";
}

constexpr bool IsFloating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 ||
         dtype == DType::kF16 || dtype == DType::kF64;
}

// bfloat16 bits from a float, rounding to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float Bf16BitsToFloat(uint16_t value) {
  uint32_t bits = static_cast<uint32_t>(value) << 16;
  float result;
  std::memcpy(&result, &bits, 4);
  return result;
}

// IEEE half bits from a float, rounding to nearest even (subnormals and
// overflow included).
uint16_t FloatToF16Bits(float value);
float F16BitsToFloat(uint16_t value);

// `value` rounded to bf16 or f16 (nearest even) and back to float; other
// dtypes leave it unchanged.
inline float RoundToDType(DType dtype, float value) {
  switch (dtype) {
    case DType::kBF16:
      return Bf16BitsToFloat(FloatToBf16Bits(value));
    case DType::kF16:
      return F16BitsToFloat(FloatToF16Bits(value));
    default:
      return value;
  }
}

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_DTYPE_H_
