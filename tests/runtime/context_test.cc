// Tests of runtime/context.h: a CPU context (no stream or handles, a growing
// host workspace), creation errors for missing GPUs, a GPU context's lazily
// created stream, cuBLAS handles and workspaces where a GPU is usable, two
// contexts side by side, and other libraries' resources kept by a context.
#include "runtime/context.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/random.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

bool IsAligned(const void* data) {
  return reinterpret_cast<uintptr_t>(data) % 256 == 0;
}

std::unique_ptr<Context> MakeContext(Device device) {
  absl::StatusOr<std::unique_ptr<Context>> context = Context::Create(device);
  EXPECT_TRUE(context.ok()) << device.ToString() << ": " << context.status();
  return context.ok() ? *std::move(context) : nullptr;
}

TEST(CpuContextTest, HasNoStreamOrHandles) {
  std::unique_ptr<Context> context = MakeContext(Device::Cpu());
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->device(), Device::Cpu());
  EXPECT_EQ(context->allocator().device(), Device::Cpu());
  for (const absl::Status& status :
       {context->stream().status(), context->cublas_handle().status(),
        context->cublaslt_handle().status(),
        context->cublaslt_workspace().status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("cpu"), absl::string_view::npos) << status;
  }
  EXPECT_TRUE(context->Synchronize().ok());
  EXPECT_EQ(context->allocator().current_bytes(),
            0);  // nothing was allocated for them
}

TEST(CpuContextTest, WorkspaceGrowsOnlyWhenNeeded) {
  std::unique_ptr<Context> context = MakeContext(Device::Cpu());
  ASSERT_NE(context, nullptr);
  std::mt19937_64 rng(test::TestSeed());
  const int64_t first =
      std::uniform_int_distribution<int64_t>(1000, 100000)(rng);
  EXPECT_EQ(context->workspace_bytes(), 0);

  absl::StatusOr<void*> a = context->Workspace(first);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(*a, nullptr);
  EXPECT_TRUE(IsAligned(*a));
  EXPECT_EQ(context->workspace_bytes(), first);
  static_cast<char*>(*a)[first - 1] = 1;  // all of it is usable

  absl::StatusOr<void*> smaller = context->Workspace(first / 2);
  ASSERT_TRUE(smaller.ok()) << smaller.status();
  EXPECT_EQ(*smaller, *a);  // no growth
  EXPECT_EQ(context->workspace_bytes(), first);
  absl::StatusOr<void*> same = context->Workspace(first);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, *a);

  ASSERT_TRUE(context->ReserveWorkspace(4 * first).ok());
  EXPECT_EQ(context->workspace_bytes(), 4 * first);
  absl::StatusOr<void*> grown = context->Workspace(3 * first);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_TRUE(IsAligned(*grown));
  static_cast<char*>(*grown)[4 * first - 1] = 1;
  // Only the grown workspace is in use; the old block went back to the cache.
  EXPECT_EQ(context->allocator().current_bytes(),
            (4 * first + 255) / 256 * 256);

  const absl::Status negative = context->Workspace(-1).status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(context->workspace_bytes(), 4 * first);
}

TEST(ContextTest, DefaultIsTheDefaultDevice) {
  std::unique_ptr<Context> context = MakeContext(DefaultDevice());
  ASSERT_NE(context, nullptr);
  absl::StatusOr<std::unique_ptr<Context>> implicit = Context::Create();
  ASSERT_TRUE(implicit.ok()) << implicit.status();
  EXPECT_EQ((*implicit)->device(), DefaultDevice());
}

TEST(ContextTest, MissingGpusAreUnavailable) {
  for (const Device& device :
       {Device::Cuda(CudaDeviceCount()), Device::Cuda(-1)}) {
    absl::StatusOr<std::unique_ptr<Context>> context = Context::Create(device);
    ASSERT_FALSE(context.ok()) << device.ToString();
    EXPECT_EQ(context.status().code(), absl::StatusCode::kUnavailable);
  }
  if (CudaDeviceCount() == 0) {
    EXPECT_EQ(Context::Create(Device::Cuda(0)).status().code(),
              absl::StatusCode::kUnavailable);
  }
}

