// The CUDA kernels of the example_ops operators, registered for the CUDA dispatch key.
//
// The schemas are defined by example-cpp-ops (TORCH_LIBRARY); this library only adds
// kernels (TORCH_LIBRARY_IMPL), so `import example_cuda_ops` after `import example_cpp_ops`
// makes torch.ops.example_ops.* run on the GPU. The checks and the dtype dispatch are here, in
// the host compiler's one pass; the kernels are in kernels.cu, which includes nothing of torch.
// Only c10's CUDA headers: they need the CUDA runtime alone, not cuBLAS/cuSPARSE headers.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels.h"

namespace example_ops {
namespace {

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "rms_norm: tensors must be on a CUDA device");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "rms_norm: weight must be 1-D with x.size(-1) elements");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: x and weight must have the same dtype");
  const c10::cuda::CUDAGuard guard(x.device());
  auto input = x.contiguous();
  auto w = weight.contiguous();
  auto out = at::empty_like(input);
  const int64_t cols = input.size(-1);
  const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
  if (rows == 0) return out;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "rms_norm_cuda", [&] {
    C10_CUDA_CHECK(launch_rms_norm<scalar_t>(input.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                             out.data_ptr<scalar_t>(), rows, cols, eps, stream));
  });
  return out;
}

at::Tensor segment_sum_cuda(const at::Tensor& values, const at::Tensor& offsets) {
  TORCH_CHECK(values.is_cuda() && offsets.is_cuda(), "segment_sum: tensors must be on a CUDA device");
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1, "segment_sum: offsets must be 1-D and non-empty");
  TORCH_CHECK(offsets.scalar_type() == at::kLong, "segment_sum: offsets must be int64");
  const c10::cuda::CUDAGuard guard(values.device());
  auto input = values.contiguous();
  auto off = offsets.contiguous();
  const int64_t segments = off.size(0) - 1;
  const int64_t inner = values.size(0) == 0 ? 0 : input.numel() / values.size(0);
  auto sizes = input.sizes().vec();
  sizes[0] = segments;
  auto out = at::zeros(sizes, input.options());
  if (segments == 0 || inner == 0) return out;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "segment_sum_cuda", [&] {
    C10_CUDA_CHECK(launch_segment_sum<scalar_t>(input.data_ptr<scalar_t>(), off.data_ptr<int64_t>(),
                                                out.data_ptr<scalar_t>(), segments, inner, stream));
  });
  return out;
}

}  // namespace
}  // namespace example_ops

TORCH_LIBRARY_IMPL(example_ops, CUDA, m) {
  m.impl("rms_norm", &example_ops::rms_norm_cuda);
  m.impl("segment_sum", &example_ops::segment_sum_cuda);
}
