// The soft cap of the cross-entropy kernels, z = c * tanh(x / c), written once
// for the device and for the host test that bounds its error: the device
// passes the special-function unit's exp2 and reciprocal (ex2.approx,
// rcp.approx: one MUFU op each), the test correctly rounded ones moved by
// those instructions' documented errors. Internal to //loss.
//
//   const float z = ce::SoftCapWith(x, softcap, 1.0f / softcap, exp2, rcp);
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_SOFTCAP_H_
#define LOSSRT_LOSS_CROSS_ENTROPY_SOFTCAP_H_

#include <cmath>

#if defined(__CUDACC__)
#define LOSSRT_SOFTCAP_INLINE __host__ __device__ __forceinline__
#else
#define LOSSRT_SOFTCAP_INLINE inline
#endif

namespace lossrt {
namespace ce {

// Below |x / c| = kSoftCapPolyLimit, tanh(y) = y + y^3 P(y^2), P of degree 4,
// fitted for the least maximum relative error (6.5e-8) on the interval;
// above it, tanh |y| = 1 - 2 / (exp(2 |y|) + 1) (>= 0.66), whose cancellation
// and sensitivity to the exponential's error shrink as |y| grows (a lower
// limit let the exponential form's error reach 2.4 ulps of tanh).
constexpr float kSoftCapPolyLimit = 0.8f;
constexpr float kTanhP0 = -3.333286643e-01f;
constexpr float kTanhP1 = 1.332276613e-01f;
constexpr float kTanhP2 = -5.317631736e-02f;
constexpr float kTanhP3 = 1.919076592e-02f;
constexpr float kTanhP4 = -4.410887603e-03f;
constexpr float kTwoLog2e = 2.8853900817779268f;  // 2 / ln 2

// c * tanh(x * inv_cap), c = softcap > 0, inv_cap = 1 / c, from exp2(a) = 2^a
// and reciprocal(d) = 1 / d (d in [2, inf]). Branch-free: 7 FMA-pipe ops for
// the polynomial, 4 for the exponential form, a select, the two calls (two
// MUFU ops on the device) and the final multiply. Error (the host test
// SoftCapTest.ErrorBoundAndMonotone, with exp2 and reciprocal off by 2 and 1
// ulps): at most 4.1 * 2^-24 absolute in tanh, 2.3 ulps of c for c = 20; 2.2 *
// 2^-24 with correctly rounded ones. NaN gives NaN, +-inf gives +-c (exp2
// overflows to inf, whose reciprocal is 0). Odd in x.
template <typename Exp2, typename Reciprocal>
LOSSRT_SOFTCAP_INLINE float SoftCapWith(float x, float softcap, float inv_cap,
                                        Exp2 exp2, Reciprocal reciprocal) {
  const float y = x * inv_cap;
  const float y2 = y * y;
  const float p =
      std::fma(std::fma(std::fma(std::fma(kTanhP4, y2, kTanhP3), y2, kTanhP2),
                        y2, kTanhP1),
               y2, kTanhP0);
  const float small = std::fma(p * y2, y, y);
  const float a = std::fabs(y);
  const float large = std::copysign(
      std::fma(-2.0f, reciprocal(exp2(a * kTwoLog2e) + 1.0f), 1.0f), y);
  // (NaN fails the test and takes the exponential form, which keeps it.)
  return softcap * (a < kSoftCapPolyLimit ? small : large);
}

}  // namespace ce
}  // namespace lossrt

#undef LOSSRT_SOFTCAP_INLINE

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_SOFTCAP_H_
