// ReduceInRankOrder: the reduction that the CPU collective backends share, so
// that every backend on the host gives the same bits: a sum is
// ((in_0 + in_1) + in_2) + ..., accumulated in the dtype itself for f32, f64
// and the integers (which wrap) and in f32 for bf16 and f16, which are rounded
// once at the end; max keeps a NaN once one is seen. Internal.
#ifndef LOSSRT_RUNTIME_RANK_ORDER_REDUCE_H_
#define LOSSRT_RUNTIME_RANK_ORDER_REDUCE_H_

#include <cstdint>

#include "runtime/communicator.h"
#include "runtime/dtype.h"

namespace lossrt {

// out[i] = op over r < world of ins[r][i], in rank order, for i < n: [world]
// pointers to [n] elements of `dtype` in, [n] out (which may be ins[0]).
void ReduceInRankOrder(DType dtype, ReduceOp op, const void* const* ins,
                       int world, int64_t n, void* out);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_RANK_ORDER_REDUCE_H_
