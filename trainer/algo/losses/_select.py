"""`take`: a tensor's entries at given indices along one dimension, with a backward that fuses.

The losses read the online network at the data action (C51's logits, CQL's and the ensemble's Q, IQN's
quantiles) and differentiate through that read. A `gather` there is exact, but its backward is a
scatter: one kernel of its own per read (and per row of the heads' batched Jacobian). `take` gives the
same numbers as a masked sum over the dimension (one selected term plus exact zeros: bit-identical to
gather, and NaN or inf in unselected entries does not leak in), and its backward is a pointwise mask
that Inductor fuses into the neighbouring kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor


def take(values: Tensor, index: Tensor, dim: int) -> Tensor:
    """values[..., index, ...] along `dim`, that dimension removed; `index` has values' rank with size 1
    at `dim` (or broadcasts to it), e.g. logits [B, K, A, N] and action[:, :, None, None] for dim 2."""
    dim = dim % values.dim()
    shape = [1] * values.dim()
    shape[dim] = values.shape[dim]
    positions = torch.arange(values.shape[dim], device=values.device).view(shape)  # size A at `dim`
    return torch.where(index == positions, values, 0.0).sum(dim)
