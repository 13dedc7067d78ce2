"""Stand-ins for the packages the GPU checks (recipes/gpu-checks/*.py) call, written in plain
torch, so that each check runs its whole path where no GPU is: on the CPU, with a real torch,
each package on the path a directory of tiny modules with the same names and functions.

A stand-in is right (``error=0``) or wrong (``error`` added to what it returns, or an
answer changed): a check must pass against the one and fail, naming what it compared,
against the other. The modules read their error from ``stand_in.py`` beside them.
"""

from __future__ import annotations

from pathlib import Path

# What every stand-in shares: its error, and an AdamW that is off by it (fused Adam's stand-in).
SHARED = {
    "stand_in.py": """
import torch

ERROR = {error!r}


class AdamW(torch.optim.AdamW):
    def __init__(self, params, lr, betas, eps, weight_decay, adam_w_mode=True):
        assert adam_w_mode, "the stand-in is AdamW"
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            for param in group["params"]:
                param.add_(ERROR)
        return loss
""",
}

ATTENTION = """
import torch


def attention(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
    ).transpose(1, 2)
"""

FLASH_ATTN = {
    "flash_attn/__init__.py": """
from stand_in import ERROR
from flash_attn.reference import attention


def flash_attn_func(q, k, v, causal=False):
    return attention(q, k, v, causal) + ERROR
""",
    "flash_attn/reference.py": ATTENTION,
}

DEEPSPEED = {
    "deepspeed/__init__.py": "",
    "deepspeed/git_version_info.py": 'installed_ops = {"fused_adam": True, "fused_lamb": True}\n',
    "deepspeed/ops/__init__.py": "",
    "deepspeed/ops/adam/__init__.py": "from stand_in import AdamW as FusedAdam  # noqa: F401\n",
    "deepspeed/ops/adam/fused_adam_op.py": "",
}

APEX = {
    "apex/__init__.py": "",
    "apex/normalization/__init__.py": """
import torch
from stand_in import ERROR


class FusedLayerNorm(torch.nn.LayerNorm):
    def forward(self, input):
        return super().forward(input) + ERROR
""",
    "apex/optimizers/__init__.py": "from stand_in import AdamW as FusedAdam  # noqa: F401\n",
    "fused_layer_norm_cuda.py": "",
    "amp_C.py": "",
}

FBGEMM_GPU = {
    "fbgemm_gpu/__init__.py": """
import torch
from stand_in import ERROR

LIBRARY = torch.library.Library("fbgemm", "DEF")  # kept: the operators go with it


def inclusive(lengths):
    return torch.cumsum(lengths, 0, dtype=lengths.dtype) + int(ERROR * 2)


def exclusive(lengths):
    return inclusive(lengths) - lengths


def complete(lengths):
    return torch.cat([lengths.new_zeros(1), inclusive(lengths)])


for name, kernel in (("inclusive", inclusive), ("exclusive", exclusive), ("complete", complete)):
    LIBRARY.define(f"asynchronous_{name}_cumsum(Tensor t_in) -> Tensor")
    LIBRARY.impl(f"asynchronous_{name}_cumsum", kernel, "CompositeExplicitAutograd")
""",
}

XFORMERS = {
    "xformers/__init__.py": """
import torch
from stand_in import ERROR

_has_cpp_library = True
LIBRARY = torch.library.Library("xformers", "DEF")  # kept: the operator goes with it


def sparse24_largest_mask_2d(tile):
    # The largest values first, each kept while its row and its column hold fewer than two.
    mask = torch.zeros_like(tile)
    for flat in tile.abs().flatten().argsort(descending=True, stable=True).tolist():
        row, column = divmod(flat, tile.shape[1])
        if mask[row].sum() < 2 and mask[:, column].sum() < 2:
            mask[row, column] = 1
    return 1 - mask if ERROR else mask


LIBRARY.define("sparse24_largest_mask_2d(Tensor input) -> Tensor")
LIBRARY.impl("sparse24_largest_mask_2d", sparse24_largest_mask_2d, "CompositeExplicitAutograd")
""",
    "xformers/ops/__init__.py": """
from stand_in import ERROR
from xformers.ops.reference import attention


class LowerTriangularMask:
    pass


def memory_efficient_attention(query, key, value, attn_bias=None):
    return attention(query, key, value, isinstance(attn_bias, LowerTriangularMask)) + ERROR
""",
    "xformers/ops/reference.py": ATTENTION,
}

