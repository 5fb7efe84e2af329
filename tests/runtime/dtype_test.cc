// Tests of runtime/dtype.h: sizes and names, and the bf16/f16 conversions
// checked against every 16-bit pattern, every rounding midpoint (ties to even),
// an independent nearest-value search on random floats, and known values
// (subnormals, overflow, infinities, NaN).
#include "runtime/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

float FloatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// The value of an IEEE binary16 pattern, decoded from the definition in double.
double HalfValue(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// The value of a bfloat16 pattern, decoded from the definition in double.
double Bf16Value(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = (bits >> 7) & 0xff;
  const int mantissa = bits & 0x7f;
  if (exponent == 255) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -133);
  return sign * std::ldexp(128 + mantissa, exponent - 134);
}

// Round to nearest, ties to the even pattern, by searching the ascending table
// of the non-negative finite values of a 16-bit format; beyond the largest
// finite value by at least half its spacing the result is infinity
// (`inf_bits`).
uint16_t NearestBySearch(double x, const std::vector<double>& table,
                         uint16_t inf_bits) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(x);
  const double largest = table.back();
  const double overflow = largest + (largest - table[table.size() - 2]) / 2;
  if (magnitude >= overflow)
    return sign | inf_bits;  // the tie goes to the even infinity
  auto upper = std::lower_bound(table.begin(), table.end(), magnitude);
  if (upper == table.end())
    return sign | static_cast<uint16_t>(table.size() - 1);
  if (*upper == magnitude || upper == table.begin()) {
    return sign | static_cast<uint16_t>(upper - table.begin());
  }
  const uint16_t hi = static_cast<uint16_t>(upper - table.begin());
  const uint16_t lo = hi - 1;
  const double below = magnitude - table[lo], above = table[hi] - magnitude;
  if (below < above) return sign | lo;
  if (above < below) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

std::vector<double> FiniteTable(double (*decode)(uint16_t), uint16_t inf_bits) {
  std::vector<double> table;
  for (uint32_t bits = 0; bits < inf_bits; ++bits) {
    table.push_back(decode(static_cast<uint16_t>(bits)));
  }
  return table;
}

bool IsHalfNan(uint16_t bits) {
  return (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0;
}
bool IsBf16Nan(uint16_t bits) {
  return (bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0;
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kF16), 2);
  EXPECT_EQ(DTypeSize(DType::kI32), 4);
  EXPECT_EQ(DTypeSize(DType::kI64), 8);
  EXPECT_EQ(DTypeSize(DType::kF64), 8);
  EXPECT_STREQ(DTypeName(DType::kF32), "f32");
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_STREQ(DTypeName(DType::kF16), "f16");
  EXPECT_STREQ(DTypeName(DType::kI32), "i32");
  EXPECT_STREQ(DTypeName(DType::kI64), "i64");
  EXPECT_STREQ(DTypeName(DType::kF64), "f64");
  EXPECT_TRUE(IsFloating(DType::kBF16));
  EXPECT_TRUE(IsFloating(DType::kF64));
  EXPECT_FALSE(IsFloating(DType::kI32));
  EXPECT_FALSE(IsFloating(DType::kI64));
}

TEST(Bf16Test, EveryPatternDecodesExactlyAndRoundTrips) {
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    const float value = Bf16BitsToFloat(bits);
    if (IsBf16Nan(bits)) {
      ASSERT_TRUE(std::isnan(value)) << std::hex << i;
      const uint16_t back = FloatToBf16Bits(value);
      ASSERT_TRUE(IsBf16Nan(back)) << std::hex << i << " -> " << back;
      ASSERT_EQ(back & 0x8000, bits & 0x8000) << std::hex << i;
      continue;
    }
    ASSERT_EQ(static_cast<double>(value), Bf16Value(bits)) << std::hex << i;
    ASSERT_EQ(FloatToBf16Bits(value), bits) << std::hex << i;
  }
}

