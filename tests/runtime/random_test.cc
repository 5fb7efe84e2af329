// Tests of runtime/philox.h and runtime/random.h: Philox4x32-10 against an
// independent implementation of the published algorithm (itself checked against
// Random123's known-answer vectors), the element formulas of the fills,
// range/mean/variance checks on the CPU, and CPU-vs-GPU equality (bitwise for
// uniform and integer fills) where a GPU is usable.
#include "runtime/random.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/dtype.h"
#include "runtime/philox.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

// Philox4x32-10 written from Salmon et al. (SC'11) and Random123's philox.h:
// the key is bumped before each round after the first; a round multiplies
// counter words 0 and 2.
struct Philox4x32Reference {
  static std::array<uint32_t, 4> Generate(std::array<uint32_t, 4> ctr,
                                          std::array<uint32_t, 2> key) {
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        key[0] += 0x9E3779B9u;  // golden ratio
        key[1] += 0xBB67AE85u;  // sqrt(3) - 1
      }
      const uint64_t p0 = uint64_t{0xD2511F53u} * ctr[0];
      const uint64_t p1 = uint64_t{0xCD9E8D57u} * ctr[2];
      ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0],
             static_cast<uint32_t>(p1),
             static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1],
             static_cast<uint32_t>(p0)};
    }
    return ctr;
  }

  // The words lossrt uses for element `index` under `seed`: the index in
  // counter words 0 and 1, fixed words 2 and 3, the seed as the key.
  static std::array<uint32_t, 4> ForElement(uint64_t index, uint64_t seed) {
    return Generate(
        {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
         0x9e3779b9u, 0x243f6a88u},
        {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  }
};

std::array<uint32_t, 4> Words(const Philox4& p) {
  return {p.v[0], p.v[1], p.v[2], p.v[3]};
}

// (0.5 + top 24 bits) / 2^24, written out independently of UniformFromBits.
double ReferenceUniform(uint32_t bits) {
  return (std::floor(bits / 256.0) + 0.5) / 16777216.0;
}

TEST(PhiloxTest, ReferenceMatchesRandom123KnownAnswers) {
  // Random123's kat_vectors, "philox4x32 10" lines: counter, key -> output.
  using R = Philox4x32Reference;
  EXPECT_EQ(R::Generate({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c,
                                     0x9b00dbd8}));
  EXPECT_EQ(R::Generate({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6,
                                     0x6d5451fd}));
  EXPECT_EQ(R::Generate({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                        {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420,
                                     0x24126ea1}));
}

TEST(PhiloxTest, MatchesTheReferenceForFixedAndRandomCounters) {
  using R = Philox4x32Reference;
  for (const auto& [index, seed] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 0},
           {1, 0},
           {0, 1},
           {~uint64_t{0}, ~uint64_t{0}},
           {123456789, 0xdeadbeefcafef00du},
           {uint64_t{1} << 32, 42}}) {
    EXPECT_EQ(Words(Philox4x32(index, seed)), R::ForElement(index, seed))
        << "index " << index << " seed " << seed;
  }
  std::mt19937_64 rng(test::TestSeed());
  for (int i = 0; i < 10000; ++i) {
    const uint64_t index = rng() >> (rng() % 64), seed = rng();
    ASSERT_EQ(Words(Philox4x32(index, seed)), R::ForElement(index, seed))
        << "index " << index << " seed " << seed;
  }
}

