"""Causal probe: do-interventions on single input features and their effect on Q.

Copy f of the batch has feature f replaced by a shuffled copy of itself (breaking its link with the
rest of the state while keeping its marginal); the mean |change in Q| is feature f's effect, exported
as a metric. No gradient; built for all features at once (no loop over F), capture-safe.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algo.losses._shapes import expect_shape


def intervene(obs: Tensor, perm: Tensor) -> Tensor:
    """[F, B, F] batch whose copy f equals obs except feature f, which is obs[perm, f]."""
    sizes: dict[str, int] = {}
    expect_shape("intervene", "obs", obs, "B F", sizes)
    expect_shape("intervene", "perm", perm, "B", sizes)
    F = obs.shape[1]
    shuffled = obs[perm]  # [B, F]
    # copy f takes column f from the shuffled batch: do(s_f = s_perm(b), f)
    replace = torch.eye(F, dtype=torch.bool, device=obs.device)[:, None, :]  # [F, 1, F]
    return torch.where(replace, shuffled[None], obs[None])  # [F, B, F]


def intervention_effects(q_clean: Tensor, q_intervened: Tensor) -> Tensor:
    """Effect of each feature: mean over batch, branches and actions of |Q(do(s_f)) - Q(s)|."""
    sizes: dict[str, int] = {}
    expect_shape("intervention_effects", "q_clean", q_clean, "B K A", sizes)
    expect_shape("intervention_effects", "q_intervened", q_intervened, "F B K A", sizes)
    # effect_f = mean |Q_f - Q|
    return (q_intervened - q_clean[None]).abs().mean(dim=(1, 2, 3))  # [F]
