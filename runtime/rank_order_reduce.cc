// ReduceInRankOrder: the element loops per dtype.
#include "runtime/rank_order_reduce.h"

#include <cstdint>

namespace lossrt {
namespace {

// Sums that wrap for the integers (signed overflow is undefined) and max that
// keeps a NaN once one is seen.
inline float Add(float a, float b) { return a + b; }
inline double Add(double a, double b) { return a + b; }
inline int32_t Add(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) +
                              static_cast<uint32_t>(b));
}
inline int64_t Add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) +
                              static_cast<uint64_t>(b));
}
template <typename T>
inline T Max(T acc, T x) {
  // x != x: x is NaN.
  return (x > acc || x != x) ? x : acc;  // NOLINT
}

struct Bf16 {
  static float Load(uint16_t bits) { return Bf16BitsToFloat(bits); }
  static uint16_t Store(float value) { return FloatToBf16Bits(value); }
};
struct F16 {
  static float Load(uint16_t bits) { return F16BitsToFloat(bits); }
  static uint16_t Store(float value) { return FloatToF16Bits(value); }
};
template <typename T>
struct Same {
  static T Load(T value) { return value; }
  static T Store(T value) { return value; }
};

// out[i] = op over r of ins[r][i], in rank order, for i < n.
// [world][n] ins -> [n] out.
template <typename T, typename Acc, typename Convert>
void Reduce(ReduceOp op, const void* const* ins, int world, int64_t n,
            void* out) {
  T* result = static_cast<T*>(out);
  for (int64_t i = 0; i < n; ++i) {
    Acc acc = Convert::Load(static_cast<const T*>(ins[0])[i]);
    for (int r = 1; r < world; ++r) {
      const Acc x = Convert::Load(static_cast<const T*>(ins[r])[i]);
      acc = op == ReduceOp::kSum ? Add(acc, x) : Max(acc, x);
    }
    result[i] = Convert::Store(acc);
  }
}

}  // namespace

void ReduceInRankOrder(DType dtype, ReduceOp op, const void* const* ins,
                       int world, int64_t n, void* out) {
  switch (dtype) {
    case DType::kF32:
      return Reduce<float, float, Same<float>>(op, ins, world, n, out);
    case DType::kF64:
      return Reduce<double, double, Same<double>>(op, ins, world, n, out);
    case DType::kI32:
      return Reduce<int32_t, int32_t, Same<int32_t>>(op, ins, world, n, out);
    case DType::kI64:
      return Reduce<int64_t, int64_t, Same<int64_t>>(op, ins, world, n, out);
    case DType::kBF16:
      return Reduce<uint16_t, float, Bf16>(op, ins, world, n, out);
    case DType::kF16:
      return Reduce<uint16_t, float, F16>(op, ins, world, n, out);
  }
}

}  // namespace lossrt
