"""apex's fused layer norm (forward and backward) against torch.nn.functional.layer_norm, and
its fused Adam against torch.optim.AdamW, on this machine's GPU.

Both extensions are imported by name first: FusedLayerNorm quietly falls back to torch's
layer norm for a tensor that is not on a GPU, and the wheel must carry the kernels.
"""

import importlib
import os

import torch
from apex.normalization import FusedLayerNorm
from apex.optimizers import FusedAdam

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"

importlib.import_module("fused_layer_norm_cuda")  # FusedLayerNorm's kernels
importlib.import_module("amp_C")  # the multi-tensor kernels of FusedAdam

torch.manual_seed(0)
x = torch.randn(64, 1024, device=DEVICE, requires_grad=True)
weight, bias = torch.randn(1024, device=DEVICE), torch.randn(1024, device=DEVICE)
norm = FusedLayerNorm(1024).to(DEVICE)
with torch.no_grad():
    norm.weight.copy_(weight)
    norm.bias.copy_(bias)
out = norm(x)
grad = torch.randn_like(out)
out.backward(grad)
x_ref = x.detach().clone().requires_grad_()
w_ref, b_ref = weight.clone().requires_grad_(), bias.clone().requires_grad_()
ref = torch.nn.functional.layer_norm(x_ref, (1024,), w_ref, b_ref, eps=1e-5)
ref.backward(grad)
for what, ours, theirs in (
    ("output", out, ref),
    ("input gradient", x.grad, x_ref.grad),
    ("weight gradient", norm.weight.grad, w_ref.grad),
    ("bias gradient", norm.bias.grad, b_ref.grad),
):
    torch.testing.assert_close(
        ours, theirs, rtol=1e-4, atol=1e-4, msg=lambda detail, what=what: f"FusedLayerNorm's {what}: {detail}"
    )

reference = torch.nn.Parameter(torch.randn(1 << 16, device=DEVICE))
fused = torch.nn.Parameter(reference.detach().clone())
adamw = torch.optim.AdamW([reference], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
ours = FusedAdam([fused], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adam_w_mode=True)
for _ in range(20):
    step_grad = torch.randn_like(reference)
    reference.grad, fused.grad = step_grad.clone(), step_grad.clone()
    adamw.step()
    ours.step()
torch.testing.assert_close(
    fused, reference, rtol=1e-5, atol=1e-6, msg=lambda detail: f"FusedAdam against torch.optim.AdamW: {detail}"
)
print(f"apex FusedLayerNorm (forward, backward) and FusedAdam (20 steps) match torch's on {GPU}")
