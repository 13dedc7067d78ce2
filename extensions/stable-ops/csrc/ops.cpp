// The example_stable operator library on PyTorch's stable ABI: schemas and CPU kernels.
//
// Nothing here names at::, c10:: or torch:: internals: tensors are torch::stable::Tensor,
// operators come from torch/csrc/stable/ops.h and checks from the header-only STD_TORCH_CHECK,
// so the library calls libtorch only through its C shims, and TORCH_TARGET_VERSION (2.10,
// set in setup.py) keeps it to the shims of that release. One build serves every torch from
// 2.10 on; wheelmill's ABI check holds it to that (abi = "stable" in its recipe).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cmath>
#include <cstdint>

using torch::stable::Tensor;

namespace example_stable {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight, float32.
Tensor rms_norm_cpu(Tensor x, Tensor weight, double eps) {
  STD_TORCH_CHECK(x.dim() >= 1, "rms_norm: x must have at least one dimension");
  STD_TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(x.dim() - 1),
                  "rms_norm: weight must be 1-D with x.size(-1) elements");
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float &&
                      weight.scalar_type() == torch::headeronly::ScalarType::Float,
                  "rms_norm: x and weight must be float32");
  STD_TORCH_CHECK(eps >= 0, "rms_norm: eps must be >= 0");
  Tensor input = torch::stable::contiguous(x);
  Tensor w = torch::stable::contiguous(weight);
  Tensor out = torch::stable::empty_like(input);
  const int64_t cols = input.size(input.dim() - 1);
  const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
  const float* in = static_cast<const float*>(input.data_ptr());
  const float* wp = static_cast<const float*>(w.data_ptr());
  float* o = static_cast<float*>(out.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * cols;
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += static_cast<double>(row[c]) * row[c];
    const double scale = 1.0 / std::sqrt(sum / static_cast<double>(cols) + eps);
    for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = static_cast<float>(row[c] * scale * wp[c]);
  }
  return out;
}

}  // namespace example_stable

STABLE_TORCH_LIBRARY(example_stable, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(example_stable, CPU, m) {
  m.impl("rms_norm", TORCH_BOX(&example_stable::rms_norm_cpu));
}
