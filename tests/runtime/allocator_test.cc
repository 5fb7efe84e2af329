// Tests of runtime/allocator.h: Buffer ownership and the caching Allocator
// (256-byte alignment, size classes, cache reuse, current/peak/cached counters,
// zero and negative sizes) on the host, and the same on a GPU where one is
// usable.
#include "runtime/allocator.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/device.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

bool IsAligned(const void* data, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(data) % alignment == 0;
}

// The host suite and the device suite share these checks through the device
// parameter.
class AllocatorTest : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::kCuda) {
      SKIP_WITHOUT_GPU();
      device_ = Device::Cuda(0);
    }
    rng_.seed(test::TestSeed());
  }

  Device device_ = Device::Cpu();
  std::mt19937_64 rng_;
};

TEST_P(AllocatorTest, BuffersAreAlignedAndSized) {
  Allocator allocator(device_);
  std::uniform_int_distribution<int64_t> size(1, 3 * kMiB);
  std::vector<Buffer> buffers;
  std::set<void*> pointers;
  for (int i = 0; i < 40; ++i) {
    const int64_t bytes = i < 4 ? int64_t{1} << (4 * i) : size(rng_);
    absl::StatusOr<Buffer> buffer = allocator.Allocate(bytes);
    ASSERT_TRUE(buffer.ok()) << bytes << ": " << buffer.status();
    ASSERT_NE(buffer->data(), nullptr);
    EXPECT_TRUE(IsAligned(buffer->data(), 256)) << buffer->data();
    EXPECT_EQ(buffer->bytes(), bytes);
    EXPECT_EQ(buffer->device(), device_);
    EXPECT_TRUE(pointers.insert(buffer->data()).second) << "handed out twice";
    if (device_.is_cpu())
      std::memset(buffer->data(), 0xab, bytes);  // all of it is ours
    buffers.push_back(*std::move(buffer));
  }
}

TEST_P(AllocatorTest, CountsCurrentAndPeakBytesInBlocks) {
  Allocator allocator(device_);
  EXPECT_EQ(allocator.current_bytes(), 0);
  EXPECT_EQ(allocator.peak_bytes(), 0);
  // Small requests round up to 256 B, requests of 1 MiB and more to 2 MiB.
  const int64_t small = std::uniform_int_distribution<int64_t>(1, 256)(rng_);
  absl::StatusOr<Buffer> a = allocator.Allocate(small);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(allocator.current_bytes(), 256);
  absl::StatusOr<Buffer> b = allocator.Allocate(257);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(allocator.current_bytes(), 256 + 512);
  absl::StatusOr<Buffer> c = allocator.Allocate(kMiB + 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(allocator.current_bytes(), 768 + 2 * kMiB);
  EXPECT_EQ(allocator.peak_bytes(), 768 + 2 * kMiB);

  c->Reset();
  EXPECT_EQ(c->data(), nullptr);
  EXPECT_EQ(c->bytes(), 0);
  EXPECT_EQ(allocator.current_bytes(), 768);
  EXPECT_EQ(allocator.peak_bytes(), 768 + 2 * kMiB);  // the peak stays
  EXPECT_EQ(allocator.cached_bytes(), 2 * kMiB);
  allocator.ResetPeak();
  EXPECT_EQ(allocator.peak_bytes(), 768);

  *a = Buffer();  // move-assigning over a buffer gives its memory back
  EXPECT_EQ(allocator.current_bytes(), 512);
  EXPECT_EQ(allocator.cached_bytes(), 2 * kMiB + 256);
  allocator.ReleaseCache();
  EXPECT_EQ(allocator.cached_bytes(), 0);
  EXPECT_EQ(allocator.current_bytes(), 512);
  b->Reset();
  EXPECT_EQ(allocator.current_bytes(), 0);
  EXPECT_EQ(allocator.peak_bytes(), 768);
}

TEST_P(AllocatorTest, ReusesCachedBlocksUpToTwiceTheRequest) {
  Allocator allocator(device_);
  const int64_t bytes =
      std::uniform_int_distribution<int64_t>(4097, 8192)(rng_);
  absl::StatusOr<Buffer> first = allocator.Allocate(bytes);
  ASSERT_TRUE(first.ok()) << first.status();
  void* const block = first->data();
  first->Reset();
  EXPECT_EQ(allocator.cached_bytes(), (bytes + 255) / 256 * 256);

  // Same size: the cached block comes back and leaves the cache.
  absl::StatusOr<Buffer> again = allocator.Allocate(bytes);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data(), block);
  EXPECT_EQ(again->bytes(), bytes);
  EXPECT_EQ(allocator.cached_bytes(), 0);
  again->Reset();

  // Less than half the block: a fresh block, the big one stays cached.
  absl::StatusOr<Buffer> tiny = allocator.Allocate(256);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_NE(tiny->data(), block);
  EXPECT_GT(allocator.cached_bytes(), 0);

  // At least half of it (and less than it): the cached block.
  absl::StatusOr<Buffer> half = allocator.Allocate((bytes + 1) / 2 + 256);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ(half->data(), block);

  // More than the block: never the smaller cached block.
  half->Reset();
  absl::StatusOr<Buffer> bigger = allocator.Allocate(bytes + 256);
  ASSERT_TRUE(bigger.ok()) << bigger.status();
  EXPECT_NE(bigger->data(), block);
}

