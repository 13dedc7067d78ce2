// The launchers kernels.cu defines, for float and double: CUDA's runtime types only, so that
// the host compiler alone reads torch's headers (ops.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace example_ops {

template <typename scalar_t>
cudaError_t launch_rms_norm(const scalar_t* x, const scalar_t* weight, scalar_t* out, int64_t rows, int64_t cols,
                            double eps, cudaStream_t stream);

template <typename scalar_t>
cudaError_t launch_segment_sum(const scalar_t* values, const int64_t* offsets, scalar_t* out, int64_t segments,
                               int64_t inner, cudaStream_t stream);

}  // namespace example_ops