TEST(PhiloxTest, BitsToNumbers) {
  // Exact: the largest draw stays below 1 and the half step is kept for every
  // k.
  EXPECT_EQ(UniformFromBits(0), 0.5 / 16777216.0);
  EXPECT_EQ(UniformFromBits(0xffffffffu), 1.0 - 0.5 / 16777216.0);
  EXPECT_LT(UniformFromBits(0xffffffffu), 1.0);
  EXPECT_EQ(UniformFromBits(0x80000000u), 0.5 + 0.5 / 16777216.0);
  std::mt19937 rng(static_cast<uint32_t>(test::TestSeed()));
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = rng();
    ASSERT_EQ(UniformFromBits(bits), ReferenceUniform(bits)) << bits;
    const uint64_t n = 1 + rng() % 1000000;
    ASSERT_EQ(IntFromBits(bits, n),
              static_cast<int64_t>(
                  std::floor(bits / 4294967296.0 * static_cast<double>(n))));
  }
  EXPECT_EQ(IntFromBits(0, 10), 0);
  EXPECT_EQ(IntFromBits(0xffffffffu, 10), 9);
  EXPECT_EQ(IntFromBits(0xffffffffu, uint64_t{1} << 32), 0xffffffff);
}

class RandomFillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = test::TestSeed();
    rng_.seed(seed_);
    absl::StatusOr<std::unique_ptr<Context>> context =
        Context::Create(Device::Cpu());
    ASSERT_TRUE(context.ok()) << context.status();
    cpu_ = *std::move(context);
  }

  template <typename T>
  Tensor HostView(std::vector<T>& values, DType dtype) {
    return Tensor::Of(values.data(), dtype,
                      {static_cast<int64_t>(values.size())}, Device::Cpu());
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::unique_ptr<Context> cpu_;
};

TEST_F(RandomFillTest,
       UniformF32IsTheDocumentedFormulaInRangeWithTheRightMean) {
  const float low = std::uniform_real_distribution<float>(-10.0f, 10.0f)(rng_);
  const float high =
      low + std::uniform_real_distribution<float>(0.01f, 10.0f)(rng_);
  const uint64_t fill_seed = rng_();
  std::vector<float> values(1 << 18);
  ASSERT_TRUE(
      FillUniform(HostView(values, DType::kF32), fill_seed, low, high, *cpu_)
          .ok());
  double sum = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t bits = Philox4x32Reference::ForElement(i, fill_seed)[0];
    const float expected = static_cast<float>(
        low + (static_cast<double>(high) - low) * ReferenceUniform(bits));
    // Draws that round up to high are kept just below it.
    ASSERT_EQ(values[i], expected < high ? expected : std::nextafter(high, low))
        << "element " << i;
    ASSERT_GE(values[i], low) << "element " << i;
    ASSERT_LT(values[i], high) << "element " << i;
    sum += values[i];
  }
  // The mean of n uniforms has standard deviation (high - low) / sqrt(12 n).
  const double n = values.size();
  EXPECT_NEAR(sum / n, (low + high) / 2.0,
              5 * (high - low) / std::sqrt(12 * n));
}

TEST_F(RandomFillTest, UniformStaysBelowHighAfterRounding) {
  // Philox word 0 of element 104 under seed 190032 has all top 24 bits set, the
  // largest uniform draw: 1 - 2^-25, which rounds to 1.0f in float.
  ASSERT_EQ(Philox4x32(104, 190032).v[0] >> 8, 0xffffffu);
  std::vector<float> f32(105);
  ASSERT_TRUE(
      FillUniform(HostView(f32, DType::kF32), 190032, 0.0f, 1.0f, *cpu_).ok());
  EXPECT_LT(f32[104], 1.0f);
  EXPECT_EQ(f32[104], std::nextafter(1.0f, 0.0f));

  // 16-bit types round the top 2^-9 (bf16) or 2^-12 (f16) of [0, 1) up to 1
  // unless kept below it; with 2^16 draws both happen many times.
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> bits(1 << 16);
    ASSERT_TRUE(
        FillUniform(HostView(bits, dtype), seed_, 0.0f, 1.0f, *cpu_).ok());
    float largest = 0;
    for (uint16_t b : bits) {
      const float v =
          dtype == DType::kBF16 ? Bf16BitsToFloat(b) : F16BitsToFloat(b);
      ASSERT_GE(v, 0.0f) << DTypeName(dtype);
      ASSERT_LT(v, 1.0f) << DTypeName(dtype);
      largest = std::max(largest, v);
    }
    // The largest value below 1 does occur: draws are clamped, not redrawn from
    // a smaller range.
    EXPECT_EQ(largest,
              dtype == DType::kBF16 ? 1.0f - 1.0f / 256 : 1.0f - 1.0f / 2048)
        << DTypeName(dtype);
  }
}

