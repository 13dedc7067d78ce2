// The launcher kernels.cu defines: plain types only (the stream as torch's shim gives it), so
// that ops_cuda.cpp includes no CUDA header and kernels.cu no torch header.
#pragma once

#include <cstdint>

namespace example_stable {

// 0 when the kernel started, else the cudaError_t.
int launch_rms_norm(const float* in, const float* w, float* out, int64_t rows, int64_t cols, double eps,
                    void* stream);

}  // namespace example_stable
