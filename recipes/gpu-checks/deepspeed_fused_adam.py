"""deepspeed's prebuilt fused Adam against torch.optim.AdamW, on this machine's GPU.

The wheel must carry the op prebuilt (a GPU machine with nvcc would otherwise JIT-compile
one and hide a broken build): its extension module is imported by name first.
"""

import importlib
import os

import torch
from deepspeed.git_version_info import installed_ops
from deepspeed.ops.adam import FusedAdam

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"

assert installed_ops.get("fused_adam"), f"fused_adam is not prebuilt in this wheel: {installed_ops}"
importlib.import_module("deepspeed.ops.adam.fused_adam_op")  # the prebuilt extension itself

torch.manual_seed(0)
reference = torch.nn.Parameter(torch.randn(1 << 16, device=DEVICE))
fused = torch.nn.Parameter(reference.detach().clone())
adamw = torch.optim.AdamW([reference], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
ours = FusedAdam([fused], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adam_w_mode=True)
for _ in range(20):
    grad = torch.randn_like(reference)
    reference.grad, fused.grad = grad.clone(), grad.clone()
    adamw.step()
    ours.step()
torch.testing.assert_close(
    fused, reference, rtol=1e-5, atol=1e-6, msg=lambda detail: f"FusedAdam against torch.optim.AdamW: {detail}"
)
difference = (fused - reference).abs().max().item()
print(f"fused Adam matches torch.optim.AdamW over 20 steps on {GPU}: max diff {difference:.1e}")
