// Scratch files for the data tests: a fresh folder per test, and whole-file
// writes (gtest assertions on failure) and reads.
#ifndef LOSSRT_TESTS_DATA_TEST_FILES_H_
#define LOSSRT_TESTS_DATA_TEST_FILES_H_

#include <string>

namespace lossrt {
namespace test {

// An empty folder named after the running test (under the test's temp dir).
std::string MakeTempDir();

// Writes `contents` to `path`, creating its folder (fails the test on error).
void WriteFile(const std::string& path, const std::string& contents);

// The bytes of `path` ("" when it cannot be read).
std::string ReadFile(const std::string& path);

}  // namespace test
}  // namespace lossrt

#endif  // LOSSRT_TESTS_DATA_TEST_FILES_H_