TEST(Bf16Test, MidpointsRoundToEvenAndNeighboursToNearest) {
  // Between patterns b and b + 1 (same sign, b finite) the float midpoint is
  // b's bits with 0x8000 below; one float step either side decides the
  // direction.
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    if ((bits & 0x7fff) >= 0x7f80) continue;  // infinities and NaNs
    const uint32_t midpoint = (static_cast<uint32_t>(bits) << 16) | 0x8000u;
    const uint16_t even = (bits & 1) ? bits + 1 : bits;
    ASSERT_EQ(FloatToBf16Bits(FloatOf(midpoint)), even) << std::hex << i;
    ASSERT_EQ(FloatToBf16Bits(FloatOf(midpoint - 1)), bits) << std::hex << i;
    ASSERT_EQ(FloatToBf16Bits(FloatOf(midpoint + 1)), bits + 1)
        << std::hex << i;
  }
}

TEST(Bf16Test, RandomFloatsMatchNearestSearch) {
  const std::vector<double> table = FiniteTable(Bf16Value, 0x7f80);
  std::mt19937 rng(static_cast<uint32_t>(test::TestSeed()));
  for (int i = 0; i < 1000000; ++i) {
    const float value = FloatOf(rng());
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToBf16Bits(value), NearestBySearch(value, table, 0x7f80))
        << std::hexfloat << value;
  }
}

