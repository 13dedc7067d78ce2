// The CUDA kernel of example_stable::rms_norm, on the stable ABI like the CPU one, float32.
// The stream is the one torch says is current, through its stable C shim; the kernel itself
// is in kernels.cu.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>

#include "kernels.h"

using torch::stable::Tensor;

namespace example_stable {

Tensor rms_norm_cuda(Tensor x, Tensor weight, double eps) {
  STD_TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(x.dim() - 1),
                  "rms_norm: weight must be 1-D with x.size(-1) elements");
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float &&
                      weight.scalar_type() == torch::headeronly::ScalarType::Float,
                  "rms_norm: x and weight must be float32");
  Tensor input = torch::stable::contiguous(x);
  Tensor w = torch::stable::contiguous(weight);
  Tensor out = torch::stable::empty_like(input);
  const int64_t cols = input.size(input.dim() - 1);
  const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
  if (rows == 0) return out;
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(input.get_device_index(), &stream));
  const int started = launch_rms_norm(static_cast<const float*>(input.data_ptr()),
                                      static_cast<const float*>(w.data_ptr()), static_cast<float*>(out.data_ptr()),
                                      rows, cols, eps, stream);
  STD_TORCH_CHECK(started == 0, "rms_norm: the CUDA kernel did not start");
  return out;
}

}  // namespace example_stable

STABLE_TORCH_LIBRARY_IMPL(example_stable, CUDA, m) {
  m.impl("rms_norm", TORCH_BOX(&example_stable::rms_norm_cuda));
}
