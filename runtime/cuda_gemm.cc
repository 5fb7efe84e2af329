// cuBLASLt GEMMs with plans cached per call shape.
#include "runtime/cuda_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/cuda_status.h"
#include "runtime/gemm_checksum.h"
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

const cublasLtMatmulAlgo_t* GemmTuning::Find(const Key& key) const {
  for (const auto& [tuned_key, algo] : chosen_) {
    if (tuned_key == key) return &algo;
  }
  return nullptr;
}

void GemmTuning::Add(const Key& key, const cublasLtMatmulAlgo_t& algo) {
  if (Find(key) == nullptr) chosen_.emplace_back(key, algo);
}

namespace {

int64_t ElementBytes(cudaDataType type) { return type == CUDA_R_32F ? 4 : 2; }

int64_t BitsOf(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Where GemmRunner::KeyOf keeps beta's and alpha's bits.
constexpr int kBetaKey = 19;
constexpr int kAlphaKey = 24;

// The in-place accumulations that a beta = 0 tuning checks after the call.
// The first adds alpha AB to a D that holds alpha AB, which different
// epilogue formulas tend to round alike (for an fp32 D at alpha = 1 it is
// exact, 2x, whatever the formula); the second adds it to a D unlike it.
constexpr int kAccumulationChecks = 2;

// A tuning whose product is all zeros cannot tell candidates apart: the
// shape stays untuned (the heuristic's first choice runs) and a later call
// tries again, up to this many times before keeping that first choice.
constexpr int kMaxUninformativeTunings = 3;

// The bytes [begin, end) that a column-major matrix spans.
struct Span {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool Overlaps(const Span& other) const {
    return begin < other.end && other.begin < end;
  }
};

Span SpanOf(const void* data, int64_t rows, int64_t cols, int64_t ld,
            int64_t element) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (data == nullptr || rows <= 0 || cols <= 0) return {begin, begin};
  return {begin,
          begin + static_cast<uintptr_t>(((cols - 1) * ld + rows) * element)};
}

// Whether running the call twice leaves what running it once does: nothing it
// reads (the operands, C when beta != 0, the GELU derivative's saved input)
// shares a byte with D. Tuning runs a call several times.
bool Repeatable(const GemmCall& call) {
  const int64_t d_element = ElementBytes(call.d_type);
  const Span d = SpanOf(call.d, call.m, call.n, call.ld_d, d_element);
  std::vector<Span> inputs = {SpanOf(call.a.data, call.a.rows, call.a.cols,
                                     call.a.ld, ElementBytes(call.a.type)),
                              SpanOf(call.b.data, call.b.rows, call.b.cols,
                                     call.b.ld, ElementBytes(call.b.type))};
  if (call.beta != 0.0f) {
    inputs.push_back(SpanOf(call.c != nullptr ? call.c : call.d, call.m, call.n,
                            call.ld_d, d_element));
  }
  if (call.epilogue == GemmEpilogue::kDGelu) {
    inputs.push_back(SpanOf(call.aux, call.m, call.n, call.ld_aux, d_element));
  }
  for (const Span& input : inputs) {
    if (input.Overlaps(d)) return false;
  }
  return true;
}

}  // namespace

bool InitcheckZeroingRequested() {
  const char* value = std::getenv("LOSSRT_INITCHECK_GEMM_OUTPUTS");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

GemmRunner::GemmRunner(cublasLtHandle_t handle, void* workspace,
                       int64_t workspace_bytes,
                       cublasComputeType_t compute_type, GemmTuning* tuning)
    : handle_(handle),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      compute_type_(compute_type),
      tuning_(tuning),
      zero_outputs_first_(InitcheckZeroingRequested()) {}

// For initcheck runs only (see the constructor): zeroes D, and a GELU
// epilogue's aux output, where the call does not read D: beta = 0, or C a
// buffer apart from D (a residual added in the epilogue; one that shares a byte
// with D is left alone). Column-major [m, n]: n columns of m elements, ld
// apart.
absl::Status GemmRunner::ZeroOutputsFirst(const GemmCall& call,
                                          cudaStream_t stream) {
  const int64_t element = ElementBytes(call.d_type);
  const bool reads_d =
      call.beta != 0.0f && (call.c == nullptr || call.c == call.d);
  const bool c_apart =
      call.c == nullptr || call.c == call.d ||
      !SpanOf(call.c, call.m, call.n, call.ld_d, element)
           .Overlaps(SpanOf(call.d, call.m, call.n, call.ld_d, element));
  if (reads_d || !c_apart || call.m <= 0 || call.n <= 0) {
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(
      cudaMemset2DAsync(call.d, static_cast<size_t>(call.ld_d * element), 0,
                        static_cast<size_t>(call.m * element),
                        static_cast<size_t>(call.n), stream));
  if (call.epilogue == GemmEpilogue::kGeluAux && call.aux != nullptr) {
    CUDA_RETURN_IF_ERROR(
        cudaMemset2DAsync(call.aux, static_cast<size_t>(call.ld_aux * element),
                          0, static_cast<size_t>(call.m * element),
                          static_cast<size_t>(call.n), stream));
  }
  return absl::OkStatus();
}

absl::Status GemmRunner::Launch(const Entry& entry,
                                const cublasLtMatmulAlgo_t& algo,
                                const GemmCall& call, cudaStream_t stream) {
  if (zero_outputs_first_) RETURN_IF_ERROR(ZeroOutputsFirst(call, stream));
  if (call.bias != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias,
        sizeof(call.bias)));
  }
  if (call.epilogue != GemmEpilogue::kNone) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        entry.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux,
        sizeof(call.aux)));
  }
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      handle_, entry.desc, &call.alpha, call.a.data, entry.a, call.b.data,
      entry.b, &call.beta, call.c != nullptr ? call.c : call.d, entry.d, call.d,
      entry.d, &algo, workspace_, static_cast<size_t>(workspace_bytes_),
      stream));
  return absl::OkStatus();
}

