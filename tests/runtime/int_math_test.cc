// Tests of runtime/int_math.h: CeilDiv and RoundUp against their definitions
// (the smallest count of blocks that covers a, the smallest multiple >= value)
// on small exhaustive ranges, random 64-bit operands and compile-time values.
#include "runtime/int_math.h"

#include <cstdint>
#include <random>

#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

static_assert(CeilDiv(0, 4) == 0 && CeilDiv(1, 4) == 1 && CeilDiv(4, 4) == 1 &&
                  CeilDiv(5, 4) == 2,
              "CeilDiv is usable in constant expressions");
static_assert(RoundUp(int64_t{0}, int64_t{256}) == 0 &&
                  RoundUp(int64_t{1}, int64_t{256}) == 256 &&
                  RoundUp(int64_t{256}, int64_t{256}) == 256 &&
                  RoundUp(int64_t{257}, int64_t{256}) == 512,
              "RoundUp is usable in constant expressions");

// The definitions, by counting.
int64_t BlocksCovering(int64_t a, int64_t b) {
  int64_t blocks = 0;
  while (blocks * b < a) ++blocks;
  return blocks;
}

TEST(IntMathTest, SmallOperandsMatchTheDefinitions) {
  for (int64_t b = 1; b <= 64; ++b) {
    for (int64_t a = 0; a <= 1000; ++a) {
      const int64_t blocks = BlocksCovering(a, b);
      ASSERT_EQ(CeilDiv(a, b), blocks) << a << " / " << b;
      ASSERT_EQ(RoundUp(a, b), blocks * b) << a << " to " << b;
      ASSERT_EQ(CeilDiv(static_cast<int>(a), static_cast<int>(b)), blocks);
    }
  }
}

TEST(IntMathTest, LargeOperandsBracketTheQuotient) {
  std::mt19937_64 rng(test::TestSeed());
  // a + b stays below 2^62: no overflow in the formula.
  std::uniform_int_distribution<int64_t> dividend(0, int64_t{1} << 61);
  std::uniform_int_distribution<int64_t> divisor(1, int64_t{1} << 40);
  for (int i = 0; i < 100000; ++i) {
    const int64_t a = dividend(rng);
    const int64_t b = divisor(rng);
    const int64_t q = CeilDiv(a, b);
    // q blocks cover a, q - 1 do not.
    ASSERT_GE(q * b, a) << a << " / " << b;
    ASSERT_LT((q - 1) * b, a) << a << " / " << b;
    const int64_t r = RoundUp(a, b);
    ASSERT_EQ(r % b, 0) << a << " to " << b;
    ASSERT_GE(r, a) << a << " to " << b;
    ASSERT_LT(r - a, b) << a << " to " << b;
  }
}

}  // namespace
}  // namespace lossrt
