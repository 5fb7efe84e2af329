// Scratch files of the fuzz targets.
#include "fuzz/fuzz_util.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace lossrt {
namespace fuzz {
namespace {

// libFuzzer calls the targets with the input only, so the folder lives in a
// function-local static: one per process, removed at exit.
const std::string& ScratchFolder() {
  static const std::string* const folder = [] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(base != nullptr && base[0] != '\0' ? base : "/tmp",
                     "/lossrt_fuzz.XXXXXX");
    if (::mkdtemp(&pattern[0]) == nullptr) {
      std::perror(pattern.c_str());
      std::abort();
    }
    auto* made = new std::string(pattern);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(ScratchFolder(), ignored);
    });
    return made;
  }();
  return *folder;
}

}  // namespace

std::string ScratchPath(absl::string_view name) {
  return absl::StrCat(ScratchFolder(), "/", name);
}

void WriteScratchFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::perror(path.c_str());
    std::abort();
  }
}

std::string ReadScratchFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::perror(path.c_str());
    std::abort();
  }
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

}  // namespace fuzz
}  // namespace lossrt
