"""Update rules over flat parameter buffers: budget clipping, pruning, Adam, spectral norm, EMA.

Pure functions that return new tensors; the step decides (under the guard) whether they replace the
old ones. No host syncs, so each runs inside a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.model import ParamLayout

BUDGET_NAMES = ("c51", "cql", "iqn", "ensemble")


def clip_to_budget(grad: Tensor, budget: float, eps: float = 1e-6) -> Tensor:
    """g · min(1, budget / (‖g‖ + eps)): the gradient's norm is at most its budget."""
    scale = (budget / (grad.norm() + eps)).clamp(max=1.0)  # []
    return grad * scale  # [P]


def combine_budgeted(grads: dict[str, Tensor], budgets: dict[str, float]) -> Tensor:
    """Σ_i clip(g_i, budget_i): each loss's gradient clipped to its share, then summed."""
    clipped = [clip_to_budget(grads[name], budgets[name]) for name in BUDGET_NAMES if name in grads]
    return torch.stack(clipped).sum(0)  # [P]


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


def spectral_project(params: Tensor, u: Tensor, layout: ParamLayout, sigma_max: float) -> tuple[Tensor, Tensor]:
    """One power iteration per weight matrix, then W ← W · min(1, σ_max / σ).

    `u` [ΣR] holds each matrix's left singular-vector estimate (R = its rows), carried across steps.
    """
    views = layout.views(params)
    u_offset = 0
    new_params = params.clone()
    new_views = layout.views(new_params)
    new_u = torch.empty_like(u)
    for spec in layout.matrices():
        rows = spec.shape[0]
        weight = views[spec.name]  # [R, C]
        u_i = u[u_offset : u_offset + rows]  # [R]
        v_i = torch.nn.functional.normalize(weight.t() @ u_i, dim=0)  # [C]
        # u = W v / ‖W v‖ and σ = uᵀ W v = ‖W v‖: one matrix-vector product less per matrix
        wv = weight @ v_i  # [R]
        sigma = wv.norm()  # []
        u_i = wv / sigma.clamp(min=1e-12)  # [R]
        new_views[spec.name].copy_(weight * (sigma_max / sigma).clamp(max=1.0))
        new_u[u_offset : u_offset + rows] = u_i
        u_offset += rows
    return new_params, new_u


def spectral_u_init(layout: ParamLayout, generator: torch.Generator, device: torch.device) -> Tensor:
    rows = sum(spec.shape[0] for spec in layout.matrices())
    u = torch.randn(rows, generator=generator)
    return u.to(device) / u.norm().clamp(min=1e-12)


def ema(target: Tensor, online: Tensor, tau: float) -> Tensor:
    """target ← target + τ (online − target)."""
    return torch.lerp(target, online, tau)  # [P]
