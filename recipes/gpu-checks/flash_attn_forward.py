"""flash-attn's forward pass against PyTorch's own attention, on this machine's GPU."""

import os

import torch
from flash_attn import flash_attn_func

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"

torch.manual_seed(0)
q, k, v = (torch.randn(2, 256, 8, 64, device=DEVICE, dtype=torch.float16) for _ in range(3))
for causal in (False, True):
    out = flash_attn_func(q, k, v, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
    ).transpose(1, 2)
    what = f"flash_attn_func (causal={causal}) against scaled_dot_product_attention"
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3, msg=lambda detail, what=what: f"{what}: {detail}")
print(f"flash_attn_func matches scaled_dot_product_attention (causal and not) on {GPU}")
