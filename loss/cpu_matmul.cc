// Row-major fp32 matrix products of the CPU backends (loss/cpu_matmul.h), on
// Eigen.
#include "loss/cpu_matmul.h"

#include <Eigen/Core>

namespace lossrt {
namespace cpu_matmul {
namespace {

using RowMajor =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;
using ConstMap = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;

ConstMap MapOf(const ConstMatrix& m) {
  return ConstMap(m.data, m.rows, m.cols, Eigen::OuterStride<>(m.ld));
}
Map MapOf(const Matrix& m) {
  return Map(m.data, m.rows, m.cols, Eigen::OuterStride<>(m.ld));
}

}  // namespace

void MultiplyABt(float alpha, const ConstMatrix& a, const ConstMatrix& b,
                 const Matrix& out) {
  MapOf(out).noalias() = alpha * (MapOf(a) * MapOf(b).transpose());
}

void MultiplyAB(float alpha, const ConstMatrix& a, const ConstMatrix& b,
                const Matrix& out) {
  MapOf(out).noalias() = alpha * (MapOf(a) * MapOf(b));
}

void MultiplyAtB(float alpha, const ConstMatrix& a, const ConstMatrix& b,
                 const Matrix& out) {
  MapOf(out).noalias() = alpha * (MapOf(a).transpose() * MapOf(b));
}

}  // namespace cpu_matmul
}  // namespace lossrt