TEST_F(RandomFillTest, UniformInEveryFloatingDType) {
  const float low = -std::uniform_real_distribution<float>(0.5f, 4.0f)(rng_);
  const float high = std::uniform_real_distribution<float>(0.5f, 4.0f)(rng_);
  const uint64_t fill_seed = rng_();
  const size_t n = 100003;
  std::vector<float> f32(n);
  std::vector<double> f64(n);
  std::vector<uint16_t> bf16(n), f16(n);
  ASSERT_TRUE(
      FillUniform(HostView(f32, DType::kF32), fill_seed, low, high, *cpu_)
          .ok());
  ASSERT_TRUE(
      FillUniform(HostView(f64, DType::kF64), fill_seed, low, high, *cpu_)
          .ok());
  ASSERT_TRUE(
      FillUniform(HostView(bf16, DType::kBF16), fill_seed, low, high, *cpu_)
          .ok());
  ASSERT_TRUE(
      FillUniform(HostView(f16, DType::kF16), fill_seed, low, high, *cpu_)
          .ok());
  // The largest 16-bit values below high, by search over the positive patterns.
  uint16_t bf16_below_high = 0, f16_below_high = 0;
  for (uint16_t bits = 0; bits < 0x7c00; ++bits) {
    if (Bf16BitsToFloat(bits) < high) bf16_below_high = bits;
    if (F16BitsToFloat(bits) < high) f16_below_high = bits;
  }
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    // All four come from the same draw, rounded to their type (kept below
    // high).
    ASSERT_GE(f64[i], low);
    ASSERT_LT(f64[i], high);
    sum += f64[i];
    const float rounded = static_cast<float>(f64[i]);
    ASSERT_EQ(f32[i], rounded < high ? rounded : std::nextafter(high, low))
        << i;
    // 16-bit types: the draw rounded to nearest, or the largest value below
    // high.
    const uint16_t b = FloatToBf16Bits(rounded), h = FloatToF16Bits(rounded);
    ASSERT_EQ(bf16[i], Bf16BitsToFloat(b) < high ? b : bf16_below_high) << i;
    ASSERT_EQ(f16[i], F16BitsToFloat(h) < high ? h : f16_below_high) << i;
    ASSERT_GE(Bf16BitsToFloat(bf16[i]), Bf16BitsToFloat(FloatToBf16Bits(low)))
        << i;
  }
  EXPECT_NEAR(sum / n, (low + high) / 2.0,
              5 * (high - low) / std::sqrt(12.0 * n));
}

TEST_F(RandomFillTest, NormalHasTheRequestedMeanAndDeviation) {
  const float mean = std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng_);
  const float stddev = std::uniform_real_distribution<float>(0.01f, 2.0f)(rng_);
  std::vector<double> values(1 << 18);
  ASSERT_TRUE(
      FillNormal(HostView(values, DType::kF64), rng_(), mean, stddev, *cpu_)
          .ok());
  const double n = values.size();
  double sum = 0, sum_squares = 0;
  int beyond_4_sigma = 0;
  for (double v : values) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_squares += (v - mean) * (v - mean);
    if (std::fabs(v - mean) > 4 * stddev) ++beyond_4_sigma;
  }
  EXPECT_NEAR(sum / n, mean, 5 * stddev / std::sqrt(n));
  // The sample variance has standard deviation sigma^2 sqrt(2 / n).
  EXPECT_NEAR(sum_squares / n, stddev * stddev,
              5 * stddev * stddev * std::sqrt(2 / n));
  // P(|z| > 4) = 6.3e-5: about 17 of 2^18; a fill with no tails (or fat ones)
  // fails.
  EXPECT_GT(beyond_4_sigma, 1);
  EXPECT_LT(beyond_4_sigma, 60);
}

