// CPU kernels of the example_ops operator library, registered with the PyTorch dispatcher.
//
// The operators are defined here (TORCH_LIBRARY) with their CPU kernels; the example-cuda-ops
// package adds CUDA kernels for the same schemas (TORCH_LIBRARY_IMPL), the way out-of-tree
// backends extend an operator library. No Python header here: the module that Python
// imports is module.cpp, so this file preprocesses to the same text for every Python, and a
// compiler cache compiles it once per variant. The operators' own headers, not ATen/ATen.h
// (every operator's): a quarter less to compile, and less to preprocess on a cache hit.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

namespace example_ops {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight
at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1, "rms_norm: x must have at least one dimension");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1),
              "rms_norm: weight must be 1-D with x.size(-1) = ", x.size(-1), " elements");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: x and weight must have the same dtype");
  TORCH_CHECK(eps >= 0, "rms_norm: eps must be >= 0");
  auto input = x.contiguous();
  auto w = weight.contiguous();
  auto out = at::empty_like(input);
  const int64_t cols = input.size(-1);
  const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "rms_norm_cpu", [&] {
    const scalar_t* in = input.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = in + r * cols;
        double sum = 0.0;
        for (int64_t c = 0; c < cols; ++c) sum += static_cast<double>(row[c]) * row[c];
        const double scale = 1.0 / std::sqrt(sum / static_cast<double>(cols) + eps);
        for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = static_cast<scalar_t>(row[c] * scale * wp[c]);
      }
    });
  });
  return out;
}

// out[i, ...] = sum(values[offsets[i]:offsets[i+1], ...]); offsets is sorted, starts at 0
// and ends at values.size(0).
at::Tensor segment_sum_cpu(const at::Tensor& values, const at::Tensor& offsets) {
  TORCH_CHECK(values.dim() >= 1, "segment_sum: values must have at least one dimension");
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1, "segment_sum: offsets must be 1-D and non-empty");
  TORCH_CHECK(offsets.scalar_type() == at::kLong, "segment_sum: offsets must be int64");
  auto off = offsets.contiguous();
  const int64_t* op = off.data_ptr<int64_t>();
  const int64_t segments = off.size(0) - 1;
  TORCH_CHECK(op[0] == 0 && op[segments] == values.size(0),
              "segment_sum: offsets must start at 0 and end at values.size(0) = ", values.size(0));
  for (int64_t i = 0; i < segments; ++i) {
    TORCH_CHECK(op[i] <= op[i + 1], "segment_sum: offsets must be non-decreasing");
  }
  auto input = values.contiguous();
  const int64_t inner = values.size(0) == 0 ? 0 : input.numel() / values.size(0);
  auto sizes = input.sizes().vec();
  sizes[0] = segments;
  auto out = at::zeros(sizes, input.options());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "segment_sum_cpu", [&] {
    const scalar_t* in = input.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, segments, 1, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        for (int64_t r = op[s]; r < op[s + 1]; ++r) {
          for (int64_t k = 0; k < inner; ++k) o[s * inner + k] += in[r * inner + k];
        }
      }
    });
  });
  return out;
}

}  // namespace example_ops

TORCH_LIBRARY(example_ops, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("segment_sum(Tensor values, Tensor offsets) -> Tensor");
}

TORCH_LIBRARY_IMPL(example_ops, CPU, m) {
  m.impl("rms_norm", &example_ops::rms_norm_cpu);
  m.impl("segment_sum", &example_ops::segment_sum_cpu);
}
