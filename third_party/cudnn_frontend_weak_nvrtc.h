// Included right before <cudnn_frontend.h>: the frontend's experimental sm100
// RMSNorm+SiLU engine compiles kernels with NVRTC, which every translation
// unit that includes the frontend then references, although SDPA and matmul
// graphs never reach it. Weak references keep libnvrtc out of the link (they
// resolve to null; any libnvrtc in the link would take precedence).
#ifndef LOSSRT_THIRD_PARTY_CUDNN_FRONTEND_WEAK_NVRTC_H_
#define LOSSRT_THIRD_PARTY_CUDNN_FRONTEND_WEAK_NVRTC_H_

#include <nvrtc.h>

#pragma weak nvrtcCreateProgram
#pragma weak nvrtcCompileProgram
#pragma weak nvrtcGetProgramLogSize
#pragma weak nvrtcGetProgramLog
#pragma weak nvrtcDestroyProgram
#pragma weak nvrtcGetCUBINSize
#pragma weak nvrtcGetCUBIN

#endif  // LOSSRT_THIRD_PARTY_CUDNN_FRONTEND_WEAK_NVRTC_H_
