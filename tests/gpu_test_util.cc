// GPU availability, per-test seeds and their LOSSRT_TEST_SEED override.
#include "tests/gpu_test_util.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace lossrt {
namespace test {

std::string GpuUnavailableReason() {
  if (!BuiltWithCuda()) {
    return "built without CUDA (no toolkit was found at build time); GPU part "
           "skipped";
  }
  if (CudaDeviceCount() == 0) {
    return "CudaDeviceCount() == 0 (no GPU or CUDA driver visible); GPU part "
           "skipped";
  }
  return "";
}

std::vector<Device> TestDevices() {
  std::vector<Device> devices = {Device::Cpu()};
  if (GpuUnavailableReason().empty()) devices.push_back(Device::Cuda(0));
  return devices;
}

std::vector<std::pair<Device, DType>> TestRuns(
    DType cpu_dtype, std::initializer_list<DType> gpu_dtypes) {
  std::vector<std::pair<Device, DType>> runs = {{Device::Cpu(), cpu_dtype}};
  const std::string unavailable = GpuUnavailableReason();
  if (!unavailable.empty()) {
    std::printf("no CUDA device: %s; GPU part skipped\n", unavailable.c_str());
    return runs;
  }
  for (DType dtype : gpu_dtypes) runs.push_back({Device::Cuda(0), dtype});
  return runs;
}

absl::StatusOr<uint64_t> ParseSeed(absl::string_view text) {
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  uint64_t seed = 0;
  bool ok = false;
  if (absl::StartsWithIgnoreCase(stripped, "0x")) {
    const absl::string_view digits = stripped.substr(2);
    // SimpleHexAtoi accepts its own "0x" and a sign; the digits alone must be
    // hex.
    ok = !digits.empty() &&
         digits.find_first_not_of("0123456789abcdefABCDEF") ==
             absl::string_view::npos &&
         absl::SimpleHexAtoi(digits, &seed);
  } else {
    ok = !stripped.empty() &&
         stripped.find_first_not_of("0123456789") == absl::string_view::npos &&
         absl::SimpleAtoi(stripped, &seed);
  }
  if (!ok) {
    return InvalidArgument(
        "LOSSRT_TEST_SEED must be a decimal or 0x-hex 64-bit number, got '",
        text, "'");
  }
  return seed;
}

absl::StatusOr<uint64_t> BaseSeed() {
  static const absl::StatusOr<uint64_t>* const base = [] {
    const char* env = std::getenv("LOSSRT_TEST_SEED");
    if (env != nullptr) return new absl::StatusOr<uint64_t>(ParseSeed(env));
    std::random_device device;
    const uint64_t seed = (static_cast<uint64_t>(device()) << 32) ^ device();
    return new absl::StatusOr<uint64_t>(seed);
  }();
  return *base;
}

uint64_t DeriveSeed(uint64_t base, absl::string_view name) {
  uint64_t hash = 0xcbf29ce484222325u;  // FNV-1a
  for (char c : name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3u;
  }
  uint64_t z = base ^ hash;  // SplitMix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

uint64_t TestSeed() {
  const ::testing::TestInfo* info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info == nullptr
          ? std::string("(no test)")
          : absl::StrCat(info->test_suite_name(), ".", info->name());
  absl::StatusOr<uint64_t> base = BaseSeed();
  if (!base.ok()) {
    ADD_FAILURE() << base.status();
    std::random_device device;
    base = (static_cast<uint64_t>(device()) << 32) ^ device();
  }
  const uint64_t seed = DeriveSeed(*base, name);
  std::cout << "[   SEED   ] " << name << ": seed " << seed
            << " (reproduce with LOSSRT_TEST_SEED=" << *base
            << " --gtest_filter=" << name << ")" << std::endl;
  if (info != nullptr) {
    ::testing::Test::RecordProperty("seed", absl::StrCat(seed));
    ::testing::Test::RecordProperty("base_seed", absl::StrCat(*base));
  }
  return seed;
}

}  // namespace test
}  // namespace lossrt
