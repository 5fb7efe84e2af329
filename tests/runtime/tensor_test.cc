// Tests of runtime/tensor.h: sizes and strides (span_bytes), ShapeString,
// CheckShape and CheckDType messages, EmptyTensor, and CopyTensor between
// strided host tensors and, where a GPU is usable, through device memory and
// back.
#include "runtime/tensor.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

constexpr float kSentinel = -12345.0f;

bool Contains(const absl::Status& status, absl::string_view text) {
  return status.message().find(text) != absl::string_view::npos;
}

TEST(TensorTest, SizesOfContiguousAndStridedViews) {
  const Tensor matrix = Tensor::Of(nullptr, DType::kF32, {3, 4}, Device::Cpu());
  EXPECT_EQ(matrix.rank(), 2);
  EXPECT_EQ(matrix.numel(), 12);
  EXPECT_EQ(matrix.row_elements(), 4);
  EXPECT_EQ(matrix.effective_row_stride(), 4);
  EXPECT_TRUE(matrix.is_contiguous());
  EXPECT_EQ(matrix.span_bytes(), 48);

  // Rows 10 floats apart: the last row starts at 20 and holds 4.
  const Tensor strided =
      Tensor::Of(nullptr, DType::kF32, {3, 4}, Device::Cpu(), 10);
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_EQ(strided.effective_row_stride(), 10);
  EXPECT_EQ(strided.span_bytes(), (2 * 10 + 4) * 4);

  const Tensor strided_bf16 =
      Tensor::Of(nullptr, DType::kBF16, {5, 2, 3}, Device::Cpu(), 8);
  EXPECT_EQ(strided_bf16.row_elements(), 6);
  EXPECT_EQ(strided_bf16.span_bytes(), (4 * 8 + 6) * 2);

  const Tensor stride_equal =
      Tensor::Of(nullptr, DType::kI64, {3, 4}, Device::Cpu(), 4);
  EXPECT_TRUE(stride_equal.is_contiguous());
  EXPECT_EQ(stride_equal.span_bytes(), 96);

  const Tensor vector = Tensor::Of(nullptr, DType::kF16, {7}, Device::Cpu());
  EXPECT_EQ(vector.row_elements(), 7);
  EXPECT_EQ(vector.span_bytes(), 14);

  const Tensor scalar = Tensor::Of(nullptr, DType::kF64, {}, Device::Cpu());
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.span_bytes(), 8);

  const Tensor empty =
      Tensor::Of(nullptr, DType::kF32, {0, 4}, Device::Cpu(), 10);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.span_bytes(), 0);
}

TEST(TensorTest, ShapeStringNamesShapeDTypeDeviceAndStride) {
  EXPECT_EQ(Tensor::Of(nullptr, DType::kF32, {16384, 4096}, Device::Cuda(0))
                .ShapeString(),
            "[16384, 4096] f32 cuda:0");
  EXPECT_EQ(Tensor::Of(nullptr, DType::kBF16, {3, 4}, Device::Cpu(), 10)
                .ShapeString(),
            "[3, 4] bf16 cpu row_stride=10");
  EXPECT_EQ(
      Tensor::Of(nullptr, DType::kI32, {3, 4}, Device::Cpu(), 4).ShapeString(),
      "[3, 4] i32 cpu");
  EXPECT_EQ(Tensor::Of(nullptr, DType::kF64, {}, Device::Cpu()).ShapeString(),
            "[] f64 cpu");
}

TEST(CheckShapeTest, AcceptsMatchesAndWildcards) {
  const Tensor logits =
      Tensor::Of(nullptr, DType::kF32, {8, 50257}, Device::Cpu());
  EXPECT_TRUE(CheckShape(logits, {8, 50257}, "logits").ok());
  EXPECT_TRUE(CheckShape(logits, {-1, 50257}, "logits").ok());
  EXPECT_TRUE(CheckShape(logits, {-1, -1}, "logits").ok());
  const std::vector<int64_t> expected = {8, 50257};
  EXPECT_TRUE(CheckShape(logits, absl::MakeConstSpan(expected), "logits").ok());
}

TEST(CheckShapeTest, MessagesNameTheTensorAndBothShapes) {
  std::mt19937_64 rng(test::TestSeed());
  std::uniform_int_distribution<int64_t> dim(1, 100000);
  const int64_t rows = dim(rng), cols = dim(rng);
  const Tensor tensor =
      Tensor::Of(nullptr, DType::kF32, {rows, cols}, Device::Cpu());
  const std::string actual =
      "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";

  const absl::Status wrong_size =
      CheckShape(tensor, {rows, cols + 1}, "targets");
  EXPECT_EQ(wrong_size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(wrong_size, "targets")) << wrong_size;
  EXPECT_TRUE(Contains(wrong_size, "[" + std::to_string(rows) + ", " +
                                       std::to_string(cols + 1) + "]"))
      << wrong_size;
  EXPECT_TRUE(Contains(wrong_size, actual)) << wrong_size;

  const absl::Status wrong_rank =
      CheckShape(tensor, {rows, cols, -1}, "weights");
  EXPECT_EQ(wrong_rank.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(wrong_rank, "weights")) << wrong_rank;
  EXPECT_TRUE(Contains(wrong_rank, "[" + std::to_string(rows) + ", " +
                                       std::to_string(cols) + ", -1]"))
      << wrong_rank;
  EXPECT_TRUE(Contains(wrong_rank, actual)) << wrong_rank;

  const absl::Status too_short = CheckShape(tensor, {rows}, "bias");
  EXPECT_FALSE(too_short.ok());
  EXPECT_TRUE(Contains(too_short, actual)) << too_short;
}

