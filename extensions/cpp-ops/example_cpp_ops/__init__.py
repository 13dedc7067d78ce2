"""example_ops: a small operator library with CPU kernels, registered with torch.ops."""

import torch  # loads libtorch before the extension that links it

from . import _C  # noqa: F401  (registers torch.ops.example_ops.*)

__all__ = ["rms_norm", "segment_sum"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Root-mean-square normalization over the last dimension, scaled by ``weight``."""
    return torch.ops.example_ops.rms_norm(x, weight, eps)


def segment_sum(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Sum of ``values[offsets[i]:offsets[i + 1]]`` for each segment ``i``."""
    return torch.ops.example_ops.segment_sum(values, offsets)
