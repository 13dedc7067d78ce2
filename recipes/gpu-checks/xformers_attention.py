"""xformers' memory-efficient attention against PyTorch's own attention, and on CUDA its 2:4
sparsity kernel against the answer of xformers' own test, on this machine's GPU.

On CUDA, memory_efficient_attention runs PyTorch's kernels through xformers' dispatch
(0.0.33.post2 and 0.0.35 link torch's CUTLASS and flash kernels rather than build their own);
the kernels the wheel carries there are its 2:4 sparsity ones, so one of those runs too. On
ROCm, memory_efficient_attention runs the wheel's own composable_kernel kernels, and the
ROCm build has no 2:4 sparsity kernels.
"""

import os

import torch
import xformers
import xformers.ops as xops

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"

assert xformers._has_cpp_library, "xformers' C++ library did not load"  # as its own smoke test asks

torch.manual_seed(0)
q, k, v = (torch.randn(2, 256, 8, 64, device=DEVICE, dtype=torch.float16) for _ in range(3))
for bias in (None, xops.LowerTriangularMask()):
    out = xops.memory_efficient_attention(q, k, v, attn_bias=bias)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=bias is not None
    ).transpose(1, 2)
    what = f"memory_efficient_attention (attn_bias={type(bias).__name__}) against scaled_dot_product_attention"
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3, msg=lambda detail, what=what: f"{what}: {detail}")
done = "memory_efficient_attention (with and without a causal mask) matches scaled_dot_product_attention"

if torch.version.hip is None:
    # The 2:4 mask of one 4x4 tile: two values kept in each row and each column, the largest
    # first (the tile and the answer are those of xformers' test_sparse24_largest_mask_2d).
    tile = torch.tensor([[4, 3, 2, 1], [0, 0, 0.5, 0.5], [1, 2, 3, 4], [10, 2, -1, 5]], dtype=torch.float16)
    mask = torch.ops.xformers.sparse24_largest_mask_2d(tile.to(DEVICE)).cpu()
    expected = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]], dtype=torch.int32)
    torch.testing.assert_close(
        mask.int(), expected, msg=lambda detail: f"xformers.sparse24_largest_mask_2d of the test's tile: {detail}"
    )
    done += ", and sparse24_largest_mask_2d gives its test's mask"
print(f"{done} on {GPU}")