TEST_F(RandomFillTest, NormalIsBoxMullerOfTheFirstTwoWords) {
  const uint64_t fill_seed = rng_();
  std::vector<double> values(1000);
  ASSERT_TRUE(
      FillNormal(HostView(values, DType::kF64), fill_seed, 1.5f, 0.5f, *cpu_)
          .ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const auto words = Philox4x32Reference::ForElement(i, fill_seed);
    const double u1 = ReferenceUniform(words[0]),
                 u2 = ReferenceUniform(words[1]);
    const double expected =
        1.5 + 0.5 * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    ASSERT_NEAR(values[i], expected, 1e-12) << i;
  }
}

TEST_F(RandomFillTest, IntegersCoverTheRangeEvenly) {
  const int64_t low = std::uniform_int_distribution<int64_t>(-1000, 1000)(rng_);
  const int64_t count = std::uniform_int_distribution<int64_t>(2, 50)(rng_);
  std::vector<int32_t> i32(1 << 17);
  std::vector<int64_t> i64(1 << 17);
  const uint64_t fill_seed = rng_();
  ASSERT_TRUE(FillRandomInt(HostView(i32, DType::kI32), fill_seed, low,
                            low + count, *cpu_)
                  .ok());
  ASSERT_TRUE(FillRandomInt(HostView(i64, DType::kI64), fill_seed, low,
                            low + count, *cpu_)
                  .ok());
  std::vector<int64_t> histogram(count, 0);
  for (size_t i = 0; i < i32.size(); ++i) {
    ASSERT_EQ(i32[i], i64[i]) << i;
    ASSERT_GE(i32[i], low) << i;
    ASSERT_LT(i32[i], low + count) << i;
    ASSERT_EQ(i32[i], low + IntFromBits(Philox4x32Reference::ForElement(
                                            i, fill_seed)[0],
                                        static_cast<uint64_t>(count)));
    ++histogram[i32[i] - low];
  }
  // Each bucket is binomial(n, 1/count): within 5 standard deviations of n /
  // count.
  const double n = i32.size(), p = 1.0 / count;
  for (int64_t k = 0; k < count; ++k) {
    EXPECT_NEAR(histogram[k], n * p, 5 * std::sqrt(n * p * (1 - p)))
        << "value " << low + k;
  }
}

TEST_F(RandomFillTest, IntegersAtTheEdgesOfTheirType) {
  std::vector<int32_t> i32(4096);
  ASSERT_TRUE(FillRandomInt(HostView(i32, DType::kI32), seed_,
                            std::numeric_limits<int32_t>::min(),
                            int64_t{std::numeric_limits<int32_t>::max()} + 1,
                            *cpu_)
                  .ok());
  int negative = 0;
  for (int32_t v : i32) negative += v < 0;
  EXPECT_NEAR(negative, 2048, 5 * 32);
  // Bounds an i32 cannot hold are refused rather than wrapped.
  for (const auto& [low, high] :
       std::vector<std::pair<int64_t, int64_t>>{{0, (int64_t{1} << 31) + 1},
                                                {-(int64_t{1} << 31) - 1, 0},
                                                {-(int64_t{1} << 40), 5}}) {
    const absl::Status status =
        FillRandomInt(HostView(i32, DType::kI32), seed_, low, high, *cpu_);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << "[" << low << ", " << high << "): " << status;
  }
}

TEST_F(RandomFillTest, SameSeedSameValuesAndPrefixesAgree) {
  const uint64_t fill_seed = rng_();
  std::vector<float> a(5000), b(5000), prefix(1234);
  ASSERT_TRUE(
      FillNormal(HostView(a, DType::kF32), fill_seed, 0.0f, 1.0f, *cpu_).ok());
  ASSERT_TRUE(
      FillNormal(HostView(b, DType::kF32), fill_seed, 0.0f, 1.0f, *cpu_).ok());
  ASSERT_TRUE(
      FillNormal(HostView(prefix, DType::kF32), fill_seed, 0.0f, 1.0f, *cpu_)
          .ok());
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), a.begin()));
  ASSERT_TRUE(
      FillNormal(HostView(b, DType::kF32), fill_seed + 1, 0.0f, 1.0f, *cpu_)
          .ok());
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  EXPECT_LT(same, 5);
}

