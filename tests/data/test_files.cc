// Scratch files for the data tests.
#include "tests/data/test_files.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lossrt {
namespace test {

namespace fs = std::filesystem;

std::string MakeTempDir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir =
      absl::StrCat(testing::TempDir(), "/", info->test_suite_name(), ".",
                   info->name(), ".", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void WriteFile(const std::string& path, const std::string& contents) {
  fs::create_directories(fs::path(path).parent_path());
  FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(std::fwrite(contents.data(), 1, contents.size(), file),
            contents.size());
  ASSERT_EQ(std::fclose(file), 0);
}

std::string ReadFile(const std::string& path) {
  std::string out;
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return out;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    out.append(buffer, got);
  }
  std::fclose(file);
  return out;
}

}  // namespace test
}  // namespace lossrt
