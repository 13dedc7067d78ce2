"""wheelmill: build PyTorch and its native extensions as checked, repaired wheels for every
cell of a Python x CUDA/ROCm/CPU matrix."""

__version__ = "0.1.0"
