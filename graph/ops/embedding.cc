// The embedding op: argument checks (the id range included, before anything
// is written), the CPU loops (float and double), the backward's workspace size
// and the dispatch to the CUDA kernels (graph/ops/embedding_cuda.h).
#include "graph/ops/embedding.h"

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/ops/op_checks.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor_checks.h"

#ifdef LOSSRT_WITH_CUDA
#include "graph/ops/embedding_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace ops {
namespace {

// ids [rows] i32 with rows a multiple of seq >= 1; returns rows.
absl::StatusOr<int64_t> CheckIds(const Context& context, const Tensor& ids,
                                 int64_t seq) {
  RETURN_IF_ERROR(CheckTensor(context, ids, {-1}, {DType::kI32}, "ids"));
  const int64_t rows = ids.dim(0);
  if (seq < 1) return InvalidArgument("seq must be >= 1, got ", seq);
  if (rows % seq != 0) {
    return InvalidArgument(
        "ids: ", rows, " rows are not a whole number of sequences of ", seq);
  }
  return rows;
}

// A position table (or its gradient) [P, cols] with P >= seq.
absl::Status CheckPositions(const Context& context, const Tensor& table,
                            int64_t cols, int64_t seq, DType dtype,
                            const char* name) {
  RETURN_IF_ERROR(CheckTensor(context, table, {-1, cols}, {dtype}, name));
  if (table.dim(0) < seq) {
    return InvalidArgument(name, ": ", table.dim(0),
                           " positions, fewer than seq = ", seq);
  }
  return absl::OkStatus();
}

absl::Status BadIds(int64_t invalid, int64_t vocab) {
  return InvalidArgument("ids: ", invalid, " ids are outside [0, ", vocab, ")");
}

// The count of ids outside [0, vocab): on the CPU a scan; on a GPU a kernel
// whose count is copied back, which waits for the stream.
absl::StatusOr<int64_t> CountInvalidIds(Context& context, const Tensor& ids,
                                        int64_t vocab) {
  const int64_t rows = ids.dim(0);
  if (rows == 0) return 0;
  if (context.device().is_cpu()) {
    const int32_t* id = ids.data_as<const int32_t>();
    int64_t invalid = 0;
    for (int64_t r = 0; r < rows; ++r) {
      invalid += (id[r] < 0 || id[r] >= vocab) ? 1 : 0;
    }
    return invalid;
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(void* workspace, context.Workspace(sizeof(int32_t)));
  int32_t* count = static_cast<int32_t*>(workspace);
  CUDA_RETURN_IF_ERROR(cuda::LaunchCountInvalidIds(ids.data_as<const int32_t>(),
                                                   rows, vocab, count, stream));
  int32_t host_count = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&host_count, count, sizeof(host_count),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return host_count;
#else
  return absl::UnavailableError(
      "embedding on a CUDA device: built without CUDA");
#endif
}

template <typename T>
void ForwardCpu(const int32_t* ids, const T* token_table,
                const T* position_table, int64_t rows, int64_t cols,
                int64_t seq, T* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* token = token_table + static_cast<int64_t>(ids[r]) * cols;
    T* out_row = out + r * cols;
    if (position_table == nullptr) {
      for (int64_t c = 0; c < cols; ++c) out_row[c] = token[c];
    } else {
      const T* position = position_table + (r % seq) * cols;
      for (int64_t c = 0; c < cols; ++c) out_row[c] = token[c] + position[c];
    }
  }
}

// Rows added in order: the same sums on every run.
template <typename T>
void BackwardCpu(const int32_t* ids, const T* d_out, int64_t rows, int64_t cols,
                 int64_t seq, T* d_token_table, T* d_position_table) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* grad = d_out + r * cols;
    T* token = d_token_table + static_cast<int64_t>(ids[r]) * cols;
    for (int64_t c = 0; c < cols; ++c) token[c] += grad[c];
  }
  if (d_position_table == nullptr) return;
  // Row p gets the sum over the batch, formed first and added once (as on the
  // GPU).
  const int64_t slab = seq * cols;
  for (int64_t i = 0; i < slab; ++i) {
    T sum = 0;
    for (int64_t b = 0; b < rows / seq; ++b) sum += d_out[b * slab + i];
    d_position_table[i] += sum;
  }
}

}  // namespace

