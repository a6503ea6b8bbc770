"""Ensemble diversity: E extra dueling heads (sharing the value stream) trained on the C51 target.

Each head fits the same projected target; the diversity term rewards disagreement between heads on
the data action's expected Q, so the ensemble keeps a spread that estimates epistemic uncertainty.
The variance is measured in units of the support's half-width, so the term lies in [0, 1] and its
weight means the same whatever v_min and v_max are: the reward for spreading is bounded and cannot
outgrow the cross entropy that anchors every head to the target.
Per sample ([B]); capture-safe.
"""

from __future__ import annotations

from torch import Tensor

from trainer.algo.losses._select import take
from trainer.algo.losses._shapes import expect_shape
from trainer.algo.losses.c51 import c51_cross_entropy, expected_q


def ensemble_loss(
    head_logits: Tensor, action: Tensor, target_pmf: Tensor, support: Tensor, diversity_weight: float
) -> Tensor:
    """Per-sample mean over heads of the C51 cross entropy minus diversity_weight * Var_heads Q(s, a_data) / h².

    The variance is the population variance over the E heads (zero for one head), averaged over
    branches; h = (v_max − v_min) / 2, the largest possible deviation from the mean, so the term is in [0, 1].
    """
    sizes: dict[str, int] = {}
    expect_shape("ensemble_loss", "head_logits", head_logits, "E B K A N", sizes)
    expect_shape("ensemble_loss", "action", action, "B K", sizes)
    expect_shape("ensemble_loss", "target_pmf", target_pmf, "B K N", sizes)
    expect_shape("ensemble_loss", "support", support, "N", sizes)
    E, B, K, A, N = head_logits.shape
    # every head against the same target: fold heads into the batch
    flat_logits = head_logits.reshape(E * B, K, A, N)  # [E*B, K, A, N]
    flat_action = action.repeat(E, 1)  # [E*B, K]
    flat_target = target_pmf.repeat(E, 1, 1)  # [E*B, K, N]
    cross_entropy = c51_cross_entropy(flat_logits, flat_action, flat_target).view(E, B)  # [E, B]
    # diversity = Var_e Q_e(s, a_data) / h², h = (v_max − v_min) / 2, mean over K
    q = expected_q(flat_logits, support)  # [E*B, K, A]
    data_q = take(q, flat_action[:, :, None], dim=-1).view(E, B, K)  # [E, B, K]
    half_width = (support[-1] - support[0]) / 2  # []
    diversity = (data_q.var(dim=0, correction=0) / half_width**2).mean(-1)  # [B]
    return cross_entropy.mean(0) - diversity_weight * diversity  # [B]
