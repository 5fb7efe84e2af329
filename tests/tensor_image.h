// Host images of tensors for the tests: the raw bytes of a tensor's
// memory, element loads and stores in any dtype, and the NaN poison written
// before a call so that the tests can tell which elements the call wrote.
#ifndef LOSSRT_TESTS_TENSOR_IMAGE_H_
#define LOSSRT_TESTS_TENSOR_IMAGE_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "runtime/dtype.h"

namespace lossrt {
namespace test {

using Bytes = std::vector<uint8_t>;

// Quiet NaNs whose payloads no arithmetic on ordinary inputs produces.
constexpr uint32_t kPoisonF32 = 0x7fedcba9u;
constexpr uint16_t kPoisonBf16 = 0x7fedu;
constexpr uint16_t kPoisonF16 = 0x7e5bu;

// Element `index` of an image of `dtype` elements, as a double (exact for every
// dtype but i64 beyond 2^53).
inline double Load(DType dtype, const Bytes& image, int64_t index) {
  switch (dtype) {
    case DType::kF32: {
      float value;
      std::memcpy(&value, image.data() + 4 * index, 4);
      return value;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t bits;
      std::memcpy(&bits, image.data() + 2 * index, 2);
      return dtype == DType::kBF16 ? Bf16BitsToFloat(bits)
                                   : F16BitsToFloat(bits);
    }
    case DType::kI32: {
      int32_t value;
      std::memcpy(&value, image.data() + 4 * index, 4);
      return value;
    }
    case DType::kI64: {
      int64_t value;
      std::memcpy(&value, image.data() + 8 * index, 8);
      return static_cast<double>(value);
    }
    case DType::kF64: {
      double value;
      std::memcpy(&value, image.data() + 8 * index, 8);
      return value;
    }
    default:
      return std::numeric_limits<double>::quiet_NaN();
  }
}

// Stores `value` rounded to `dtype` (to nearest even for the 16-bit floats).
inline void Store(DType dtype, Bytes& image, int64_t index, double value) {
  switch (dtype) {
    case DType::kF32: {
      const float narrow = static_cast<float>(value);
      std::memcpy(image.data() + 4 * index, &narrow, 4);
      break;
    }
    case DType::kBF16:
    case DType::kF16: {
      const float narrow = static_cast<float>(value);
      const uint16_t bits = dtype == DType::kBF16 ? FloatToBf16Bits(narrow)
                                                  : FloatToF16Bits(narrow);
      std::memcpy(image.data() + 2 * index, &bits, 2);
      break;
    }
    case DType::kI32: {
      const int32_t narrow = static_cast<int32_t>(value);
      std::memcpy(image.data() + 4 * index, &narrow, 4);
      break;
    }
    case DType::kI64: {
      const int64_t wide = static_cast<int64_t>(value);
      std::memcpy(image.data() + 8 * index, &wide, 8);
      break;
    }
    case DType::kF64:
      std::memcpy(image.data() + 8 * index, &value, 8);
      break;
    default:
      break;
  }
}

// Whether element `index` of a floating image still holds the poison.
inline bool IsPoison(DType dtype, const Bytes& image, int64_t index) {
  if (dtype == DType::kF64) {
    uint32_t bits[2];
    std::memcpy(bits, image.data() + 8 * index, 8);
    return bits[0] == kPoisonF32 && bits[1] == kPoisonF32;
  }
  if (dtype == DType::kF32) {
    uint32_t bits;
    std::memcpy(&bits, image.data() + 4 * index, 4);
    return bits == kPoisonF32;
  }
  uint16_t bits;
  std::memcpy(&bits, image.data() + 2 * index, 2);
  return bits == (dtype == DType::kBF16 ? kPoisonBf16 : kPoisonF16);
}

// Fills every element of the image with the poison of its dtype (8-byte types
// get two f32 poisons: a NaN double, an absurd integer).
inline void Poison(DType dtype, Bytes& image) {
  const int64_t size = DTypeSize(dtype);
  for (size_t at = 0; at + size <= image.size(); at += size) {
    if (dtype == DType::kBF16) {
      std::memcpy(image.data() + at, &kPoisonBf16, 2);
    } else if (dtype == DType::kF16) {
      std::memcpy(image.data() + at, &kPoisonF16, 2);
    } else {
      for (int64_t k = 0; k < size; k += 4) {
        std::memcpy(image.data() + at + k, &kPoisonF32, 4);
      }
    }
  }
}

}  // namespace test
}  // namespace lossrt

#endif  // LOSSRT_TESTS_TENSOR_IMAGE_H_
