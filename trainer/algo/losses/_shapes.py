"""Shape checks shared by the losses: a wrong shape fails at once with one line, not deep in a gather.

The checks read only static shapes (no tensor values), so they cost nothing under torch.compile or
CUDA graph capture: they run once while tracing and become guards.
"""

from __future__ import annotations

from torch import Tensor


def expect_shape(fn: str, arg: str, tensor: Tensor, letters: str, sizes: dict[str, int]) -> None:
    """Raise ValueError unless `tensor` is [letters...] with each letter's size agreeing with `sizes`.

    `letters` is space-separated (`"B K A N"`); sizes seen first are recorded in `sizes`, so a later
    argument that disagrees on B (say) is named in the error.
    """
    names = letters.split()
    if tensor.dim() != len(names):
        raise ValueError(f"{fn}: {arg} must be [{', '.join(names)}], got shape {tuple(tensor.shape)}")
    for name, size in zip(names, tensor.shape, strict=True):
        expected = sizes.setdefault(name, int(size))
        if int(size) != expected:
            raise ValueError(
                f"{fn}: {arg} has {name}={int(size)} but {name}={expected} elsewhere "
                f"(shape {tuple(tensor.shape)}, expected [{', '.join(names)}])"
            )
