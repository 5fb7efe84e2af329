// Host images of tensors for the tests: the raw bytes of a tensor's
// memory, element loads and stores in any dtype, and the NaN poison written
// before a call so that the tests can tell which elements the call wrote.
#ifndef LOSSRT_TESTS_TENSOR_IMAGE_H_
#define LOSSRT_TESTS_TENSOR_IMAGE_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// The byte offset of element `index` in an image of `image_bytes` bytes of
// `dtype` elements. An element outside the image is a bug in the test: it
// stops the test binary with a message rather than read or write past the
// buffer. (The check also shows the compiler that the accesses below stay in
// the image whatever dtype a caller passes with a small image.)
inline size_t ElementOffset(DType dtype, size_t image_bytes, int64_t index) {
  const size_t size = static_cast<size_t>(DTypeSize(dtype));
  // index < image_bytes first: then (index + 1) * size cannot overflow.
  if (size == 0 || index < 0 || static_cast<size_t>(index) >= image_bytes ||
      (static_cast<size_t>(index) + 1) * size > image_bytes) {
    std::fprintf(stderr,
                 "tensor_image: element %lld of %zu-byte elements is outside "
                 "an image of %zu bytes\n",
                 static_cast<long long>(index), size, image_bytes);
    std::abort();
  }
  return static_cast<size_t>(index) * size;
}

// Element `index` of an image of `dtype` elements, as a double (exact for every
// dtype but i64 beyond 2^53).
inline double Load(DType dtype, const Bytes& image, int64_t index) {
  const uint8_t* at = image.data() + ElementOffset(dtype, image.size(), index);
  switch (dtype) {
    case DType::kF32: {
      float value;
      std::memcpy(&value, at, 4);
      return value;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t bits;
      std::memcpy(&bits, at, 2);
      return dtype == DType::kBF16 ? Bf16BitsToFloat(bits)
                                   : F16BitsToFloat(bits);
    }
    case DType::kI32: {
      int32_t value;
      std::memcpy(&value, at, 4);
      return value;
    }
    case DType::kI64: {
      int64_t value;
      std::memcpy(&value, at, 8);
      return static_cast<double>(value);
    }
    case DType::kF64: {
      double value;
      std::memcpy(&value, at, 8);
      return value;
    }
    default:
      return std::numeric_limits<double>::quiet_NaN();
  }
}

// Stores `value` rounded to `dtype` (to nearest even for the 16-bit floats).
inline void Store(DType dtype, Bytes& image, int64_t index, double value) {
  uint8_t* const at = image.data() + ElementOffset(dtype, image.size(), index);
  switch (dtype) {
    case DType::kF32: {
      const float narrow = static_cast<float>(value);
      std::memcpy(at, &narrow, 4);
      break;
    }
    case DType::kBF16:
    case DType::kF16: {
      const float narrow = static_cast<float>(value);
      const uint16_t bits = dtype == DType::kBF16 ? FloatToBf16Bits(narrow)
                                                  : FloatToF16Bits(narrow);
      std::memcpy(at, &bits, 2);
      break;
    }
    case DType::kI32: {
      const int32_t narrow = static_cast<int32_t>(value);
      std::memcpy(at, &narrow, 4);
      break;
    }
    case DType::kI64: {
      const int64_t wide = static_cast<int64_t>(value);
      std::memcpy(at, &wide, 8);
      break;
    }
    case DType::kF64:
      std::memcpy(at, &value, 8);
      break;
    default:
      break;
  }
}

// Whether element `index` of a floating image still holds the poison.
inline bool IsPoison(DType dtype, const Bytes& image, int64_t index) {
  const uint8_t* at = image.data() + ElementOffset(dtype, image.size(), index);
  if (dtype == DType::kF64) {
    uint32_t bits[2];
    std::memcpy(bits, at, 8);
    return bits[0] == kPoisonF32 && bits[1] == kPoisonF32;
  }
  if (dtype == DType::kF32) {
    uint32_t bits;
    std::memcpy(&bits, at, 4);
    return bits == kPoisonF32;
  }
  uint16_t bits;
  std::memcpy(&bits, at, 2);
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
