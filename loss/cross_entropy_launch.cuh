// Host-side launch helpers shared by the cross-entropy kernel families
// (forward, fused, backward, scans): programmatic dependent launches with
// clusters, alignment checks, the (logits, gradient) type dispatch, and the
// family entry points that LaunchRows and LaunchBackward call. Internal to
// //loss.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_LAUNCH_CUH_
#define LOSSRT_LOSS_CROSS_ENTROPY_LAUNCH_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "loss/cross_entropy_cuda.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/cross_entropy_tuning.h"

namespace lossrt {
namespace ce {

inline bool Aligned(const void* ptr, int bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

inline int DeviceMajor() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major;
}

// Launches a kernel; with `programmatic` (its predecessor on the stream is
// the kernel whose results it reads behind griddepcontrol.wait: the target
// scan, or the row kernel for the final sum) and sm_90, with programmatic
// stream serialization, so that it may start while that kernel still runs.
// `cluster` > 1 adds the cluster dimension.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(bool programmatic, void (*kernel)(Params...),
                            unsigned grid, unsigned block, size_t shared_bytes,
                            int cluster, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(block);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (programmatic && DeviceMajor() >= 9) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

inline bool RowsVectorizable(const RowArgs& args, int element_bytes,
                             int grad_bytes, bool with_grad) {
  const int w = 16 / element_bytes;
  bool ok = Aligned(args.logits, 16) && args.logits_stride % w == 0;
  if (with_grad)
    ok = ok && Aligned(args.grad, w * grad_bytes) && args.grad_stride % w == 0;
  return ok;
}

// Whether rows that are not all aligned can be viewed from the 16-byte piece
// each starts in (RowView::lead): the first row is aligned (so that no view
// starts before the tensor), and every gradient row starts as many elements
// into its piece as its logits row (its stride differs by whole pieces).
inline bool RowsViewable(const RowArgs& args, int element_bytes, int grad_bytes,
                         bool with_grad) {
  const int w = 16 / element_bytes;
  bool ok = Aligned(args.logits, 16);
  if (with_grad) {
    ok = ok && Aligned(args.grad, w * grad_bytes) &&
         (args.grad_stride - args.logits_stride) % w == 0;
  }
  return ok;
}

// An element type as a value, for generic lambdas.
template <typename T>
struct TypeTag {
  using Type = T;
};

// Calls fn(TypeTag<T>{}, TypeTag<G>{}) for the (logits, grad) element types of
// args.
template <bool kGrad, typename Fn>
cudaError_t DispatchTypes(const RowArgs& args, Fn&& fn) {
  const DType grad_type = kGrad ? args.grad_type : args.logits_type;
  switch (args.logits_type) {
    case DType::kF32:
      if (grad_type == DType::kF32)
        return fn(TypeTag<float>{}, TypeTag<float>{});
      // fp32 logits with 16-bit gradients: the linear cross-entropy's in-place
      // chunks.
      if constexpr (kGrad) {
        if (grad_type == DType::kBF16)
          return fn(TypeTag<float>{}, TypeTag<__nv_bfloat16>{});
        if (grad_type == DType::kF16)
          return fn(TypeTag<float>{}, TypeTag<__half>{});
      }
      break;
    case DType::kBF16:
      if (grad_type == DType::kBF16)
        return fn(TypeTag<__nv_bfloat16>{}, TypeTag<__nv_bfloat16>{});
      break;
    case DType::kF16:
      if (grad_type == DType::kF16)
        return fn(TypeTag<__half>{}, TypeTag<__half>{});
      break;
  }
  return cudaErrorInvalidValue;
}

// Whether the rows need the option kernels (kOpt): a soft cap, label
// smoothing or the entropy's gradient, which touch every logit. Class weights
// alone only weigh each row's target and the mean's denominator
// (RowCoefficients, the target scan), which every kernel does, so they keep the
// plain kernels. Without a gradient, entropy_weight only subtracts the row's
// entropy (which the extras' kernels sum anyway) from its loss.
inline bool HasOptions(const RowArgs& args, bool grad) {
  return args.softcap > 0.0f || args.label_smoothing > 0.0f ||
         (grad && args.entropy_weight != 0.0f);
}

// Calls launch(TypeTag<T>, TypeTag<G>, kVec, kOpt) (the last two as
// std::integral_constant) for args' element types; kVec where the rows are
// 16-byte aligned, kOpt where an option is on. Rows that are not aligned
// but viewable (RowsViewable: a contiguous [tokens, 50257] tensor) take the
// plain vectorized kernels where no option is on (LeadRows); the rest take
// one general kernel a type pair (kVec false, kOpt true). fp32 logits with
// 16-bit gradients have no scalar kernels (cudaErrorInvalidValue): only the
// linear cross-entropy's chunks take that pair, and their rows are always
// aligned (a chunk's leading dimension is a multiple of 8 floats), so the
// kernels would be compiled for nothing.
template <bool kGrad, typename Launch>
cudaError_t DispatchRowKernels(const RowArgs& args, Launch&& launch) {
  return DispatchTypes<kGrad>(args, [&](auto logits_tag, auto grad_tag) {
    using T = typename decltype(logits_tag)::Type;
    using G = typename decltype(grad_tag)::Type;
    if (!RowsVectorizable(args, sizeof(T), sizeof(G), kGrad)) {
      if (!HasOptions(args, kGrad) &&
          RowsViewable(args, sizeof(T), sizeof(G), kGrad)) {
        return launch(logits_tag, grad_tag, std::true_type{},
                      std::false_type{});
      }
      if constexpr (sizeof(T) != sizeof(G)) {
        return cudaErrorInvalidValue;
      } else {
        return launch(logits_tag, grad_tag, std::false_type{},
                      std::true_type{});
      }
    }
    return HasOptions(args, kGrad)
               ? launch(logits_tag, grad_tag, std::true_type{},
                        std::true_type{})
               : launch(logits_tag, grad_tag, std::true_type{},
                        std::false_type{});
  });
}

// The family entry points, one a file (cross_entropy_forward_*.cu,
// _fused_*.cu, _backward.cu), which LaunchRows and LaunchBackward call by the
// rows' element types; each returns cudaErrorInvalidValue for other types.
// The forward, by logits type.
cudaError_t LaunchForwardRowsF32(const RowArgs& args,
                                 const LaunchTuning& tuning, int num_sms,
                                 cudaStream_t stream);
cudaError_t LaunchForwardRowsBf16(const RowArgs& args,
                                  const LaunchTuning& tuning, int num_sms,
                                  cudaStream_t stream);
cudaError_t LaunchForwardRowsF16(const RowArgs& args,
                                 const LaunchTuning& tuning, int num_sms,
                                 cudaStream_t stream);
// Fused forward+backward, fp32 logits and gradients.
cudaError_t LaunchFusedRowsF32(const RowArgs& args, const LaunchTuning& tuning,
                               int num_sms, cudaStream_t stream);
// Fused forward+backward, fp32 logits with bf16 or f16 gradients (the linear
// cross-entropy's in-place chunks).
cudaError_t LaunchFusedRowsF32ToBf16(const RowArgs& args,
                                     const LaunchTuning& tuning, int num_sms,
                                     cudaStream_t stream);
cudaError_t LaunchFusedRowsF32ToF16(const RowArgs& args,
                                    const LaunchTuning& tuning, int num_sms,
                                    cudaStream_t stream);
// Fused forward+backward, bf16 or f16 logits (and gradients).
cudaError_t LaunchFusedRowsBf16(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream);
cudaError_t LaunchFusedRowsF16(const RowArgs& args, const LaunchTuning& tuning,
                               int num_sms, cudaStream_t stream);
cudaError_t LaunchBackwardRows(const RowArgs& args, const LaunchTuning& tuning,
                               int num_sms, cudaStream_t stream);

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_LAUNCH_CUH_
