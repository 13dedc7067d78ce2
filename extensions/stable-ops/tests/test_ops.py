"""The kernels against a plain-PyTorch reference, on whichever torch and Python run them."""

import example_stable_ops
import pytest
import torch


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return (x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + eps) * weight.double()).float()


@pytest.mark.parametrize("shape", [(7,), (5, 33), (2, 3, 64)])
def test_rms_norm_matches_reference_on_the_cpu(shape):
    torch.manual_seed(0)
    x, weight = torch.randn(shape), torch.randn(shape[-1])
    torch.testing.assert_close(example_stable_ops.rms_norm(x, weight, 1e-5), reference(x, weight, 1e-5))


def test_rms_norm_rejects_a_wrong_weight():
    with pytest.raises(RuntimeError, match="weight must be 1-D"):
        example_stable_ops.rms_norm(torch.ones(4, 8), torch.ones(7))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
def test_rms_norm_matches_reference_on_the_gpu():
    torch.manual_seed(0)
    x, weight = torch.randn(64, 1000, device="cuda"), torch.randn(1000, device="cuda")
    got = example_stable_ops.rms_norm(x, weight, 1e-5).cpu()
    torch.testing.assert_close(got, reference(x.cpu(), weight.cpu(), 1e-5))