TEST(CheckDTypeTest, NamesAllowedAndActualTypes) {
  const Tensor tensor = Tensor::Of(nullptr, DType::kF16, {2}, Device::Cpu());
  EXPECT_TRUE(CheckDType(tensor, {DType::kF32, DType::kF16}, "x").ok());
  const absl::Status status =
      CheckDType(tensor, {DType::kF32, DType::kBF16}, "logits");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "logits: dtype must be f32 or bf16, got f16");
}

TEST(EmptyTensorTest, AllocatesAContiguousTensor) {
  Allocator allocator(Device::Cpu());
  absl::StatusOr<OwnedTensor> owned =
      EmptyTensor(allocator, DType::kBF16, {3, 5, 7});
  ASSERT_TRUE(owned.ok()) << owned.status();
  EXPECT_NE(owned->view.data, nullptr);
  EXPECT_EQ(owned->view.data, owned->buffer.data());
  EXPECT_EQ(owned->buffer.bytes(), 3 * 5 * 7 * 2);
  EXPECT_EQ(owned->view.dtype, DType::kBF16);
  EXPECT_EQ(owned->view.shape, (Shape{3, 5, 7}));
  EXPECT_TRUE(owned->view.is_contiguous());
  EXPECT_EQ(owned->view.device, Device::Cpu());

  absl::StatusOr<OwnedTensor> empty =
      EmptyTensor(allocator, DType::kF32, {0, 5});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->view.numel(), 0);

  absl::StatusOr<OwnedTensor> negative =
      EmptyTensor(allocator, DType::kF32, {4, -2});
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(negative.status(), "[4, -2]")) << negative.status();
}

// Host memory laid out as `rows` rows of `cols` floats, `stride` apart, padding
// = sentinel.
struct HostMatrix {
  HostMatrix(int64_t rows, int64_t cols, int64_t stride)
      : values((rows - 1) * stride + cols + 3, kSentinel),
        view(Tensor::Of(values.data(), DType::kF32, {rows, cols}, Device::Cpu(),
                        stride)) {}
  float at(int64_t r, int64_t c) const {
    return values[r * view.effective_row_stride() + c];
  }

  std::vector<float> values;
  Tensor view;
};

class CopyTensorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rng_.seed(test::TestSeed());
    absl::StatusOr<std::unique_ptr<Context>> context =
        Context::Create(Device::Cpu());
    ASSERT_TRUE(context.ok()) << context.status();
    cpu_ = *std::move(context);
  }

  void FillRandom(HostMatrix& matrix) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (int64_t r = 0; r < matrix.view.dim(0); ++r) {
      for (int64_t c = 0; c < matrix.view.dim(1); ++c) {
        matrix.values[r * matrix.view.effective_row_stride() + c] = value(rng_);
      }
    }
  }

  // Every element of `dst` equals `src`'s and every padding float is still the
  // sentinel.
  static void ExpectSameElementsAndUntouchedPadding(const HostMatrix& src,
                                                    const HostMatrix& dst) {
    const int64_t rows = dst.view.dim(0), cols = dst.view.dim(1);
    const int64_t stride = dst.view.effective_row_stride();
    for (int64_t i = 0; i < static_cast<int64_t>(dst.values.size()); ++i) {
      const int64_t r = i / stride, c = i % stride;
      if (r < rows && c < cols) {
        ASSERT_EQ(dst.values[i], src.at(r, c)) << "row " << r << " col " << c;
      } else {
        ASSERT_EQ(dst.values[i], kSentinel)
            << "padding at " << i << " was written";
      }
    }
  }

  std::mt19937_64 rng_;
  std::unique_ptr<Context> cpu_;
};

TEST_F(CopyTensorTest, HostToHostWithStridesOnEitherSide) {
  std::uniform_int_distribution<int64_t> dim(1, 40), pad(0, 9);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t rows = dim(rng_), cols = dim(rng_);
    HostMatrix src(rows, cols, cols + pad(rng_));
    HostMatrix dst(rows, cols, cols + pad(rng_));
    FillRandom(src);
    ASSERT_TRUE(CopyTensor(src.view, dst.view, *cpu_).ok());
    ExpectSameElementsAndUntouchedPadding(src, dst);
  }
}

