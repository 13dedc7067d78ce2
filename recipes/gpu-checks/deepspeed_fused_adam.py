"""deepspeed's prebuilt fused Adam against torch.optim.AdamW, on this machine's GPU.

The wheel must carry the op prebuilt (a GPU machine with nvcc would otherwise JIT-compile
one and hide a broken build): its extension module is imported by name first.
"""

import importlib

import torch
from deepspeed.git_version_info import installed_ops
from deepspeed.ops.adam import FusedAdam

assert installed_ops.get("fused_adam"), f"fused_adam is not prebuilt in this wheel: {installed_ops}"
importlib.import_module("deepspeed.ops.adam.fused_adam_op")  # the prebuilt extension itself

torch.manual_seed(0)
reference = torch.nn.Parameter(torch.randn(1 << 16, device="cuda"))
fused = torch.nn.Parameter(reference.detach().clone())
adamw = torch.optim.AdamW([reference], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
ours = FusedAdam([fused], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adam_w_mode=True)
for _ in range(20):
    grad = torch.randn_like(reference)
    reference.grad, fused.grad = grad.clone(), grad.clone()
    adamw.step()
    ours.step()
torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
difference = (fused - reference).abs().max().item()
gpu = torch.cuda.get_device_name()
print(f"fused Adam matches torch.optim.AdamW over 20 steps on {gpu}: max diff {difference:.1e}")
