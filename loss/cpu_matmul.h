// Row-major fp32 matrix products of the loss module's CPU backends (the linear
// cross-entropy and its vocabulary-parallel twin), compiled once: Eigen's
// GEMM kernels cost seconds of compile time in every file that instantiates
// them. Internal to //loss.
#ifndef LOSSRT_LOSS_CPU_MATMUL_H_
#define LOSSRT_LOSS_CPU_MATMUL_H_

#include <cstdint>

namespace lossrt {
namespace cpu_matmul {

// A row-major fp32 matrix [rows, cols] whose rows are `ld` floats apart.
struct ConstMatrix {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
};
struct Matrix {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
};

// The views of an Eigen matrix, map or ref of row-major floats (anything with
// data(), rows(), cols() and outerStride()).
template <typename M>
ConstMatrix ConstViewOf(const M& m) {
  return {m.data(), m.rows(), m.cols(), m.outerStride()};
}
template <typename M>
Matrix ViewOf(M& m) {
  return {m.data(), m.rows(), m.cols(), m.outerStride()};
}

// out = alpha * a * b^T: a [m, k], b [n, k], out [m, n].
void MultiplyABt(float alpha, const ConstMatrix& a, const ConstMatrix& b,
                 const Matrix& out);
// out = alpha * a * b: a [m, k], b [k, n], out [m, n].
void MultiplyAB(float alpha, const ConstMatrix& a, const ConstMatrix& b,
                const Matrix& out);
// out = alpha * a^T * b: a [k, m], b [k, n], out [m, n].
void MultiplyAtB(float alpha, const ConstMatrix& a, const ConstMatrix& b,
                 const Matrix& out);

}  // namespace cpu_matmul
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CPU_MATMUL_H_
