"""torchvision's nms and roi_align operators on this machine's GPU: nms against a greedy
suppression written in plain torch, roi_align against the pixels it must pick where its
answer is exact, and against its own CPU kernel on random boxes.

nms runs first: it refuses to run without the compiled operators, where roi_align would fall
back to a pure-Python version and pass without them.
"""

import os

import torch
from torchvision.ops import nms, roi_align

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"


def greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """The boxes kept, highest score first: each one that no kept box overlaps by more than
    ``threshold`` (intersection over union)."""
    x1, y1, x2, y2 = boxes.double().unbind(1)
    width = (torch.minimum(x2[:, None], x2) - torch.maximum(x1[:, None], x1)).clamp(min=0)
    height = (torch.minimum(y2[:, None], y2) - torch.maximum(y1[:, None], y1)).clamp(min=0)
    area = (x2 - x1) * (y2 - y1)
    overlap = width * height / (area[:, None] + area - width * height)
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    kept = []
    for index in scores.argsort(descending=True).tolist():
        if not suppressed[index]:
            kept.append(index)
            suppressed |= overlap[index] > threshold
    return torch.tensor(kept, dtype=torch.int64)


torch.manual_seed(0)
# 200 boxes crowded into 100 x 100: most overlap. No two of them overlap by within 2e-4 of
# the threshold (with this seed), far beyond float32's rounding, so the kept set is exact.
corners = torch.rand(200, 2) * 60
boxes = torch.cat([corners, corners + torch.rand(200, 2) * 30 + 10], dim=1)
scores = torch.rand(200)
kept = nms(boxes.to(DEVICE), scores.to(DEVICE), 0.5).cpu()
torch.testing.assert_close(
    kept, greedy_nms(boxes, scores, 0.5), msg=lambda detail: f"nms against a greedy suppression: {detail}"
)

# Whole-pixel boxes with one bin a pixel and one aligned sample a bin: each sample falls on
# a pixel's centre, so the pooled box is the crop.
features = torch.randn(2, 4, 24, 32)
rois = torch.tensor([[0, 2, 3, 10, 9], [1, 5, 0, 13, 6], [0, 20, 10, 28, 16]])  # batch, x1, y1, x2, y2
pooled = roi_align(features.to(DEVICE), rois.float().to(DEVICE), (6, 8), 1.0, 1, True).cpu()
crops = torch.stack([features[n, :, y1:y2, x1:x2] for n, x1, y1, x2, y2 in rois.tolist()])
torch.testing.assert_close(
    pooled, crops, msg=lambda detail: f"roi_align of whole-pixel boxes against the crops: {detail}"
)

corners = torch.rand(64, 2) * torch.tensor([24.0, 16.0])
batch = torch.randint(0, 2, (64, 1)).float()
random_rois = torch.cat([batch, corners, corners + torch.rand(64, 2) * 8 + 0.5], dim=1)
on_gpu = roi_align(features.to(DEVICE), random_rois.to(DEVICE), (7, 7), 0.5, 2, False).cpu()
on_cpu = roi_align(features, random_rois, (7, 7), 0.5, 2, False)
torch.testing.assert_close(
    on_gpu, on_cpu, rtol=1e-5, atol=1e-5, msg=lambda detail: f"roi_align of random boxes against its CPU: {detail}"
)
print(f"torchvision nms and roi_align match a plain-torch suppression, exact crops and roi_align on the CPU on {GPU}")
