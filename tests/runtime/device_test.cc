// Tests of runtime/device.h: ParseDevice and ToString, device equality,
// DefaultDevice (the CPU when no GPU is usable) and GetDeviceInfo for the CPU,
// for missing GPUs and, where one is present, for a real GPU.
#include "runtime/device.h"

#include <random>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

TEST(DeviceTest, ToStringNamesKindAndOrdinal) {
  EXPECT_EQ(Device::Cpu().ToString(), "cpu");
  EXPECT_EQ(Device::Cuda().ToString(), "cuda:0");
  EXPECT_EQ(Device::Cuda(7).ToString(), "cuda:7");
}

TEST(DeviceTest, Equality) {
  EXPECT_EQ(Device::Cpu(), Device::Cpu());
  EXPECT_EQ(Device::Cpu(),
            (Device{DeviceKind::kCpu, 3}));  // the CPU has no ordinal
  EXPECT_EQ(Device::Cuda(2), Device::Cuda(2));
  EXPECT_NE(Device::Cuda(1), Device::Cuda(2));
  EXPECT_NE(Device::Cpu(), Device::Cuda(0));
  EXPECT_TRUE(Device::Cpu().is_cpu());
  EXPECT_FALSE(Device::Cpu().is_cuda());
  EXPECT_TRUE(Device::Cuda(1).is_cuda());
}

TEST(ParseDeviceTest, AcceptsTheDocumentedForms) {
  absl::StatusOr<Device> cpu = ParseDevice("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(*cpu, Device::Cpu());

  absl::StatusOr<Device> cuda = ParseDevice("cuda");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(*cuda, Device::Cuda(0));

  absl::StatusOr<Device> cuda3 = ParseDevice("cuda:3");
  ASSERT_TRUE(cuda3.ok()) << cuda3.status();
  EXPECT_TRUE(cuda3->is_cuda());
  EXPECT_EQ(cuda3->ordinal, 3);

  absl::StatusOr<Device> automatic = ParseDevice("auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(*automatic, DefaultDevice());
}

TEST(ParseDeviceTest, RoundTripsToStringForRandomOrdinals) {
  std::mt19937 rng(static_cast<uint32_t>(test::TestSeed()));
  std::uniform_int_distribution<int> ordinal(0, 1 << 30);
  for (int i = 0; i < 100; ++i) {
    const Device device = Device::Cuda(ordinal(rng));
    absl::StatusOr<Device> parsed = ParseDevice(device.ToString());
    ASSERT_TRUE(parsed.ok()) << device.ToString() << ": " << parsed.status();
    EXPECT_EQ(*parsed, device);
    EXPECT_EQ(parsed->ordinal, device.ordinal);
  }
}

TEST(ParseDeviceTest, RejectsOtherTextAndQuotesIt) {
  for (const char* text :
       {"", "gpu", "CPU", "Cuda", "cuda:", "cuda:-1", "cuda:x", "cuda:1x",
        "cuda:1.5", "cuda0", "cpu:0", "cuda:99999999999"}) {
    absl::StatusOr<Device> device = ParseDevice(text);
    ASSERT_FALSE(device.ok())
        << "'" << text << "' parsed as " << device->ToString();
    EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
    // The message quotes the whole input, not what is left after a prefix.
    EXPECT_NE(device.status().message().find(std::string("'") + text + "'"),
              absl::string_view::npos)
        << device.status();
  }
}

TEST(DeviceTest, NoGpuWithoutCuda) {
  if (!BuiltWithCuda()) {
    EXPECT_EQ(CudaDeviceCount(), 0);
  }
  EXPECT_GE(CudaDeviceCount(), 0);
}

TEST(DeviceTest, DefaultDeviceIsTheFirstGpuElseTheCpu) {
  if (CudaDeviceCount() == 0) {
    EXPECT_EQ(DefaultDevice(), Device::Cpu());
  } else {
    EXPECT_EQ(DefaultDevice(), Device::Cuda(0));
  }
}

TEST(DeviceInfoTest, CpuHasANameAndItsThreadCount) {
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo(Device::Cpu());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name, "cpu");
  EXPECT_EQ(info->sm_count,
            static_cast<int>(std::thread::hardware_concurrency()));
}

TEST(DeviceInfoTest, MissingGpusAreUnavailable) {
  for (const Device& device :
       {Device::Cuda(CudaDeviceCount()), Device::Cuda(-1)}) {
    absl::StatusOr<DeviceInfo> info = GetDeviceInfo(device);
    ASSERT_FALSE(info.ok()) << device.ToString();
    EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(info.status().message().find(device.ToString()),
              absl::string_view::npos)
        << info.status();
  }
}

TEST(DeviceInfoTest, PeakBandwidthIsDoubleDataRateTimesBusWidth) {
  DeviceInfo info;
  info.memory_clock_khz = 2619000;
  info.memory_bus_width_bits = 5120;
  EXPECT_DOUBLE_EQ(info.PeakMemoryBandwidthBytesPerSecond(),
                   2.0 * 2.619e9 * 640);
  info.memory_bus_width_bits = 0;
  EXPECT_EQ(info.PeakMemoryBandwidthBytesPerSecond(), 0.0);
}

TEST(DeviceInfoTest, GpuReportsItsProperties) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo(Device::Cuda(0));
  ASSERT_TRUE(info.ok()) << info.status();
  std::cout << "cuda:0: " << info->name << ", " << info->sm_count << " SMs, sm_"
            << info->compute_capability_major << info->compute_capability_minor
            << ", " << info->total_memory_bytes / (1 << 20) << " MiB, "
            << info->PeakMemoryBandwidthBytesPerSecond() / 1e12
            << " TB/s peak\n";
  EXPECT_FALSE(info->name.empty());
  EXPECT_GT(info->sm_count, 0);
  EXPECT_GT(info->total_memory_bytes, int64_t{1} << 30);
  EXPECT_GE(info->compute_capability_major, 7);
  EXPECT_GT(info->l2_cache_bytes, 0);
  EXPECT_GT(info->shared_memory_per_block_optin, 48 << 10);
  EXPECT_GT(info->PeakMemoryBandwidthBytesPerSecond(), 1e11);
}

}  // namespace
}  // namespace lossrt
