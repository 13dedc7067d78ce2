"""FBGEMM_GPU's cumulative sums (the offsets of its jagged tensors) against torch.cumsum, on
this machine's GPU."""

import os

import fbgemm_gpu  # noqa: F401 - loads its operator libraries into torch.ops.fbgemm
import torch

# The device the kernels run on. The GPU stage hands a check none of its caller's variables
# but GPU_VARIABLES (src/wheelmill/gpu/stage.py), so there this is always "cuda" (a ROCm
# torch calls its GPUs cuda too); the tests set it to "cpu" to run the check against
# stand-in packages where no GPU is.
DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")
GPU = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a stand-in for a GPU)"

torch.manual_seed(0)
for dtype in (torch.int32, torch.int64):
    lengths = torch.randint(0, 100, (100_000,), dtype=dtype)  # more than one block of the GPU's scan
    inclusive = torch.cumsum(lengths, 0, dtype=dtype)
    expected = {
        "asynchronous_inclusive_cumsum": inclusive,
        "asynchronous_exclusive_cumsum": inclusive - lengths,
        "asynchronous_complete_cumsum": torch.cat([torch.zeros(1, dtype=dtype), inclusive]),
    }
    for name, reference in expected.items():
        result = getattr(torch.ops.fbgemm, name)(lengths.to(DEVICE)).cpu()
        torch.testing.assert_close(
            result, reference, msg=lambda detail, what=f"fbgemm.{name} ({dtype})": f"{what}: {detail}"
        )
print(f"fbgemm's inclusive, exclusive and complete cumsum (int32, int64) match torch.cumsum on {GPU}")
