// Helpers of the fuzz targets: FUZZ_CHECK, which stops the process (a finding
// for libFuzzer, a failure for the corpus tests) when an invariant breaks, and
// scratch files for the targets whose API reads files.
//
//   FUZZ_CHECK(tokens.size() == count);
//   FUZZ_CHECK_OK(WriteTokenShard(path, tokens));
//   const std::string path = lossrt::fuzz::ScratchPath("shard.bin");
#ifndef LOSSRT_FUZZ_FUZZ_UTIL_H_
#define LOSSRT_FUZZ_FUZZ_UTIL_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

// Aborts with the condition and its place when `condition` is false.
#define FUZZ_CHECK(condition)                                          \
  do {                                                                 \
    if (!(condition)) {                                                \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, \
                   __LINE__, #condition);                              \
      std::abort();                                                    \
    }                                                                  \
  } while (false)

// Aborts with the status when it is not OK.
#define FUZZ_CHECK_OK(expr)                                                   \
  do {                                                                        \
    const absl::Status lossrt_fuzz_status = (expr);                           \
    if (!lossrt_fuzz_status.ok()) {                                           \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK_OK failed: %s: %s\n", __FILE__, \
                   __LINE__, #expr, lossrt_fuzz_status.ToString().c_str());   \
      std::abort();                                                           \
    }                                                                         \
  } while (false)

namespace lossrt {
namespace fuzz {

// A path named `name` in a folder private to this process, made on first use
// under $TMPDIR (or /tmp) and removed when the process exits normally.
std::string ScratchPath(absl::string_view name);

// Writes `bytes` to `path` (created or truncated); aborts on failure, which
// is a problem of the machine, not a finding.
void WriteScratchFile(const std::string& path, absl::string_view bytes);

// The bytes of `path`; aborts when it cannot be read.
std::string ReadScratchFile(const std::string& path);

}  // namespace fuzz
}  // namespace lossrt

#endif  // LOSSRT_FUZZ_FUZZ_UTIL_H_