absl::Status EmbeddingForward(Context& context, const Tensor& ids,
                              const Tensor& token_table,
                              const Tensor* position_table, int64_t seq,
                              const Tensor& out, bool check_ids) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckIds(context, ids, seq));
  const DType dtype = token_table.dtype;
  RETURN_IF_ERROR(CheckActivationDType(context, dtype, "token_table"));
  RETURN_IF_ERROR(
      CheckTensor(context, token_table, {-1, -1}, {dtype}, "token_table"));
  const int64_t vocab = token_table.dim(0);
  const int64_t cols = token_table.dim(1);
  if (position_table != nullptr) {
    RETURN_IF_ERROR(CheckPositions(context, *position_table, cols, seq, dtype,
                                   "position_table"));
  }
  RETURN_IF_ERROR(CheckTensor(context, out, {rows, cols}, {dtype}, "out"));
  if (Overlaps(out, ids) || Overlaps(out, token_table) ||
      (position_table != nullptr && Overlaps(out, *position_table))) {
    return InvalidArgument("out overlaps an input");
  }
  if (check_ids) {
    ASSIGN_OR_RETURN(const int64_t invalid,
                     CountInvalidIds(context, ids, vocab));
    if (invalid > 0) return BadIds(invalid, vocab);
  }
  if (rows * cols == 0) return absl::OkStatus();

  const void* positions =
      position_table != nullptr ? position_table->data : nullptr;
  if (context.device().is_cpu()) {
    if (dtype == DType::kF64) {
      ForwardCpu(ids.data_as<const int32_t>(),
                 token_table.data_as<const double>(),
                 static_cast<const double*>(positions), rows, cols, seq,
                 out.data_as<double>());
    } else {
      ForwardCpu(ids.data_as<const int32_t>(),
                 token_table.data_as<const float>(),
                 static_cast<const float*>(positions), rows, cols, seq,
                 out.data_as<float>());
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDA_RETURN_IF_ERROR(cuda::LaunchEmbeddingForward(
      ids.data_as<const int32_t>(), token_table.data, positions, rows, cols,
      seq, dtype == DType::kBF16, out.data, stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError(
      "EmbeddingForward on a CUDA device: built without CUDA");
#endif
}

absl::Status EmbeddingBackward(Context& context, const Tensor& ids,
                               const Tensor& d_out, int64_t seq,
                               const Tensor& d_token_table,
                               const Tensor* d_position_table, bool check_ids) {
  ASSIGN_OR_RETURN(const int64_t rows, CheckIds(context, ids, seq));
  RETURN_IF_ERROR(CheckActivationDType(context, d_out.dtype, "d_out"));
  RETURN_IF_ERROR(
      CheckTensor(context, d_out, {rows, -1}, {d_out.dtype}, "d_out"));
  const int64_t cols = d_out.dim(1);
  const DType acc_dtype = AccumulatorDType(d_out.dtype);
  RETURN_IF_ERROR(CheckTensor(context, d_token_table, {-1, cols}, {acc_dtype},
                              "d_token_table"));
  const int64_t vocab = d_token_table.dim(0);
  if (d_position_table != nullptr) {
    RETURN_IF_ERROR(CheckPositions(context, *d_position_table, cols, seq,
                                   acc_dtype, "d_position_table"));
  }
  if (Overlaps(d_token_table, ids) || Overlaps(d_token_table, d_out)) {
    return InvalidArgument("d_token_table overlaps an input");
  }
  if (d_position_table != nullptr &&
      (Overlaps(*d_position_table, ids) || Overlaps(*d_position_table, d_out) ||
       Overlaps(*d_position_table, d_token_table))) {
    return InvalidArgument(
        "d_position_table overlaps an input or d_token_table");
  }
  if (check_ids) {
    ASSIGN_OR_RETURN(const int64_t invalid,
                     CountInvalidIds(context, ids, vocab));
    if (invalid > 0) return BadIds(invalid, vocab);
  }
  if (rows * cols == 0) return absl::OkStatus();

  void* d_positions =
      d_position_table != nullptr ? d_position_table->data : nullptr;
  if (context.device().is_cpu()) {
    if (d_out.dtype == DType::kF64) {
      BackwardCpu(ids.data_as<const int32_t>(), d_out.data_as<const double>(),
                  rows, cols, seq, d_token_table.data_as<double>(),
                  static_cast<double*>(d_positions));
    } else {
      BackwardCpu(ids.data_as<const int32_t>(), d_out.data_as<const float>(),
                  rows, cols, seq, d_token_table.data_as<float>(),
                  static_cast<float*>(d_positions));
    }
    return absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  size_t workspace_bytes = 0;
  CUDA_RETURN_IF_ERROR(cuda::EmbeddingBackwardWorkspaceBytes(rows, cols, vocab,
                                                             &workspace_bytes));
  ASSIGN_OR_RETURN(void* workspace,
                   context.Workspace(static_cast<int64_t>(workspace_bytes)));
  CUDA_RETURN_IF_ERROR(cuda::LaunchEmbeddingBackward(
      ids.data_as<const int32_t>(), d_out.data, rows, cols, seq, vocab,
      d_out.dtype == DType::kBF16, d_token_table.data_as<float>(),
      static_cast<float*>(d_positions), workspace, workspace_bytes, stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError(
      "EmbeddingBackward on a CUDA device: built without CUDA");
#endif
}

int64_t EmbeddingBackwardWorkspaceBytes(const Device& device, int64_t rows,
                                        int64_t vocab, int64_t cols) {
  if (device.is_cpu() || rows <= 0 || cols <= 0) return 0;
#ifdef LOSSRT_WITH_CUDA
  // CUB sizes its temporaries for the device's architecture.
  absl::StatusOr<ScopedDevice> scoped = ScopedDevice::Enter(device.ordinal);
  if (!scoped.ok()) return 0;
  size_t bytes = 0;
  if (cuda::EmbeddingBackwardWorkspaceBytes(rows, cols, vocab, &bytes) !=
      cudaSuccess) {
    cudaGetLastError();  // the backward itself reports the error
    return 0;
  }
  return static_cast<int64_t>(bytes);
#else
  return 0;
#endif
}

}  // namespace ops
}  // namespace lossrt
