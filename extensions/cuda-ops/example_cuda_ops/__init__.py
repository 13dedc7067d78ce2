"""CUDA kernels for the example_ops operators defined by example_cpp_ops.

After ``import example_cuda_ops``, ``example_cpp_ops.rms_norm`` and ``segment_sum`` run on
CUDA tensors too.
"""

import example_cpp_ops  # defines the operator schemas first

from . import _C  # noqa: F401  (registers the CUDA kernels)

rms_norm = example_cpp_ops.rms_norm
segment_sum = example_cpp_ops.segment_sum

__all__ = ["rms_norm", "segment_sum"]
