// CUDA kernels of the example_ops operators and their launchers, on raw pointers and a stream.
//
// Nothing of torch is included here: nvcc parses a .cu file's headers once for the host and once
// per arch, and torch's headers made this file 33 s of a 40 s build for one arch. The operators
// (checks, dtype dispatch, registration) are in ops.cpp, compiled once by the host compiler.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.h"

namespace example_ops {
namespace {

constexpr int kThreads = 256;

// One block per row: a shared-memory reduction of x^2, then the scaled write.
template <typename scalar_t>
__global__ void rms_norm_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                                scalar_t* __restrict__ out, int64_t cols, double eps) {
  __shared__ double partial[kThreads];
  const int64_t row = blockIdx.x;
  const scalar_t* in = x + row * cols;
  double sum = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += static_cast<double>(in[c]) * in[c];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const double scale = rsqrt(partial[0] / static_cast<double>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[row * cols + c] = static_cast<scalar_t>(in[c] * scale * weight[c]);
  }
}

// One block per segment, threads across the inner (per-row) elements.
template <typename scalar_t>
__global__ void segment_sum_kernel(const scalar_t* __restrict__ values, const int64_t* __restrict__ offsets,
                                   scalar_t* __restrict__ out, int64_t inner) {
  const int64_t segment = blockIdx.x;
  for (int64_t k = threadIdx.x; k < inner; k += blockDim.x) {
    scalar_t acc = 0;
    for (int64_t r = offsets[segment]; r < offsets[segment + 1]; ++r) acc += values[r * inner + k];
    out[segment * inner + k] = acc;
  }
}

}  // namespace

template <typename scalar_t>
cudaError_t launch_rms_norm(const scalar_t* x, const scalar_t* weight, scalar_t* out, int64_t rows, int64_t cols,
                            double eps, cudaStream_t stream) {
  rms_norm_kernel<scalar_t><<<rows, kThreads, 0, stream>>>(x, weight, out, cols, eps);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch_segment_sum(const scalar_t* values, const int64_t* offsets, scalar_t* out, int64_t segments,
                               int64_t inner, cudaStream_t stream) {
  segment_sum_kernel<scalar_t><<<segments, kThreads, 0, stream>>>(values, offsets, out, inner);
  return cudaGetLastError();
}

// The dtypes ops.cpp dispatches to (AT_DISPATCH_FLOATING_TYPES: float and double).
template cudaError_t launch_rms_norm<float>(const float*, const float*, float*, int64_t, int64_t, double, cudaStream_t);
template cudaError_t launch_rms_norm<double>(const double*, const double*, double*, int64_t, int64_t, double,
                                             cudaStream_t);
template cudaError_t launch_segment_sum<float>(const float*, const int64_t*, float*, int64_t, int64_t, cudaStream_t);
template cudaError_t launch_segment_sum<double>(const double*, const int64_t*, double*, int64_t, int64_t,
                                                cudaStream_t);

}  // namespace example_ops