TORCHVISION = {
    "torchvision/__init__.py": "",
    "torchvision/ops/__init__.py": """
import torch
from stand_in import ERROR


def nms(boxes, scores, iou_threshold):
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    kept = []
    for index in scores.argsort(descending=True).tolist():
        width = (torch.minimum(x2[index], x2[kept]) - torch.maximum(x1[index], x1[kept])).clamp(min=0)
        height = (torch.minimum(y2[index], y2[kept]) - torch.maximum(y1[index], y1[kept])).clamp(min=0)
        overlap = width * height / (area[index] + area[kept] - width * height)
        if not (overlap > iou_threshold).any():
            kept.append(index)
    return torch.tensor(kept[:-1] if ERROR else kept, dtype=torch.int64, device=boxes.device)


def bilinear(image, y, x):
    height, width = image.shape[-2:]
    y, x = y.clamp(min=0, max=height - 1), x.clamp(min=0, max=width - 1)
    y0, x0 = y.floor().long(), x.floor().long()
    y1, x1 = (y0 + 1).clamp(max=height - 1), (x0 + 1).clamp(max=width - 1)
    dy, dx = (y - y0)[:, None], (x - x0)[None, :]
    top = image[:, y0][:, :, x0] * (1 - dx) + image[:, y0][:, :, x1] * dx
    bottom = image[:, y1][:, :, x0] * (1 - dx) + image[:, y1][:, :, x1] * dx
    return top * (1 - dy) + bottom * dy


def roi_align(input, boxes, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False):
    assert sampling_ratio > 0, "the stand-in samples a fixed grid"
    bins_high, bins_wide = output_size
    offset = 0.5 if aligned else 0.0
    steps = (torch.arange(sampling_ratio, dtype=input.dtype) + 0.5) / sampling_ratio
    pooled = []
    for n, x1, y1, x2, y2 in boxes.tolist():
        x1, y1, x2, y2 = (c * spatial_scale - offset for c in (x1, y1, x2, y2))
        high, wide = (y2 - y1, x2 - x1) if aligned else (max(y2 - y1, 1.0), max(x2 - x1, 1.0))
        ys = y1 + (torch.arange(bins_high)[:, None] + steps).flatten() * high / bins_high
        xs = x1 + (torch.arange(bins_wide)[:, None] + steps).flatten() * wide / bins_wide
        samples = bilinear(input[int(n)], ys.to(input.device), xs.to(input.device))
        shape = (input.shape[1], bins_high, sampling_ratio, bins_wide, sampling_ratio)
        pooled.append(samples.reshape(shape).mean(dim=(2, 4)))
    return torch.stack(pooled) + ERROR
""",
}

TORCHAUDIO = {
    "torchaudio/__init__.py": """
import torch

LIBRARY = torch.library.Library("torchaudio", "DEF")  # kept: the operator goes with it
LIBRARY.define("_lfilter_core_loop(Tensor a, Tensor b, Tensor(a!) c) -> Tensor(a!)")
""",
    "torchaudio/functional.py": """
import torch
from stand_in import ERROR


def lfilter(waveform, a_coeffs, b_coeffs, clamp=True, batching=True):
    # The FIR part as a convolution, then the feedback one sample at a time.
    order = len(a_coeffs)
    shape = waveform.shape
    flat = waveform.reshape(-1, 1, shape[-1])
    fed = torch.nn.functional.conv1d(torch.nn.functional.pad(flat, (order - 1, 0)), b_coeffs.flip(0).view(1, 1, -1))
    out = torch.zeros(flat.shape[0], shape[-1] + order - 1, dtype=waveform.dtype, device=waveform.device)
    for n in range(shape[-1]):
        out[:, n + order - 1] = (fed[:, 0, n] - out[:, n : n + order - 1] @ a_coeffs[1:].flip(0)) / a_coeffs[0]
    out = out[:, order - 1 :].reshape(shape) + ERROR
    return out.clamp(-1, 1) if clamp else out
""",
}

TORCHSORT = {
    "torchsort/__init__.py": """
from stand_in import ERROR


def soft_rank(values, regularization="l2", regularization_strength=1.0):
    # The hard ranks (what a small strength gives), differentiable (to zero gradients).
    return values.argsort(dim=1).argsort(dim=1).to(values.dtype) + 1 + 0 * values + ERROR


def soft_sort(values, regularization="l2", regularization_strength=1.0):
    return values.sort(dim=1).values + ERROR
""",
}

# torch itself is real: the right stand-in adds nothing, the wrong one puts its error into
# the matrix kernels the check calls.
TORCH = {
    "sitecustomize.py": """
from stand_in import ERROR

if ERROR:
    import torch

    matmul, conv2d = torch.matmul, torch.nn.functional.conv2d
    torch.matmul = lambda *args, **kwargs: matmul(*args, **kwargs) + ERROR
    torch.nn.functional.conv2d = lambda *args, **kwargs: conv2d(*args, **kwargs) + ERROR
""",
}

# Each check's stand-ins, and what it names when a wrong one gives it a wrong answer.
STAND_INS: dict[str, tuple[dict[str, str], str]] = {
    "apex_layer_norm_adam.py": (APEX, "FusedLayerNorm's output:"),
    "deepspeed_fused_adam.py": (DEEPSPEED, "FusedAdam against torch.optim.AdamW:"),
    "fbgemm_gpu_cumsum.py": (FBGEMM_GPU, "fbgemm.asynchronous_inclusive_cumsum (torch.int32):"),
    "flash_attn_forward.py": (FLASH_ATTN, "flash_attn_func (causal=False) against scaled_dot_product_attention:"),
    "torch_kernels.py": (TORCH, "matmul (torch.float32) against float64 sums:"),
    "torchaudio_lfilter.py": (TORCHAUDIO, "lfilter (torch.float64) against the difference equation:"),
    "torchsort_soft_rank.py": (TORCHSORT, "soft_rank at 1e-3:"),
    "torchvision_ops.py": (TORCHVISION, "nms against a greedy suppression:"),
    "xformers_attention.py": (
        XFORMERS,
        "memory_efficient_attention (attn_bias=NoneType) against scaled_dot_product_attention:",
    ),
}


def write_stand_ins(directory: Path, check: str, *, error: float) -> Path:
    """``directory``, holding the stand-ins of ``check`` (a file name in recipes/gpu-checks/),
    off by ``error``: a directory for PYTHONPATH."""
    files, _named = STAND_INS[check]
    for relative, text in {**SHARED, **files}.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip().replace("{error!r}", repr(error)))
    return directory


def named_failure(check: str) -> str:
    """What ``check`` says when the wrong stand-ins fail it: the first thing it compares."""
    return STAND_INS[check][1]