TEST_F(CopyTensorTest, HostToHostVectorsAndHigherRanks) {
  std::vector<int32_t> src(24), dst(24, -1);
  std::uniform_int_distribution<int32_t> value;
  for (int32_t& v : src) v = value(rng_);
  const Tensor a = Tensor::Of(src.data(), DType::kI32, {24}, Device::Cpu());
  const Tensor b = Tensor::Of(dst.data(), DType::kI32, {24}, Device::Cpu());
  ASSERT_TRUE(CopyTensor(a, b, *cpu_).ok());
  EXPECT_EQ(dst, src);

  // [2, 3, 4] with rows of 12 elements 16 apart on the source side.
  std::vector<double> strided(16 + 12), packed(24, 0.0);
  for (double& v : strided) v = static_cast<double>(value(rng_));
  const Tensor s =
      Tensor::Of(strided.data(), DType::kF64, {2, 3, 4}, Device::Cpu(), 16);
  const Tensor p =
      Tensor::Of(packed.data(), DType::kF64, {2, 3, 4}, Device::Cpu());
  ASSERT_TRUE(CopyTensor(s, p, *cpu_).ok());
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(packed[i], strided[i]);
    EXPECT_EQ(packed[12 + i], strided[16 + i]);
  }
}

TEST_F(CopyTensorTest, RejectsMismatchesWithoutWriting) {
  HostMatrix src(4, 6, 6), dst(4, 6, 6);
  FillRandom(src);
  Tensor other_dtype = dst.view;
  other_dtype.dtype = DType::kI32;
  const absl::Status dtype = CopyTensor(src.view, other_dtype, *cpu_);
  EXPECT_EQ(dtype.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(dtype, "f32")) << dtype;
  EXPECT_TRUE(Contains(dtype, "i32")) << dtype;

  Tensor other_shape = dst.view;
  other_shape.shape = {6, 4};
  const absl::Status shape = CopyTensor(src.view, other_shape, *cpu_);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(shape, "[4, 6]")) << shape;
  EXPECT_TRUE(Contains(shape, "[6, 4]")) << shape;

  Tensor null_dst = dst.view;
  null_dst.data = nullptr;
  EXPECT_EQ(CopyTensor(src.view, null_dst, *cpu_).code(),
            absl::StatusCode::kInvalidArgument);
  for (float v : dst.values) ASSERT_EQ(v, kSentinel);

  // Nothing to copy: fine even without memory.
  const Tensor empty = Tensor::Of(nullptr, DType::kF32, {0, 6}, Device::Cpu());
  EXPECT_TRUE(CopyTensor(empty, empty, *cpu_).ok());
}

TEST_F(CopyTensorTest, DeviceTensorsNeedAGpuContext) {
  HostMatrix src(2, 3, 3);
  Tensor device_dst = src.view;
  device_dst.device = Device::Cuda(0);
  device_dst.data =
      reinterpret_cast<void*>(uintptr_t{1} << 40);  // never dereferenced
  const absl::Status status = CopyTensor(src.view, device_dst, *cpu_);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.code(), absl::StatusCode::kInternal) << status;
}

TEST_F(CopyTensorTest, HostDeviceRoundTrip) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<Context>> gpu =
      Context::Create(Device::Cuda(0));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::uniform_int_distribution<int64_t> dim(1, 300), pad(0, 17);
  for (int trial = 0; trial < 10; ++trial) {
    const int64_t rows = dim(rng_), cols = dim(rng_);
    HostMatrix src(rows, cols, cols + pad(rng_));
    HostMatrix back(rows, cols, cols + pad(rng_));
    FillRandom(src);
    // Device side: a strided view into a larger buffer, then a contiguous one.
    const int64_t device_stride = cols + pad(rng_);
    absl::StatusOr<Buffer> strided =
        (*gpu)->allocator().Allocate(((rows - 1) * device_stride + cols) *
                                     static_cast<int64_t>(sizeof(float)));
    ASSERT_TRUE(strided.ok()) << strided.status();
    const Tensor on_device =
        Tensor::Of(strided->data(), DType::kF32, {rows, cols}, Device::Cuda(0),
                   device_stride);
    absl::StatusOr<OwnedTensor> packed =
        EmptyTensor((*gpu)->allocator(), DType::kF32, {rows, cols});
    ASSERT_TRUE(packed.ok()) << packed.status();

    absl::Status status = CopyTensor(src.view, on_device, **gpu);
    ASSERT_TRUE(status.ok()) << status;
    status = CopyTensor(on_device, packed->view, **gpu);
    ASSERT_TRUE(status.ok()) << status;
    status = CopyTensor(packed->view, back.view, **gpu);
    ASSERT_TRUE(status.ok()) << status;
    ExpectSameElementsAndUntouchedPadding(src, back);
  }
}

TEST_F(CopyTensorTest, DeviceTensorOnAnotherDeviceIsRejected) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<Context>> gpu =
      Context::Create(Device::Cuda(0));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  HostMatrix src(2, 3, 3);
  Tensor elsewhere = src.view;
  elsewhere.device = Device::Cuda(CudaDeviceCount());  // no such device
  const absl::Status status = CopyTensor(src.view, elsewhere, **gpu);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Contains(status, elsewhere.device.ToString())) << status;
}

}  // namespace
}  // namespace lossrt