TEST_F(RandomFillTest, RejectsBadArguments) {
  std::vector<float> f32(16);
  std::vector<int32_t> i32(16);
  const Tensor floats = HostView(f32, DType::kF32);
  const Tensor ints = HostView(i32, DType::kI32);
  EXPECT_EQ(FillUniform(ints, 1, 0, 1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FillNormal(ints, 1, 0, 1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FillRandomInt(floats, 1, 0, 1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FillUniform(floats, 1, 1, 1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FillUniform(floats, 1, 2, 1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FillUniform(floats, 1, 0, std::nanf(""), *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FillNormal(floats, 1, 0, -1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FillRandomInt(ints, 1, 5, 5, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);

  Tensor strided =
      Tensor::Of(f32.data(), DType::kF32, {2, 4}, Device::Cpu(), 8);
  EXPECT_EQ(FillUniform(strided, 1, 0, 1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor null_data = floats;
  null_data.data = nullptr;
  EXPECT_EQ(FillUniform(null_data, 1, 0, 1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor on_gpu = floats;
  on_gpu.device = Device::Cuda(0);
  EXPECT_EQ(FillUniform(on_gpu, 1, 0, 1, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  for (float v : f32) EXPECT_EQ(v, 0.0f);  // nothing was written
  // Empty tensors are fine, with or without memory.
  const Tensor empty = Tensor::Of(nullptr, DType::kF32, {0}, Device::Cpu());
  EXPECT_TRUE(FillUniform(empty, 1, 0, 1, *cpu_).ok());
}

// CPU against GPU, for every dtype and sizes that are not multiples of the
// block size.
class RandomGpuTest : public RandomFillTest {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    RandomFillTest::SetUp();
    absl::StatusOr<std::unique_ptr<Context>> gpu =
        Context::Create(Device::Cuda(0));
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
  }

  // Fills `n` elements of `dtype` on both devices with `fill` and returns (cpu,
  // gpu) bytes.
  template <typename Fill>
  void FillBoth(DType dtype, int64_t n, Fill fill, std::vector<char>* cpu,
                std::vector<char>* gpu) {
    cpu->assign(n * DTypeSize(dtype), 0);
    gpu->assign(n * DTypeSize(dtype), 1);
    const Tensor host = Tensor::Of(cpu->data(), dtype, {n}, Device::Cpu());
    ASSERT_TRUE(fill(host, *cpu_).ok());
    absl::StatusOr<OwnedTensor> device =
        EmptyTensor(gpu_->allocator(), dtype, {n});
    ASSERT_TRUE(device.ok()) << device.status();
    absl::Status status = fill(device->view, *gpu_);
    ASSERT_TRUE(status.ok()) << status;
    status =
        CopyTensor(device->view,
                   Tensor::Of(gpu->data(), dtype, {n}, Device::Cpu()), *gpu_);
    ASSERT_TRUE(status.ok()) << status;
  }

  std::unique_ptr<Context> gpu_;
};

TEST_F(RandomGpuTest, UniformIsBitwiseEqual) {
  // Bounds on a 2^-10 grid keep (high - low) * u exact, so fused and unfused
  // arithmetic agree.
  const float low =
      std::floor(std::uniform_real_distribution<float>(-8, 8)(rng_) * 1024) /
      1024;
  const float high =
      low +
      std::ceil(std::uniform_real_distribution<float>(0.01f, 8)(rng_) * 1024) /
          1024;
  for (const DType dtype :
       {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    for (const int64_t n : {int64_t{1}, int64_t{255}, int64_t{1} << 20 | 77}) {
      const uint64_t fill_seed = rng_();
      std::vector<char> cpu, gpu;
      FillBoth(
          dtype, n,
          [&](const Tensor& t, Context& c) {
            return FillUniform(t, fill_seed, low, high, c);
          },
          &cpu, &gpu);
      ASSERT_TRUE(cpu == gpu) << DTypeName(dtype) << " n=" << n << " [" << low
                              << ", " << high << ") seed " << fill_seed;
    }
  }
}

TEST_F(RandomGpuTest, UniformBitwiseEqualBeyondOneGridOfThreads) {
  // 65536 blocks of 256 threads cover 2^24 elements; the rest take the
  // grid-stride loop.
  const int64_t n = (int64_t{1} << 24) + 4099;
  const uint64_t fill_seed = rng_();
  std::vector<char> cpu, gpu;
  FillBoth(
      DType::kF32, n,
      [&](const Tensor& t, Context& c) {
        return FillUniform(t, fill_seed, 0.0f, 1.0f, c);
      },
      &cpu, &gpu);
  ASSERT_TRUE(cpu == gpu) << "seed " << fill_seed;
}

TEST_F(RandomGpuTest, IntegersAreBitwiseEqual) {
  for (const DType dtype : {DType::kI32, DType::kI64}) {
    const int64_t low =
        std::uniform_int_distribution<int64_t>(-100000, 100000)(rng_);
    const int64_t high =
        low + std::uniform_int_distribution<int64_t>(1, 1 << 30)(rng_);
    const uint64_t fill_seed = rng_();
    std::vector<char> cpu, gpu;
    FillBoth(
        dtype, 300007,
        [&](const Tensor& t, Context& c) {
          return FillRandomInt(t, fill_seed, low, high, c);
        },
        &cpu, &gpu);
    ASSERT_TRUE(cpu == gpu) << DTypeName(dtype) << " [" << low << ", " << high
                            << ") seed " << fill_seed;
  }
}

TEST_F(RandomGpuTest, NormalAgreesWithinRounding) {
  const float mean = std::uniform_real_distribution<float>(-2, 2)(rng_);
  const float stddev = std::uniform_real_distribution<float>(0.1f, 2)(rng_);
  for (const DType dtype :
       {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    const uint64_t fill_seed = rng_();
    const int64_t n = 200003;
    std::vector<char> cpu, gpu;
    FillBoth(
        dtype, n,
        [&](const Tensor& t, Context& c) {
          return FillNormal(t, fill_seed, mean, stddev, c);
        },
        &cpu, &gpu);
    if (HasFatalFailure()) return;
    int64_t differing = 0;
    for (int64_t i = 0; i < n; ++i) {
      double a, b, tolerance;
      switch (dtype) {
        case DType::kF32: {
          float fa, fb;
          std::memcpy(&fa, &cpu[4 * i], 4);
          std::memcpy(&fb, &gpu[4 * i], 4);
          a = fa, b = fb, tolerance = 1e-6 * std::fabs(a);
          break;
        }
        case DType::kF64:
          std::memcpy(&a, &cpu[8 * i], 8);
          std::memcpy(&b, &gpu[8 * i], 8);
          tolerance = 1e-6 * std::fabs(a);
          break;
        default: {  // 16-bit: the float values may straddle a rounding
                    // boundary: 1 ulp
          uint16_t ha, hb;
          std::memcpy(&ha, &cpu[2 * i], 2);
          std::memcpy(&hb, &gpu[2 * i], 2);
          const bool bf16 = dtype == DType::kBF16;
          a = bf16 ? Bf16BitsToFloat(ha) : F16BitsToFloat(ha);
          b = bf16 ? Bf16BitsToFloat(hb) : F16BitsToFloat(hb);
          tolerance = std::fabs(a) * (bf16 ? 1.0 / 128 : 1.0 / 1024) + 1e-7;
        }
      }
      differing += a != b;
      ASSERT_NEAR(a, b, tolerance)
          << DTypeName(dtype) << " element " << i << " seed " << fill_seed;
    }
    std::cout << DTypeName(dtype) << ": " << differing << " of " << n
              << " normals differ in the last bits between CPU and GPU\n";
  }
}

}  // namespace
}  // namespace lossrt
