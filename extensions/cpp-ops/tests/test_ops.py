"""The CPU kernels against plain-PyTorch references."""

import itertools

import example_cpp_ops
import pytest
import torch


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (5, 33), (2, 3, 64)])
def test_rms_norm_matches_reference(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype)
    weight = torch.randn(shape[-1], dtype=dtype)
    got = example_cpp_ops.rms_norm(x, weight, 1e-5)
    torch.testing.assert_close(got, reference_rms_norm(x, weight, 1e-5))


def test_rms_norm_rejects_a_wrong_weight():
    with pytest.raises(RuntimeError, match="weight must be 1-D"):
        example_cpp_ops.rms_norm(torch.ones(4, 8), torch.ones(7))


def test_segment_sum_matches_reference():
    values = torch.arange(20, dtype=torch.float64).reshape(10, 2)
    offsets = torch.tensor([0, 3, 3, 7, 10])
    expected = torch.stack([values[a:b].sum(0) for a, b in itertools.pairwise(offsets)])
    torch.testing.assert_close(example_cpp_ops.segment_sum(values, offsets), expected)


def test_segment_sum_rejects_offsets_that_do_not_cover_values():
    with pytest.raises(RuntimeError, match="must start at 0 and end at"):
        example_cpp_ops.segment_sum(torch.ones(5), torch.tensor([0, 2, 4]))


def test_operators_have_cpu_kernels():
    for op in ("example_ops::rms_norm", "example_ops::segment_sum"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")
