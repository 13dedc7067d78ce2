"""The CUDA kernels against the CPU kernels. Registration is checked on any machine; the
numerical tests need a GPU and are skipped without one."""

import example_cuda_ops
import pytest
import torch

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_operators_have_cuda_kernels():
    for op in ("example_ops::rms_norm", "example_ops::segment_sum"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (5, 33), (3, 4, 1000)])
def test_rms_norm_cuda_matches_cpu(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype)
    weight = torch.randn(shape[-1], dtype=dtype)
    expected = example_cuda_ops.rms_norm(x, weight, 1e-5)
    got = example_cuda_ops.rms_norm(x.cuda(), weight.cuda(), 1e-5)
    torch.testing.assert_close(got.cpu(), expected)


@needs_gpu
def test_segment_sum_cuda_matches_cpu():
    values = torch.randn(100, 3, dtype=torch.float64)
    offsets = torch.tensor([0, 10, 10, 55, 100])
    expected = example_cuda_ops.segment_sum(values, offsets)
    got = example_cuda_ops.segment_sum(values.cuda(), offsets.cuda())
    torch.testing.assert_close(got.cpu(), expected)


@needs_gpu
def test_rms_norm_cuda_rejects_mixed_devices():
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        example_cuda_ops.rms_norm(torch.ones(2, 4, device="cuda"), torch.ones(4))
