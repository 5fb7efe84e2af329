// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"),
// a counter-based generator: the value of element i for a seed is a pure
// function of (seed, i), so the CPU and the GPU produce the same bits.
// Header-only, usable from host and device code.
#ifndef LOSSRT_RUNTIME_PHILOX_H_
#define LOSSRT_RUNTIME_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define LOSSRT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOSSRT_HOST_DEVICE inline
#endif

namespace lossrt {

struct Philox4 {
  uint32_t v[4];
};

LOSSRT_HOST_DEVICE void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi,
                                uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Four random words for counter `index` under key `seed`.
LOSSRT_HOST_DEVICE Philox4 Philox4x32(uint64_t index, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(index),
           c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = 0x9e3779b9u, c3 = 0x243f6a88u;  // fixed upper counter words
  uint32_t k0 = static_cast<uint32_t>(seed),
           k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(0xD2511F53u, c0, &hi0, &lo0);
    MulHiLo(0xCD9E8D57u, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// A number in (0, 1) from 24 random bits: (k + 0.5) / 2^24 for the top 24 bits
// k. In double, where it is exact (float cannot hold k + 0.5 once k >= 2^23,
// and rounded the largest draw to 1), so identical on host and device.
LOSSRT_HOST_DEVICE double UniformFromBits(uint32_t bits) {
  return (static_cast<double>(bits >> 8) + 0.5) * (1.0 / 16777216.0);
}

// An integer in [0, n) from 32 random bits (multiply-shift; bias below 2^-32 *
// n).
LOSSRT_HOST_DEVICE int64_t IntFromBits(uint32_t bits, uint64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(bits) * n) >> 32);
}

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_PHILOX_H_
