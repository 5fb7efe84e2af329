// Tests of tests/gpu_test_util.h: seed parsing and derivation, the per-test
// seed, and that SKIP_WITHOUT_GPU() skips exactly when no CUDA device is
// usable.
#include "tests/gpu_test_util.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "runtime/device.h"

namespace lossrt {
namespace test {
namespace {

TEST(ParseSeedTest, AcceptsDecimalAndHex) {
  EXPECT_EQ(*ParseSeed("0"), 0u);
  EXPECT_EQ(*ParseSeed("12345"), 12345u);
  EXPECT_EQ(*ParseSeed(" 42\n"), 42u);
  EXPECT_EQ(*ParseSeed("18446744073709551615"), 18446744073709551615u);
  EXPECT_EQ(*ParseSeed("0x10"), 16u);
  EXPECT_EQ(*ParseSeed("0XdeadBEEF"), 0xdeadbeefu);
  EXPECT_EQ(*ParseSeed("0xffffffffffffffff"), ~uint64_t{0});
}

TEST(ParseSeedTest, RejectsMalformedValuesWithTheirText) {
  for (const char* bad :
       {"", "abc", "-1", "+1", "1.5", "0x", "0xg1", "0x-1",
        "18446744073709551616", "0x1ffffffffffffffff", "12 34"}) {
    absl::StatusOr<uint64_t> seed = ParseSeed(bad);
    ASSERT_FALSE(seed.ok()) << "'" << bad << "' parsed as " << *seed;
    EXPECT_EQ(seed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(seed.status().message().find(std::string("'") + bad + "'"),
              absl::string_view::npos)
        << seed.status();
  }
}

TEST(DeriveSeedTest, DependsOnBaseAndName) {
  EXPECT_EQ(DeriveSeed(1, "A.b"), DeriveSeed(1, "A.b"));
  std::set<uint64_t> seeds;
  for (uint64_t base : {0u, 1u, 2u}) {
    for (const char* name : {"A.b", "A.c", "B.b", ""}) {
      seeds.insert(DeriveSeed(base, name));
    }
  }
  EXPECT_EQ(seeds.size(), 12u);
}

TEST(TestSeedTest, IsTheBaseSeedMixedWithTheTestName) {
  const uint64_t seed = TestSeed();
  EXPECT_EQ(TestSeed(), seed);  // stable within a test
  absl::StatusOr<uint64_t> base = BaseSeed();
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(seed, DeriveSeed(*base,
                             "TestSeedTest.IsTheBaseSeedMixedWithTheTestName"));
}

TEST(TestSeedTest, DiffersBetweenTests) {
  absl::StatusOr<uint64_t> base = BaseSeed();
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_NE(
      TestSeed(),
      DeriveSeed(*base, "TestSeedTest.IsTheBaseSeedMixedWithTheTestName"));
}

TEST(GpuAvailabilityTest, ReasonMatchesTheDeviceCount) {
  const bool usable = BuiltWithCuda() && CudaDeviceCount() > 0;
  EXPECT_EQ(GpuUnavailableReason().empty(), usable) << GpuUnavailableReason();
  const std::vector<Device> devices = TestDevices();
  ASSERT_EQ(devices.size(), usable ? 2u : 1u);
  EXPECT_EQ(devices[0], Device::Cpu());
  if (usable) {
    EXPECT_EQ(devices[1], Device::Cuda(0));
  }
}

TEST(SkipWithoutGpuTest, RunsOnlyWithAGpu) {
  const bool usable = BuiltWithCuda() && CudaDeviceCount() > 0;
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(usable) << "SKIP_WITHOUT_GPU() let the test go on without a GPU";
}

}  // namespace
}  // namespace test
}  // namespace lossrt
