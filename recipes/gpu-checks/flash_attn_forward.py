"""flash-attn's forward pass against PyTorch's own attention, on this machine's GPU."""

import torch
from flash_attn import flash_attn_func

torch.manual_seed(0)
q, k, v = (torch.randn(2, 256, 8, 64, device="cuda", dtype=torch.float16) for _ in range(3))
for causal in (False, True):
    out = flash_attn_func(q, k, v, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
    ).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
print(f"flash_attn_func matches scaled_dot_product_attention (causal and not) on {torch.cuda.get_device_name()}")