absl::Status GemmRunner::Run(const GemmCall& call, cudaStream_t stream) {
  ASSIGN_OR_RETURN(Entry * entry, Find(call));
  if (!entry->tuned) {
    if (const cublasLtMatmulAlgo_t* chosen =
            tuning_->Find(TuningKeyOf(*entry))) {
      // Chosen before, by this runner or another on the same table (for an
      // in-place accumulation: by the beta = 0 call of its shape and alpha),
      // and checked to write the heuristic's bits for these very scalars.
      entry->algo = *chosen;
      entry->tuned = true;
    } else if (tuning_->enabled() && call.m > 0 && call.n > 0 &&
               Repeatable(call)) {
      // Inside a capture nothing may wait for the stream: the heuristic's
      // first choice runs (the bits a tuned choice writes too).
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
      if (capture == cudaStreamCaptureStatusNone) {
        return Tune(*entry, call, stream);
      }
    }
  }
  return Launch(*entry, entry->algo, call, stream);
}

// Why the checks are made for the exact alpha and beta of the calls that use
// the choice (both are in the keys): equal bits at one (alpha, beta) do not
// imply equal bits at another. Kernels may apply the epilogue differently
// (fma(alpha, acc, beta C) or alpha acc + beta C rounded twice, a split-K
// partial scaled before the partials are summed, partials summed into C one
// by one); such variants agree at alpha = 1 and beta in {0, 1}, or at powers
// of two away from underflow, and nowhere else in general. The callers use
// few distinct scalars (alpha 1 or an inverse power-of-two gradient scale,
// beta 0 or 1), so keying them exactly costs a few more tunings at most.
// A beta = 0 call with C = D is tuned for its in-place accumulation too,
// which is never repeatable (it reads its output) and is how the callers
// chain chunks after a first beta = 0 chunk (the linear cross-entropy's
// d_weight and d_bias, the linear layer's input gradient).
absl::Status GemmRunner::Tune(Entry& entry, const GemmCall& call,
                              cudaStream_t stream) {
  const GemmTuning::Key key = TuningKeyOf(entry);
  GemmCall accumulation = call;
  accumulation.beta = 1.0f;
  GemmTuning::Key accumulation_key = key;
  accumulation_key[kBetaKey] = BitsOf(1.0f);
  bool check_accumulation = call.beta == 0.0f && call.c == nullptr;
  auto keep = [&](const cublasLtMatmulAlgo_t& algo, bool with_accumulation) {
    entry.algo = algo;
    entry.tuned = true;
    tuning_->Add(key, algo);
    if (with_accumulation) tuning_->Add(accumulation_key, algo);
  };
  // The heuristic's first choice is what every untuned call of the shape
  // runs: keeping it needs no check.
  if (entry.candidates.size() < 2) {
    keep(entry.algo, check_accumulation);
    return Launch(entry, entry.algo, call, stream);
  }
  // The checksum lands in the GEMM workspace, which this stream's GEMMs use
  // only while they run.
  auto* sum = static_cast<unsigned long long*>(workspace_);
  const int64_t column_bytes = call.m * ElementBytes(call.d_type);
  const int64_t ld_bytes = call.ld_d * ElementBytes(call.d_type);
  auto checksum = [&]() -> absl::StatusOr<unsigned long long> {
    CUDA_RETURN_IF_ERROR(LaunchGemmChecksum(call.d, column_bytes, call.n,
                                            ld_bytes, sum, stream));
    unsigned long long host = 0;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&host, sum, sizeof(host),
                                         cudaMemcpyDeviceToHost, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return host;
  };
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> start_guard(
      start, cudaEventDestroy);
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> stop_guard(
      stop, cudaEventDestroy);
  constexpr int kTimedRuns = 3;
  // The heuristic's checksums: after the call, then after each accumulation.
  std::array<unsigned long long, 1 + kAccumulationChecks> reference = {};
  float best_ms = 0;
  size_t best = 0;
  for (size_t i = 0; i < entry.candidates.size(); ++i) {
    const cublasLtMatmulAlgo_t& algo = entry.candidates[i];
    // A candidate that fails to launch is skipped; the first must work.
    const absl::Status first = Launch(entry, algo, call, stream);
    if (!first.ok()) {
      if (i == 0) return first;
      continue;
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    for (int run = 0; run < kTimedRuns; ++run) {
      RETURN_IF_ERROR(Launch(entry, algo, call, stream));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    ASSIGN_OR_RETURN(const unsigned long long bits, checksum());
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    if (i == 0) {
      if (bits == GemmChecksumOfZeros(column_bytes, call.n)) {
        // D holds the heuristic's output, the call's result.
        if (++entry.uninformative_tunings >= kMaxUninformativeTunings) {
          keep(entry.algo, check_accumulation);
        }
        return absl::OkStatus();
      }
      reference[0] = bits;
    } else if (bits != reference[0]) {
      continue;
    }
    bool same = true;
    for (int step = 0; check_accumulation && same && step < kAccumulationChecks;
         ++step) {
      const absl::Status accumulated =
          Launch(entry, algo, accumulation, stream);
      if (!accumulated.ok()) {
        // The heuristic's choice cannot accumulate here: nothing to check
        // (and no accumulation to choose for); another candidate that cannot
        // is not chosen.
        if (i == 0) {
          check_accumulation = false;
        } else {
          same = false;
        }
        break;
      }
      ASSIGN_OR_RETURN(const unsigned long long accumulated_bits, checksum());
      if (i == 0) {
        reference[1 + step] = accumulated_bits;
      } else {
        same = accumulated_bits == reference[1 + step];
      }
    }
    if (same && (i == 0 || ms < best_ms)) {
      best_ms = ms;
      best = i;
    }
  }
  keep(entry.candidates[best], check_accumulation);
  // D holds the last candidate's output (or its accumulations).
  return Launch(entry, entry.algo, call, stream);
}

GemmTuning::Key GemmRunner::TuningKeyOf(const Entry& entry) const {
  static_assert(kAlphaKey + 1 == std::tuple_size<Key>::value &&
                    std::tuple_size<Key>::value + 3 ==
                        std::tuple_size<GemmTuning::Key>::value,
                "the keys' layouts");
  GemmTuning::Key key;
  std::copy(entry.key.begin(), entry.key.end(), key.begin());
  key[25] = static_cast<int64_t>(compute_type_);
  key[26] = workspace_bytes_;
  key[27] = reinterpret_cast<intptr_t>(handle_);
  return key;
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
          BitsOf(c.beta),  // kBetaKey
          static_cast<int64_t>(c.epilogue),
          c.epilogue != GemmEpilogue::kNone ? AlignmentOf(c.aux) : 0,
          c.ld_aux,
          c.c != nullptr ? AlignmentOf(c.c) : 0,
          BitsOf(c.alpha)};  // kAlphaKey
}

int64_t GemmRunner::CandidatesOf(const GemmCall& call) const {
  const Key key = KeyOf(call);
  for (const std::unique_ptr<Entry>& entry : cache_) {
    if (entry->key == key)
      return static_cast<int64_t>(entry->candidates.size());
  }
  return 0;
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
  std::array<cublasLtMatmulHeuristicResult_t, kGemmTuningCandidates> results =
      {};
  int found = 0;
  // Matrix-vector products are never tuned: they are bound by memory, so the
  // candidates differ little in time, and equal bits on one call prove little
  // there. Their sums are short or run over few distinct magnitudes (the
  // linear cross-entropy's d_bias sums 16-bit dlogits against a vector of
  // ones, each chunk's sum often exact in any order), so two algorithms that
  // agree on the tuning call's data can still disagree on a later call's (seen
  // on the H200: the d_bias of a tuned context and of an untuned one
  // differed).
  const bool tune = tuning_ != nullptr && tuning_->enabled() &&
                    workspace_bytes_ >= 8 && call.m > 1 && call.n > 1;
  // As many results with tuning on or off: the first choice is the answer to
  // the same question either way.
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      handle_, entry->desc, entry->a, entry->b, entry->d, entry->d, preference,
      kGemmTuningCandidates, results.data(), &found);
  std::vector<cublasLtMatmulAlgo_t> usable;
  if (heuristic == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) {
        usable.push_back(results[i].algo);
      }
    }
  }
  if (usable.empty()) {
    // Remembered, so that a caller with a fallback does not ask again.
    cache_.push_back(std::move(entry));
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no algorithm for a ", call.m, " x ", call.n, " GEMM (ld ",
        call.a.ld, ", ", call.b.ld, ", ", call.ld_d, ")"));
  }
  entry->found = true;
  entry->algo = usable[0];
  entry->tuned = !tune;
  if (tune) entry->candidates = std::move(usable);
  cache_.push_back(std::move(entry));
  return cache_.back().get();
}

}  // namespace lossrt
