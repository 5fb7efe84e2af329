// IEEE binary16 conversions on the host.
#include "runtime/dtype.h"

#include <cmath>

namespace lossrt {

uint16_t FloatToF16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs_bits >= 0x477ff000u)
    return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (abs_bits < 0x38800000u) {
    // Subnormal half (or zero): scale so that the half's last bit is the
    // float's units.
    float magnitude;
    std::memcpy(&magnitude, &abs_bits, 4);
    const float scaled =
        std::nearbyint(magnitude * 16777216.0f);  // 2^24, ties to even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(scaled));
  }
  uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  rounded -= 0x38000000u;  // rebias exponent 127 -> 15
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

float F16BitsToFloat(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  const uint32_t mantissa = value & 0x3ffu;
  float result;
  if (exponent == 0) {
    result = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -result : result;
  }
  uint32_t bits;
  if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  std::memcpy(&result, &bits, 4);
  return result;
}

}  // namespace lossrt
