"""example_stable: an operator library on PyTorch's stable ABI (one wheel for every torch
from 2.10 and every CPython from 3.10), registered with torch.ops."""

import torch  # loads libtorch before the extension that calls into it

from . import _C  # noqa: F401  (registers torch.ops.example_stable.*)

__all__ = ["rms_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Root-mean-square normalization over the last dimension, scaled by ``weight`` (float32)."""
    return torch.ops.example_stable.rms_norm(x, weight, eps)
