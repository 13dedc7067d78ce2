// CUDA kernel of example_stable::rms_norm: a block per row, float32, and its launcher.
//
// Nothing of torch is included here: nvcc parses a .cu file's headers for the host and again
// per arch, and the operator (checks, stream, registration on the stable ABI) needs none of
// that; it is in ops_cuda.cpp, which the host compiler reads once.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.h"

namespace example_stable {
namespace {

__global__ void rms_norm_kernel(const float* in, const float* w, float* out, int64_t cols, double eps) {
  const int64_t row = blockIdx.x;
  __shared__ double partial[256];
  double sum = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += static_cast<double>(in[row * cols + c]) * in[row * cols + c];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const double scale = rsqrt(partial[0] / static_cast<double>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[row * cols + c] = static_cast<float>(in[row * cols + c] * scale * w[c]);
  }
}

}  // namespace

int launch_rms_norm(const float* in, const float* w, float* out, int64_t rows, int64_t cols, double eps,
                    void* stream) {
  rms_norm_kernel<<<rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(in, w, out, cols, eps);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace example_stable
