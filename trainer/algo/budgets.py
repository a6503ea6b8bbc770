"""Update rules over flat parameter buffers: budget clipping, pruning, Adam, spectral norm, EMA.

Pure functions that return new tensors; the step decides (under the guard) whether they replace the
old ones. No host syncs, so each runs inside a CUDA graph.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from trainer.algo.model import ParamLayout

BUDGET_NAMES = ("c51", "cql", "iqn", "ensemble")


def budget_scale(norm: Tensor, budget: float, eps: float = 1e-6) -> Tensor:
    """min(1, budget / (‖g‖ + eps)): what scales a gradient of norm ‖g‖ to at most its budget."""
    return (budget / (norm + eps)).clamp(max=1.0)


def clip_to_budget(grad: Tensor, budget: float, eps: float = 1e-6) -> Tensor:
    """g · min(1, budget / (‖g‖ + eps)): the gradient's norm is at most its budget."""
    return grad * budget_scale(grad.norm(), budget, eps)  # [P]


def combine_budgeted(grads: dict[str, Tensor], budgets: dict[str, float]) -> Tensor:
    """Σ_i clip(g_i, budget_i): each loss's gradient clipped to its share, then summed.

    Of the L gradients stacked [L, P]: their norms are one reduction and the sum one pointwise kernel,
    where clipping each alone is a reduction and a scaling per loss. Each scale is computed where it is
    used (not stacked into a tensor of scales: compiled, that was a kernel of its own)."""
    names = [name for name in BUDGET_NAMES if name in grads]
    norms = torch.linalg.vector_norm(torch.stack([grads[name] for name in names]), dim=1)  # [L]
    total = grads[names[0]] * budget_scale(norms[0], budgets[names[0]])  # [P]
    for i, name in enumerate(names[1:], start=1):
        total = total + grads[name] * budget_scale(norms[i], budgets[name])
    return total


def pruning_mask(layout: ParamLayout, sparsity: float, generator: torch.Generator, device: torch.device) -> Tensor:
    """Fixed binary mask over the flat parameters: `sparsity` of each weight matrix's entries are 0."""
    mask = torch.ones(layout.size)
    if sparsity > 0:
        views = layout.views(mask)
        for spec in layout.matrices():
            keep = torch.rand(spec.shape, generator=generator) >= sparsity
            views[spec.name].copy_(keep.float())
    return mask.to(device)


@dataclass
class AdamMoments:
    m: Tensor  # [P] first moment
    v: Tensor  # [P] second moment

    @classmethod
    def zeros(cls, size: int, device: torch.device) -> AdamMoments:
        return cls(torch.zeros(size, device=device), torch.zeros(size, device=device))


