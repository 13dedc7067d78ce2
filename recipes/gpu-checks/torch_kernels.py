"""torch's own GPU kernels and collectives on this machine's GPU: matrix products (float32 and
float16) and a convolution against float64 sums on the CPU, and an all-reduce through NCCL
(RCCL on ROCm) in a process group of one."""

import os
import tempfile

import torch
import torch.distributed as dist

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"
BACKEND = "nccl" if DEVICE == "cuda" else "gloo"  # the collectives of the device's tensors


def products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in float64 from elementwise products and sums alone: no matrix kernel involved."""
    return (a.double()[:, :, None] * b.double()[None, :, :]).sum(dim=1)


torch.manual_seed(0)
a, b = torch.randn(256, 128), torch.randn(128, 64)
# Tolerances that take TF32 (on by default for cuDNN's float32 convolutions) and float16's
# rounding: a broken kernel is off by far more.
for dtype in (torch.float32, torch.float16):
    result = torch.matmul(a.to(DEVICE, dtype), b.to(DEVICE, dtype)).cpu().double()
    torch.testing.assert_close(
        result,
        products(a.to(dtype), b.to(dtype)),
        rtol=1e-2,
        atol=5e-2,
        msg=lambda detail, dtype=dtype: f"matmul ({dtype}) against float64 sums: {detail}",
    )

images, kernels = torch.randn(4, 8, 20, 20), torch.randn(16, 8, 3, 3)
convolved = torch.nn.functional.conv2d(images.to(DEVICE), kernels.to(DEVICE), padding=1).cpu().double()
columns = torch.nn.functional.unfold(images.double(), 3, padding=1)  # (4, 8 * 3 * 3, 20 * 20)
weights = kernels.double().reshape(16, -1)  # (16, 8 * 3 * 3)
expected = (weights[None, :, :, None] * columns[:, None, :, :]).sum(dim=2).reshape(4, 16, 20, 20)
torch.testing.assert_close(
    convolved, expected, rtol=1e-2, atol=5e-2, msg=lambda detail: f"conv2d against float64 sums: {detail}"
)

assert dist.is_available(), "torch was built without torch.distributed"
assert dist.is_backend_available(BACKEND), f"torch.distributed has no {BACKEND}"
with tempfile.TemporaryDirectory() as rendezvous:
    dist.init_process_group(BACKEND, init_method=f"file://{rendezvous}/store", rank=0, world_size=1)
    try:
        summed = torch.arange(8, dtype=torch.float32, device=DEVICE)
        dist.all_reduce(summed)
        torch.testing.assert_close(
            summed.cpu(),
            torch.arange(8, dtype=torch.float32),
            msg=lambda detail: f"all_reduce through {BACKEND}: {detail}",
        )
    finally:
        dist.destroy_process_group()
print(f"torch matmul (float32, float16) and conv2d match float64 sums, and {BACKEND} all-reduces, on {GPU}")