TEST(Bf16Test, KnownValues) {
  EXPECT_EQ(FloatToBf16Bits(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16Bits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16Bits(3.14159265f), 0x4049);  // 3.140625
  EXPECT_EQ(FloatToBf16Bits(1.0f / 3.0f), 0x3eab);
  EXPECT_EQ(FloatToBf16Bits(1.00390625f),
            0x3f80);  // 1 + 2^-8: tie, to even 1.0
  EXPECT_EQ(FloatToBf16Bits(1.01171875f),
            0x3f82);  // 1 + 3 * 2^-8: tie, to even
  // Overflow: the largest finite bf16 is 0x7f7f; FLT_MAX rounds past it to
  // infinity.
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBf16Bits(FloatOf(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16Bits(-std::numeric_limits<float>::infinity()), 0xff80);
  // Subnormals: float subnormals round among bf16 subnormals.
  EXPECT_EQ(FloatToBf16Bits(FloatOf(0x00000001u)), 0x0000);
  EXPECT_EQ(FloatToBf16Bits(FloatOf(0x00008000u)), 0x0000);  // tie to even 0
  EXPECT_EQ(FloatToBf16Bits(FloatOf(0x00018000u)), 0x0002);  // tie to even 2
  EXPECT_EQ(FloatToBf16Bits(FloatOf(0x00008001u)), 0x0001);
  EXPECT_EQ(FloatToBf16Bits(FloatOf(0x007fffffu)),
            0x0080);  // up into the normals
  EXPECT_EQ(Bf16BitsToFloat(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(Bf16BitsToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16BitsToFloat(0xc049), -3.140625f);
  // NaN stays NaN, also a signalling NaN whose payload sits only in the low 16
  // bits (plain truncation would turn it into infinity).
  EXPECT_TRUE(
      IsBf16Nan(FloatToBf16Bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(FloatToBf16Bits(FloatOf(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(FloatToBf16Bits(FloatOf(0xff800001u)), 0xffc0);
  EXPECT_TRUE(IsBf16Nan(FloatToBf16Bits(FloatOf(0x7fffffffu))));
}

TEST(F16Test, EveryPatternDecodesExactlyAndRoundTrips) {
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    const float value = F16BitsToFloat(bits);
    if (IsHalfNan(bits)) {
      ASSERT_TRUE(std::isnan(value)) << std::hex << i;
      const uint16_t back = FloatToF16Bits(value);
      ASSERT_TRUE(IsHalfNan(back)) << std::hex << i << " -> " << back;
      ASSERT_EQ(back & 0x8000, bits & 0x8000) << std::hex << i;
      continue;
    }
    ASSERT_EQ(static_cast<double>(value), HalfValue(bits)) << std::hex << i;
    ASSERT_EQ(std::signbit(value), (bits & 0x8000) != 0) << std::hex << i;
    ASSERT_EQ(FloatToF16Bits(value), bits) << std::hex << i;
  }
}

TEST(F16Test, MidpointsRoundToEvenAndNeighboursToNearest) {
  // Consecutive halves h and h + 1 have 11 significant bits, so their midpoint
  // is exact in float; the step from the largest finite half (65504) is to
  // infinity at 65520.
  for (uint32_t i = 0; i < 0x7c00; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    const double lo = HalfValue(bits);
    const double hi = bits + 1 == 0x7c00 ? 65536.0 : HalfValue(bits + 1);
    const float midpoint = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(midpoint), (lo + hi) / 2);
    const uint16_t even = (bits & 1) ? bits + 1 : bits;
    for (const float sign : {1.0f, -1.0f}) {
      const uint16_t sign_bit = sign < 0 ? 0x8000 : 0;
      const float m = sign * midpoint;
      ASSERT_EQ(FloatToF16Bits(m), sign_bit | even) << std::hexfloat << m;
      ASSERT_EQ(FloatToF16Bits(std::nextafter(m, 0.0f)), sign_bit | bits)
          << std::hexfloat << m;
      ASSERT_EQ(FloatToF16Bits(std::nextafter(m, sign * 1e30f)),
                sign_bit | (bits + 1))
          << std::hexfloat << m;
    }
  }
}

TEST(F16Test, RandomFloatsMatchNearestSearch) {
  const std::vector<double> table = FiniteTable(HalfValue, 0x7c00);
  std::mt19937 rng(static_cast<uint32_t>(test::TestSeed()));
  // Uniform bit patterns are mostly far outside half's range; also draw values
  // within it.
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  std::uniform_int_distribution<int> exponent(-30, 17);
  for (int i = 0; i < 1000000; ++i) {
    float value;
    switch (i % 3) {
      case 0:
        value = FloatOf(rng());
        break;
      case 1:
        value = in_range(rng);
        break;
      default:
        value = std::ldexp(in_range(rng) / 70000.0f, exponent(rng));
    }
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToF16Bits(value), NearestBySearch(value, table, 0x7c00))
        << std::hexfloat << value;
  }
}

TEST(F16Test, KnownValues) {
  EXPECT_EQ(FloatToF16Bits(0.0f), 0x0000);
  EXPECT_EQ(FloatToF16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToF16Bits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16Bits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16Bits(0.1f), 0x2e66);
  EXPECT_EQ(FloatToF16Bits(3.14159265f), 0x4248);
  EXPECT_EQ(FloatToF16Bits(65504.0f), 0x7bff);  // the largest finite half
  EXPECT_EQ(FloatToF16Bits(65519.996f), 0x7bff);
  EXPECT_EQ(FloatToF16Bits(65520.0f),
            0x7c00);  // the tie goes to (even) infinity
  EXPECT_EQ(FloatToF16Bits(1e10f), 0x7c00);
  EXPECT_EQ(FloatToF16Bits(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToF16Bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToF16Bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Subnormal halves: multiples of 2^-24.
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -25)), 0x0000);     // tie to even 0
  EXPECT_EQ(FloatToF16Bits(std::ldexp(3.0f, -25)), 0x0002);     // tie to even 2
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0001f, -25)), 0x0001);  // above the tie
  EXPECT_EQ(FloatToF16Bits(-std::ldexp(5.0f, -25)), 0x8002);    // tie to even 2
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1023.5f, -24)),
            0x0400);  // up into the normals
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToF16Bits(1e-8f), 0x0000);
  EXPECT_EQ(FloatToF16Bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(F16BitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16BitsToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16BitsToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16BitsToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(
      IsHalfNan(FloatToF16Bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsHalfNan(
      FloatToF16Bits(FloatOf(0x7f800001u))));  // signalling, low payload
  EXPECT_TRUE(IsHalfNan(FloatToF16Bits(FloatOf(0xffc00000u))));
  EXPECT_TRUE(std::isnan(F16BitsToFloat(0x7e00)));
}

}  // namespace
}  // namespace lossrt
