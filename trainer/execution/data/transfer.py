"""Host arrays onto the device without making the host wait for the GPU.

A blocking copy (`tensor.to("cuda")`) synchronises the stream: the host waits for every kernel queued before it,
so a collection step that copies its observations and rows up that way waits, several times a step, for the
kernels it has just launched (the update, the replay's writes) where it could go on launching the next ones.
Pinned and non-blocking, the copy is queued like a kernel, and the caching host allocator keeps the pinned
buffer until the copy has run.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def host_to_device(host: np.ndarray, device: torch.device) -> Tensor:
    """`host` on `device`, queued on the current stream; on the CPU the array's own memory (no copy)."""
    tensor = torch.from_numpy(host)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def host_into(target: Tensor, host: np.ndarray) -> None:
    """`host` copied into `target` (a static buffer a CUDA graph reads), queued on the current stream."""
    tensor = torch.from_numpy(host)
    target.copy_(tensor.pin_memory() if target.device.type == "cuda" else tensor, non_blocking=True)
