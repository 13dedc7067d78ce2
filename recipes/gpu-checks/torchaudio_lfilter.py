"""torchaudio's IIR filter (lfilter) against the difference equation evaluated in plain
torch, on this machine's GPU.

lfilter falls back to a pure-Python loop where torchaudio's compiled operators are missing:
the operator of its kernels is looked up first.
"""

import os

import torch
import torchaudio.functional

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"


def difference_equation(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y[n] = (b[0] x[n] + b[1] x[n-1] + ... - a[1] y[n-1] - ...) / a[0], from rest."""
    order = len(a)
    padded_x = torch.nn.functional.pad(x, (order - 1, 0))
    y = torch.zeros_like(padded_x)
    for n in range(x.shape[-1]):
        window = slice(n, n + order - 1)
        feed = padded_x[..., n : n + order] @ b.flip(0) - y[..., window] @ a[1:].flip(0)
        y[..., n + order - 1] = feed / a[0]
    return y[..., order - 1 :]


assert hasattr(torch.ops.torchaudio, "_lfilter_core_loop"), "torchaudio's compiled operators are not loaded"
torch.manual_seed(0)
waveform = torch.rand(4, 2, 1000, dtype=torch.float64) * 2 - 1
a = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)  # poles at radius 0.5: a stable filter
b = torch.tensor([0.2, 0.3, 0.2], dtype=torch.float64)
expected = difference_equation(waveform, a, b)
for dtype, tolerance in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
    on_gpu = torchaudio.functional.lfilter(
        waveform.to(DEVICE, dtype), a.to(DEVICE, dtype), b.to(DEVICE, dtype), clamp=False
    )
    torch.testing.assert_close(
        on_gpu.cpu().double(),
        expected,
        rtol=tolerance,
        atol=tolerance,
        msg=lambda detail, dtype=dtype: f"lfilter ({dtype}) against the difference equation: {detail}",
    )
print(f"torchaudio lfilter (float64, float32) matches the difference equation on {GPU}")