TEST_P(AllocatorTest, ZeroBytesGivesAnEmptyBuffer) {
  Allocator allocator(device_);
  absl::StatusOr<Buffer> empty = allocator.Allocate(0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->bytes(), 0);
  EXPECT_EQ(empty->device(), device_);
  EXPECT_EQ(allocator.current_bytes(), 0);
  EXPECT_EQ(allocator.peak_bytes(), 0);
  empty->Reset();
  EXPECT_EQ(allocator.cached_bytes(), 0);
}

TEST_P(AllocatorTest, NegativeBytesIsInvalid) {
  Allocator allocator(device_);
  const int64_t bytes =
      -std::uniform_int_distribution<int64_t>(1, 1 << 30)(rng_);
  absl::StatusOr<Buffer> buffer = allocator.Allocate(bytes);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(buffer.status().message().find(std::to_string(bytes)),
            absl::string_view::npos)
      << buffer.status();
}

TEST_P(AllocatorTest, MovingABufferMovesOwnership) {
  Allocator allocator(device_);
  absl::StatusOr<Buffer> source = allocator.Allocate(1000);
  ASSERT_TRUE(source.ok()) << source.status();
  void* const data = source->data();
  Buffer moved(*std::move(source));
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(moved.bytes(), 1000);
  EXPECT_EQ(moved.data_as<float>(), static_cast<float*>(data));
  EXPECT_EQ(source->data(),
            nullptr);             // NOLINT(bugprone-use-after-move): on purpose
  EXPECT_EQ(source->bytes(), 0);  // NOLINT(bugprone-use-after-move)
  source->Reset();  // NOLINT(bugprone-use-after-move): a no-op now
  EXPECT_EQ(allocator.current_bytes(), 1024);

  Buffer target;
  target = std::move(moved);
  EXPECT_EQ(target.data(), data);
  EXPECT_EQ(allocator.current_bytes(), 1024);
  { Buffer scoped = std::move(target); }
  EXPECT_EQ(allocator.current_bytes(), 0);
  EXPECT_EQ(allocator.cached_bytes(), 1024);
}

INSTANTIATE_TEST_SUITE_P(Devices, AllocatorTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         [](const ::testing::TestParamInfo<DeviceKind>& info) {
                           return info.param == DeviceKind::kCpu ? "Host"
                                                                 : "Cuda";
                         });

TEST(AllocatorWithoutGpuTest, DeviceAllocationFailsCleanly) {
  if (BuiltWithCuda() && CudaDeviceCount() > 0) {
    GTEST_SKIP()
        << "a GPU is present; this checks the failure path without one";
  }
  Allocator allocator(Device::Cuda(0));
  absl::StatusOr<Buffer> buffer = allocator.Allocate(1024);
  ASSERT_FALSE(buffer.ok());
  if (!BuiltWithCuda()) {
    EXPECT_EQ(buffer.status().code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(allocator.current_bytes(), 0);
  EXPECT_EQ(allocator.peak_bytes(), 0);
}

}  // namespace
}  // namespace lossrt