TEST(ContextTest, CreateWithStreamNeedsACudaDevice) {
  int stream_stand_in = 0;
  const absl::Status status =
      Context::CreateWithStream(Device::Cpu(), &stream_stand_in).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

TEST(ContextTest, TwoCpuContextsAreIndependent) {
  std::unique_ptr<Context> a = MakeContext(Device::Cpu());
  std::unique_ptr<Context> b = MakeContext(Device::Cpu());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(&a->allocator(), &b->allocator());
  absl::StatusOr<void*> wa = a->Workspace(1 << 16);
  absl::StatusOr<void*> wb = b->Workspace(1 << 10);
  ASSERT_TRUE(wa.ok() && wb.ok());
  EXPECT_NE(*wa, *wb);
  EXPECT_EQ(a->allocator().current_bytes(), 1 << 16);
  EXPECT_EQ(b->allocator().current_bytes(), 1 << 10);
  a.reset();  // b keeps working without a
  absl::StatusOr<void*> grown = b->Workspace(1 << 20);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(b->workspace_bytes(), 1 << 20);
}

// Resources that record their destruction in a shared log.
class LoggedResource : public ContextResource {
 public:
  LoggedResource(std::string name, std::vector<std::string>* log)
      : name_(std::move(name)), log_(log) {}
  ~LoggedResource() override { log_->push_back(name_); }

 private:
  std::string name_;
  std::vector<std::string>* log_;
};
class FirstResource final : public LoggedResource {
  using LoggedResource::LoggedResource;
};
class SecondResource final : public LoggedResource {
  using LoggedResource::LoggedResource;
};

TEST(ContextResourceTest, OnePerTypeMadeOnceAndDestroyedNewestFirst) {
  std::vector<std::string> destroyed;
  std::unique_ptr<Context> context = MakeContext(Device::Cpu());
  ASSERT_NE(context, nullptr);
  int makes = 0;
  auto make_first = [&]() -> absl::StatusOr<std::unique_ptr<FirstResource>> {
    ++makes;
    return std::make_unique<FirstResource>("first", &destroyed);
  };
  absl::StatusOr<FirstResource*> first =
      context->GetOrCreateResource<FirstResource>(make_first);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(*first, nullptr);
  absl::StatusOr<FirstResource*> again =
      context->GetOrCreateResource<FirstResource>(make_first);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);
  EXPECT_EQ(makes, 1);

  // Another type is another slot; a failed make stores nothing.
  absl::StatusOr<SecondResource*> failed =
      context->GetOrCreateResource<SecondResource>(
          []() -> absl::StatusOr<std::unique_ptr<SecondResource>> {
            return absl::UnavailableError("not now");
          });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<SecondResource*> second =
      context->GetOrCreateResource<SecondResource>(
          [&]() -> absl::StatusOr<std::unique_ptr<SecondResource>> {
            return std::make_unique<SecondResource>("second", &destroyed);
          });
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(static_cast<void*>(*second), static_cast<void*>(*first));
  // A make that returns no object is an error, not an empty slot.
  std::unique_ptr<Context> other = MakeContext(Device::Cpu());
  ASSERT_NE(other, nullptr);
  absl::StatusOr<FirstResource*> null_made =
      other->GetOrCreateResource<FirstResource>(
          []() -> absl::StatusOr<std::unique_ptr<FirstResource>> {
            return std::unique_ptr<FirstResource>();
          });
  EXPECT_EQ(null_made.status().code(), absl::StatusCode::kInternal);

  EXPECT_TRUE(destroyed.empty());
  context.reset();
  EXPECT_EQ(destroyed, (std::vector<std::string>{"second", "first"}));
}

class GpuContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    context_ = MakeContext(Device::Cuda(0));
    ASSERT_NE(context_, nullptr);
  }
  std::unique_ptr<Context> context_;
};

TEST_F(GpuContextTest, StreamAndHandlesAreCreatedOnceOnFirstUse) {
  EXPECT_EQ(context_->allocator().current_bytes(),
            0);  // nothing before first use
  absl::StatusOr<void*> stream = context_->stream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_NE(*stream, nullptr);  // its own stream, not the legacy default stream
  EXPECT_EQ(*context_->stream(), *stream);

  absl::StatusOr<void*> cublas = context_->cublas_handle();
  ASSERT_TRUE(cublas.ok()) << cublas.status();
  EXPECT_NE(*cublas, nullptr);
  EXPECT_EQ(*context_->cublas_handle(), *cublas);

  absl::StatusOr<void*> cublaslt = context_->cublaslt_handle();
  ASSERT_TRUE(cublaslt.ok()) << cublaslt.status();
  EXPECT_NE(*cublaslt, nullptr);
  EXPECT_EQ(*context_->cublaslt_handle(), *cublaslt);

  absl::StatusOr<void*> workspace = context_->cublaslt_workspace();
  ASSERT_TRUE(workspace.ok()) << workspace.status();
  EXPECT_NE(*workspace, nullptr);
  EXPECT_TRUE(IsAligned(*workspace));
  EXPECT_EQ(*context_->cublaslt_workspace(), *workspace);
  EXPECT_GE(context_->allocator().current_bytes(),
            Context::kCublasLtWorkspaceBytes);
  EXPECT_TRUE(context_->Synchronize().ok());
}