def adam_update(
    params: Tensor, grad: Tensor, moments: AdamMoments, t: Tensor, lr: float, beta1: float, beta2: float, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Adam with bias correction; `t` is the 1-based update count as a device tensor (capturable).

    m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²;  θ ← θ − lr · m̂ / (√v̂ + ε)
    """
    m = moments.m * beta1 + grad * (1 - beta1)  # [P]
    v = moments.v * beta2 + grad * grad * (1 - beta2)  # [P]
    m_hat = m / (1 - beta1**t)  # [P]
    v_hat = v / (1 - beta2**t)  # [P]
    return params - lr * m_hat / (v_hat.sqrt() + eps), m, v


Geometry = tuple[tuple[int, int, int, int], ...]
"""Per weight matrix, where its view [R, C] reads the flat parameters, as (offset, row_stride, R, C):
W[r, c] = flat[offset + r · row_stride + c]."""


def _geometry(layout: ParamLayout) -> Geometry:
    """The matrices as `ParamLayout.views` cuts them: a row-major block of the stored shape at the parameter's
    offset, of which the view is the first R rows and C columns (`stored` pads a dimension past `shape`).
    Plain ints, which Dynamo takes as constants."""
    geometry = []
    for spec in layout.matrices():
        stored = layout.stored[spec.name]
        if len(stored) != 2:
            raise ValueError(f"spectral_project: matrix {spec.name} is not 2-D")
        rows, cols = spec.shape
        geometry.append((layout.offsets[spec.name][0], stored[1], rows, cols))
    return tuple(geometry)


class _SpectralTables(NamedTuple):
    """`Geometry` as device tensors: the index arithmetic that gathers all M matrices at once."""

    offset: Tensor  # [M]
    row_stride: Tensor  # [M]
    rows: Tensor  # [M] R
    cols: Tensor  # [M] C
    v_start: Tensor  # [M] where the matrix's v_i [C] starts in v [ΣC]
    v_slot: Tensor  # [ΣC] each entry of v as an index into the padded [M, max_cols], flattened
    element_slot: Tensor  # [P] int32: the matrix each flat element is in; M for every element in none
    counters: Tensor  # [M] int32 zeros: the Triton kernel's arrival counters (each call leaves them at zero)
    max_rows: int
    max_cols: int


_TABLES: dict[tuple[int, Geometry, torch.device], _SpectralTables] = {}


@torch.compiler.assume_constant_result
def _spectral_tables(size: int, geometry: Geometry, device: torch.device) -> _SpectralTables:
    """`_SpectralTables` of flat parameters [size], built once per geometry and device.

    Under torch.compile, Dynamo runs this while tracing and takes its tensors as graph inputs, so they are
    made once on the device instead of in every step. Its arguments are Python constants (torch 2.11's
    Dynamo passes no other), and its cache is a dict (Dynamo traces through a functools.cache).
    """
    key = size, geometry, device
    if key not in _TABLES:
        offset, row_stride, rows, cols = (list(column) for column in zip(*geometry, strict=True))
        element_slot = torch.full((size,), len(geometry), dtype=torch.int32)  # [P]
        for i, (start, stride, r, c) in enumerate(geometry):
            element_slot.as_strided((r, c), (stride, 1), start).fill_(i)  # the elements its view reads
        max_cols = max(cols)
        _TABLES[key] = _SpectralTables(
            offset=torch.tensor(offset, device=device),
            row_stride=torch.tensor(row_stride, device=device),
            rows=torch.tensor(rows, device=device),
            cols=torch.tensor(cols, device=device),
            v_start=torch.tensor([0, *itertools.accumulate(cols)][:-1], device=device),
            v_slot=torch.cat([i * max_cols + torch.arange(c) for i, c in enumerate(cols)]).to(device),
            element_slot=element_slot.to(device),
            counters=torch.zeros(len(geometry), dtype=torch.int32, device=device),
            max_rows=max(rows),
            max_cols=max_cols,
        )
    return _TABLES[key]


def spectral_project(params: Tensor, v: Tensor, layout: ParamLayout, sigma_max: float) -> tuple[Tensor, Tensor]:
    """One power iteration per weight matrix, then W ← W · min(1, σ_max / σ).

    `v` [ΣC] holds each matrix's right singular-vector estimate (C = its columns, unit norm), carried
    across steps. Of v: w = W v, σ = ‖w‖ (= uᵀ W v for u = w / ‖w‖), and the next v = normalize(Wᵀ u).
    Carrying v rather than u puts the pass that is independent per row (W v) first and the reduction over
    the rows (Wᵀ u) last, so one pass over W computes both: what lets a GPU do it in one kernel.

    The same maths in three forms. Under torch.compile every matrix at once: on a GPU one Triton kernel
    (`spectral_project_fused`), elsewhere `spectral_project_batched`. Eagerly matrix by matrix
    (`spectral_project_per_matrix`: the batched form's zero-padded gathers cost an eager CPU step ~16 ms
    at the `core` size, the loop 0.4 ms).
    """
    if torch.compiler.is_compiling():
        if params.is_cuda and layout.matrices():
            from trainer.execution.kernels import spectral  # Triton: what CUDA builds of torch bring

            if spectral.supports(max(spec.shape[1] for spec in layout.matrices())):
                return spectral_project_fused(params, v, layout, sigma_max)
        return spectral_project_batched(params, v, layout, sigma_max)
    return spectral_project_per_matrix(params, v, layout, sigma_max)


def spectral_project_per_matrix(
    params: Tensor, v: Tensor, layout: ParamLayout, sigma_max: float
) -> tuple[Tensor, Tensor]:
    """`spectral_project` as a loop over the matrices' views."""
    views = layout.views(params)
    new_params, new_v, v_offset = params.clone(), torch.empty_like(v), 0
    new_views = layout.views(new_params)
    for spec in layout.matrices():
        cols = spec.shape[1]
        weight = views[spec.name]  # [R, C]
        wv = weight @ v[v_offset : v_offset + cols]  # [R]
        sigma = wv.norm()  # []
        u = wv / sigma.clamp(min=1e-12)  # [R]
        new_v[v_offset : v_offset + cols] = torch.nn.functional.normalize(weight.t() @ u, dim=0)
        new_views[spec.name].copy_(weight * (sigma_max / sigma).clamp(max=1.0))
        v_offset += cols
    return new_params, new_v


def spectral_project_batched(params: Tensor, v: Tensor, layout: ParamLayout, sigma_max: float) -> tuple[Tensor, Tensor]:
    """`spectral_project` for Inductor: the M matrices gathered into one zero-padded [M, R, C] block (R, C:
    the largest), so the iteration is one set of kernels for every matrix (45 → 9 Triton kernels for the
    pinned model's 9; 71 → 23 µs per graph replay on an H200). The zeros change no product or norm; every
    element outside the matrices is multiplied by exactly 1.
    """
    if not layout.matrices():
        return params.clone(), v.clone()
    tables = _spectral_tables(layout.size, _geometry(layout), params.device)
    rows = torch.arange(tables.max_rows, device=params.device)  # [R]
    cols = torch.arange(tables.max_cols, device=params.device)  # [C]
    in_cols = cols < tables.cols[:, None]  # [M, C]
    in_matrix = (rows < tables.rows[:, None])[:, :, None] & in_cols[:, None, :]  # [M, R, C]
    index = tables.offset[:, None, None] + rows[:, None] * tables.row_stride[:, None, None] + cols  # [M, R, C]
    weight = torch.where(in_matrix, params[index.where(in_matrix, 0)], 0.0)  # [M, R, C]
    v_i = torch.where(in_cols, v[(tables.v_start[:, None] + cols).where(in_cols, 0)], 0.0)  # [M, C]
    # the products as multiply-and-sum: float32 reductions (never TF32), fused with the gathers
    wv = (weight * v_i[:, None, :]).sum(2)  # [M, R]
    sigma = wv.norm(dim=1)  # [M]
    u = wv / sigma.clamp(min=1e-12)[:, None]  # [M, R]
    new_v = torch.nn.functional.normalize((weight * u[:, :, None]).sum(1), dim=1)  # [M, C]
    scale = (sigma_max / sigma).clamp(max=1.0)  # [M]
    scale = torch.cat([scale, scale.new_ones(1)])  # [M + 1]: slot M, every element outside the matrices
    return params * scale[tables.element_slot], new_v.flatten()[tables.v_slot]  # [P], [ΣC]


def spectral_project_fused(params: Tensor, v: Tensor, layout: ParamLayout, sigma_max: float) -> tuple[Tensor, Tensor]:
    """`spectral_project` with the power iteration of every matrix in one Triton kernel
    (`trainer.execution.kernels.spectral`: one kernel where the batched form's reductions take 8); each element is
    then multiplied by its matrix's scale, exactly as in the batched form."""
    from trainer.execution.kernels.spectral import spectral_power_step

    tables = _spectral_tables(layout.size, _geometry(layout), params.device)
    scale, new_v = spectral_power_step(
        params,
        v,
        tables.offset,
        tables.row_stride,
        tables.rows,
        tables.cols,
        tables.v_start,
        tables.counters,
        sigma_max,
        tables.max_rows,
        tables.max_cols,
    )  # [M + 1], [ΣC]
    return params * scale[tables.element_slot], new_v  # [P], [ΣC]


def spectral_v_init(layout: ParamLayout, generator: torch.Generator, device: torch.device) -> Tensor:
    """v [ΣC]: a random unit vector per matrix (its right singular-vector estimate before any step)."""
    parts = [torch.randn(spec.shape[1], generator=generator) for spec in layout.matrices()]
    v = torch.cat([part / part.norm().clamp(min=1e-12) for part in parts]) if parts else torch.zeros(0)
    return v.to(device)


def ema(target: Tensor, online: Tensor, tau: float | Tensor) -> Tensor:
    """target ← target + τ (online − target).

    τ is a float, or in a pack whose runs differ in it a float64 0-d tensor per run (trainer/execution/pack.py);
    lerp takes a tensor weight only in the target's dtype, and a float weight is rounded to it anyway."""
    weight = tau.to(target.dtype) if isinstance(tau, Tensor) else tau
    return torch.lerp(target, online, weight)  # [P]
