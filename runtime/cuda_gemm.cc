// cuBLASLt GEMMs with plans cached per call shape.
#include "runtime/cuda_gemm.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/cuda_status.h"
#include "runtime/status.h"

namespace lossrt {

cudaDataType CudaType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// The largest power of two (<= 256) dividing the address: what cuBLASLt may
// assume.
int64_t AlignmentOf(const void* pointer) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  int64_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

GemmRunner::Entry::~Entry() {
  if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
  if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
  if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
  if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
}

absl::Status GemmRunner::Run(const GemmCall& call, cudaStream_t stream) {
  ASSIGN_OR_RETURN(Entry * entry, Find(call));
  if (call.bias != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias,
        sizeof(call.bias)));
  }
  if (call.epilogue != GemmEpilogue::kNone) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux,
        sizeof(call.aux)));
  }
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      handle_, entry->desc, &call.alpha, call.a.data, entry->a, call.b.data,
      entry->b, &call.beta, call.c != nullptr ? call.c : call.d, entry->d,
      call.d, entry->d, &entry->algo, workspace_,
      static_cast<size_t>(workspace_bytes_), stream));
  return absl::OkStatus();
}

GemmRunner::Key GemmRunner::KeyOf(const GemmCall& c) {
  return {c.a.type,
          c.a.rows,
          c.a.cols,
          c.a.ld,
          c.a.op,
          c.b.type,
          c.b.rows,
          c.b.cols,
          c.b.ld,
          c.b.op,
          c.d_type,
          c.m,
          c.n,
          c.ld_d,
          c.bias != nullptr,
          AlignmentOf(c.a.data),
          AlignmentOf(c.b.data),
          AlignmentOf(c.d),
          c.bias != nullptr ? AlignmentOf(c.bias) : 0,
          c.beta != 0.0f,
          static_cast<int64_t>(c.epilogue),
          c.epilogue != GemmEpilogue::kNone ? AlignmentOf(c.aux) : 0,
          c.ld_aux,
          c.c != nullptr ? AlignmentOf(c.c) : 0};
}

absl::StatusOr<GemmRunner::Entry*> GemmRunner::Find(const GemmCall& call) {
  const Key key = KeyOf(call);
  for (const std::unique_ptr<Entry>& entry : cache_) {
    if (entry->key != key) continue;
    if (!entry->found) {
      return absl::UnimplementedError(
          absl::StrCat("cuBLASLt has no algorithm for a ", call.m, " x ",
                       call.n, " GEMM with these operands"));
    }
    return entry.get();
  }
  auto entry = std::make_unique<Entry>();
  entry->key = key;
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescCreate(&entry->desc, compute_type_, CUDA_R_32F));
  const int32_t op_a = call.a.op;
  const int32_t op_b = call.b.op;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      entry->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      entry->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (call.epilogue != GemmEpilogue::kNone) {
    if (call.bias != nullptr && call.epilogue == GemmEpilogue::kDGelu) {
      return absl::InvalidArgumentError(
          "GEMM: a GELU derivative epilogue takes no bias");
    }
    const uint32_t epilogue =
        call.epilogue == GemmEpilogue::kDGelu ? CUBLASLT_EPILOGUE_DGELU
        : call.bias != nullptr                ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                              : CUBLASLT_EPILOGUE_GELU_AUX;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
        sizeof(epilogue)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &call.ld_aux,
        sizeof(call.ld_aux)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux,
        sizeof(call.aux)));
    if (call.bias != nullptr) {
      CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          entry->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias,
          sizeof(call.bias)));
    }
  } else if (call.bias != nullptr) {
    // The bias vector has the output's type (fp32) and is added before the
    // output is written: the logits never make a second trip through memory
    // for it.
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
        sizeof(epilogue)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias,
        sizeof(call.bias)));
  }
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &entry->a, call.a.type, call.a.rows, call.a.cols, call.a.ld));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &entry->b, call.b.type, call.b.rows, call.b.cols, call.b.ld));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&entry->d, call.d_type,
                                                    call.m, call.n, call.ld_d));
  cublasLtMatmulPreference_t preference = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference));
  std::unique_ptr<void, void (*)(void*)> preference_guard(
      preference, [](void* p) {
        cublasLtMatmulPreferenceDestroy(
            static_cast<cublasLtMatmulPreference_t>(p));
      });
  const uint64_t workspace_bytes = static_cast<uint64_t>(workspace_bytes_);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
      sizeof(workspace_bytes)));
  const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, const void*>,
                   3>
      aligned = {{{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, call.a.data},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, call.b.data},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, call.d}}};
  for (const auto& [attribute, pointer] : aligned) {
    const uint32_t alignment = static_cast<uint32_t>(AlignmentOf(pointer));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        preference, attribute, &alignment, sizeof(alignment)));
  }
  const uint32_t alignment_c =
      static_cast<uint32_t>(AlignmentOf(call.c != nullptr ? call.c : call.d));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignment_c,
      sizeof(alignment_c)));
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      handle_, entry->desc, entry->a, entry->b, entry->d, entry->d, preference,
      1, &result, &found);
  if (heuristic != CUBLAS_STATUS_SUCCESS || found == 0) {
    // Remembered, so that a caller with a fallback does not ask again.
    cache_.push_back(std::move(entry));
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no algorithm for a ", call.m, " x ", call.n, " GEMM (ld ",
        call.a.ld, ", ", call.b.ld, ", ", call.ld_d, ")"));
  }
  entry->found = true;
  entry->algo = result.algo;
  cache_.push_back(std::move(entry));
  return cache_.back().get();
}

}  // namespace lossrt