TEST_F(GpuContextTest, WorkspaceGrowsOnlyWhenNeeded) {
  std::mt19937_64 rng(test::TestSeed());
  const int64_t first =
      std::uniform_int_distribution<int64_t>(1 << 10, 1 << 22)(rng);
  absl::StatusOr<void*> a = context_->Workspace(first);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE(*a, nullptr);
  EXPECT_TRUE(IsAligned(*a));
  EXPECT_EQ(*context_->Workspace(first - 1), *a);
  EXPECT_EQ(context_->workspace_bytes(), first);
  // Queue work on the stream, then grow: growth waits for it and must still
  // succeed.
  absl::StatusOr<void*> stream = context_->stream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const Tensor in_use =
      Tensor::Of(*a, DType::kF32, {first / 4}, Device::Cuda(0));
  ASSERT_TRUE(FillUniform(in_use, 1, 0.0f, 1.0f, *context_).ok());
  absl::StatusOr<void*> grown = context_->Workspace(3 * first);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(context_->workspace_bytes(), 3 * first);
  EXPECT_TRUE(context_->Synchronize().ok());
}

TEST_F(GpuContextTest, CreateWithStreamUsesTheCallersStream) {
  absl::StatusOr<void*> stream = context_->stream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<std::unique_ptr<Context>> borrowed =
      Context::CreateWithStream(Device::Cuda(0), *stream);
  ASSERT_TRUE(borrowed.ok()) << borrowed.status();
  EXPECT_EQ(*(*borrowed)->stream(), *stream);
  borrowed->reset();  // must not destroy the owner's stream
  EXPECT_TRUE(context_->Synchronize().ok());
  const Tensor t = Tensor::Of(nullptr, DType::kF32, {0}, Device::Cuda(0));
  EXPECT_TRUE(FillUniform(t, 1, 0.0f, 1.0f, *context_).ok());
}

TEST_F(GpuContextTest, TwoContextsSideBySide) {
  std::unique_ptr<Context> other = MakeContext(Device::Cuda(0));
  ASSERT_NE(other, nullptr);
  absl::StatusOr<void*> s1 = context_->stream();
  absl::StatusOr<void*> s2 = other->stream();
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_NE(*s1, *s2);
  absl::StatusOr<void*> h1 = context_->cublas_handle();
  absl::StatusOr<void*> h2 = other->cublas_handle();
  ASSERT_TRUE(h1.ok() && h2.ok());
  EXPECT_NE(*h1, *h2);
  EXPECT_NE(*context_->cublaslt_workspace(), *other->cublaslt_workspace());

  // Fill on both streams at once, then check each result on the host.
  std::mt19937_64 rng(test::TestSeed());
  const uint64_t seed1 = rng(), seed2 = rng();
  const int64_t n = 1 << 20;
  absl::StatusOr<OwnedTensor> t1 =
      EmptyTensor(context_->allocator(), DType::kI32, {n});
  absl::StatusOr<OwnedTensor> t2 =
      EmptyTensor(other->allocator(), DType::kI32, {n});
  ASSERT_TRUE(t1.ok() && t2.ok());
  ASSERT_TRUE(FillRandomInt(t1->view, seed1, 0, 1000, *context_).ok());
  ASSERT_TRUE(FillRandomInt(t2->view, seed2, 0, 1000, *other).ok());
  std::vector<int32_t> h1_values(n), h2_values(n), expected(n);
  ASSERT_TRUE(
      CopyTensor(t1->view,
                 Tensor::Of(h1_values.data(), DType::kI32, {n}, Device::Cpu()),
                 *context_)
          .ok());
  ASSERT_TRUE(
      CopyTensor(t2->view,
                 Tensor::Of(h2_values.data(), DType::kI32, {n}, Device::Cpu()),
                 *other)
          .ok());
  std::unique_ptr<Context> cpu = MakeContext(Device::Cpu());
  const Tensor host =
      Tensor::Of(expected.data(), DType::kI32, {n}, Device::Cpu());
  ASSERT_TRUE(FillRandomInt(host, seed1, 0, 1000, *cpu).ok());
  EXPECT_EQ(h1_values, expected);
  ASSERT_TRUE(FillRandomInt(host, seed2, 0, 1000, *cpu).ok());
  EXPECT_EQ(h2_values, expected);

  // The buffers of each context go back to their own allocator.
  t2->buffer.Reset();
  t2->view.data = nullptr;
  other.reset();
  EXPECT_TRUE(context_->Synchronize().ok());
  EXPECT_GE(context_->allocator().current_bytes(), n * 4);
}

}  // namespace
}  // namespace lossrt
