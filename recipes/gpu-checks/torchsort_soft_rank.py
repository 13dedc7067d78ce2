"""torchsort's soft ranking and sorting on this machine's GPU: against the hard ranks and
sorted values where the regularization is small enough to give them exactly, and against
its own CPU kernels (forward and backward) where it is not."""

import os

import torch
import torchsort

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"

torch.manual_seed(0)
# Rows of distinct whole numbers, one apart: at strength 1e-3 the soft ranks are the ranks.
values = torch.stack([torch.randperm(100) for _ in range(8)]).float()
ranks = values.argsort(dim=1).argsort(dim=1).float() + 1
for name, result, expected in (
    ("soft_rank", torchsort.soft_rank(values.to(DEVICE), regularization_strength=1e-3), ranks),
    ("soft_sort", torchsort.soft_sort(values.to(DEVICE), regularization_strength=1e-3), values.sort(dim=1).values),
):
    torch.testing.assert_close(
        result.cpu(), expected, rtol=0, atol=1e-3, msg=lambda detail, name=name: f"{name} at 1e-3: {detail}"
    )

noisy = torch.randn(8, 100)
for regularization in ("l2", "kl"):
    outputs, gradients = [], []
    for device in (DEVICE, "cpu"):
        x = noisy.to(device).requires_grad_()
        ranked = torchsort.soft_rank(x, regularization=regularization, regularization_strength=0.5)
        (ranked * torch.linspace(-1, 1, 100, device=device)).sum().backward()
        outputs.append(ranked.detach().cpu())
        gradients.append(x.grad.cpu())
    for what, (ours, theirs) in (("output", outputs), ("gradient", gradients)):
        torch.testing.assert_close(
            ours,
            theirs,
            rtol=1e-4,
            atol=1e-4,
            msg=lambda detail, what=f"soft_rank's {what} ({regularization})": f"{what} against the CPU's: {detail}",
        )
print(f"torchsort soft_rank and soft_sort match the ranks, and their CPU kernels (l2, kl, backward), on {GPU}")
