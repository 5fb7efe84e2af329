// Helpers shared by the GPU-aware test suites: SKIP_WITHOUT_GPU() ends a test
// as skipped (saying why) where no CUDA device can be used, and TestSeed()
// gives every test a fresh random seed, printed with the test, so that a
// failure can be rerun with the same numbers.
//
//   TEST(RandomTest, CpuMatchesGpu) {
//     SKIP_WITHOUT_GPU();
//     const uint64_t seed = lossrt::test::TestSeed();
//     ...
//   }
//
// LOSSRT_TEST_SEED=<n> (decimal or 0x-hex) fixes the base seed of a run; each
// test's seed is that base mixed with the test's full name, so one base seed
// reproduces every test.
#ifndef LOSSRT_TESTS_GPU_TEST_UTIL_H_
#define LOSSRT_TESTS_GPU_TEST_UTIL_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace lossrt {
namespace test {

// Why GPU tests cannot run in this process ("built without CUDA", "no GPU or
// driver visible"), or "" when a CUDA device is usable.
std::string GpuUnavailableReason();

// The devices a test can run on: the CPU, then cuda:0 when a GPU is usable.
std::vector<Device> TestDevices();

// The (device, dtype) runs of a test: the CPU in `cpu_dtype`, then cuda:0 in
// each of `gpu_dtypes` when a GPU is usable; otherwise it prints why the GPU
// part is skipped.
std::vector<std::pair<Device, DType>> TestRuns(
    DType cpu_dtype, std::initializer_list<DType> gpu_dtypes);

// The syntax of LOSSRT_TEST_SEED: a decimal or 0x-prefixed hexadecimal 64-bit
// number.
absl::StatusOr<uint64_t> ParseSeed(absl::string_view text);

// The run's base seed: LOSSRT_TEST_SEED when set, else one draw from
// std::random_device (made once per process). An error when LOSSRT_TEST_SEED is
// malformed.
absl::StatusOr<uint64_t> BaseSeed();

// Mixes `base` with `name` (SplitMix64 over an FNV-1a hash): the seed a test
// named `name` gets from the base seed `base`.
uint64_t DeriveSeed(uint64_t base, absl::string_view name);

// The seed of the running test: DeriveSeed(BaseSeed(), "Suite.Name"). Prints it
// with the command that reproduces it and records it as the test property
// "seed". A malformed LOSSRT_TEST_SEED fails the test (it goes on with a random
// seed).
uint64_t TestSeed();

}  // namespace test
}  // namespace lossrt

// Ends the calling test (or SetUp) as skipped when no CUDA device is usable.
// Use it in the test body itself: like GTEST_SKIP(), it returns only from the
// function it is written in.
#define SKIP_WITHOUT_GPU()                                          \
  do {                                                              \
    const std::string lossrt_gpu_unavailable =                      \
        ::lossrt::test::GpuUnavailableReason();                     \
    if (!lossrt_gpu_unavailable.empty()) {                          \
      GTEST_SKIP() << "no CUDA device: " << lossrt_gpu_unavailable; \
    }                                                               \
  } while (false)

#endif  // LOSSRT_TESTS_GPU_TEST_UTIL_H_
