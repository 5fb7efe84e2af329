// PROBE_CHECK for the standalone GPU probes' main(): a CUDA or cuBLASLt call
// that fails prints what failed, with its code and line, and main returns 1.
#ifndef LOSSRT_TOOLS_PROBE_CHECK_H_
#define LOSSRT_TOOLS_PROBE_CHECK_H_

#include <cstdio>

#define PROBE_CHECK(call)                                                      \
  do {                                                                         \
    const int probe_result = static_cast<int>(call);                           \
    if (probe_result != 0) {                                                   \
      std::printf("%s failed: %d (line %d)\n", #call, probe_result, __LINE__); \
      return 1;                                                                \
    }                                                                          \
  } while (false)

#endif  // LOSSRT_TOOLS_PROBE_CHECK_H_
