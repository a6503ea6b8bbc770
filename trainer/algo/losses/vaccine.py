"""Vaccine: penalise how far an FGSM-perturbed state moves the online return distribution.

Run every `vaccine_every` steps by the step (a separate graph or a device-side mask, never a host
`if`). Pure tensor ops, capture-safe; the gradient w.r.t. the states comes from the caller.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algo.losses._shapes import expect_shape


def fgsm_states(obs: Tensor, grad_obs: Tensor, epsilon: float) -> Tensor:
    """Fast gradient sign step: s_adv = s + epsilon sign(grad_s loss), each feature moved by epsilon."""
    sizes: dict[str, int] = {}
    expect_shape("fgsm_states", "obs", obs, "B F", sizes)
    expect_shape("fgsm_states", "grad_obs", grad_obs, "B F", sizes)
    # s_adv = s + epsilon sign(g)
    return obs + epsilon * grad_obs.detach().sign()  # [B, F]


def distribution_shift_penalty(logits_clean: Tensor, logits_adv: Tensor) -> Tensor:
    """Per-sample KL(p_clean || p_adv) over atoms, mean over branches and actions.

    The clean distribution is the (detached) anchor, so the gradient only pulls the perturbed
    prediction back towards it.
    """
    sizes: dict[str, int] = {}
    expect_shape("distribution_shift_penalty", "logits_clean", logits_clean, "B K A N", sizes)
    expect_shape("distribution_shift_penalty", "logits_adv", logits_adv, "B K A N", sizes)
    # KL = sum_n p_clean (log p_clean - log p_adv)
    log_p_clean = torch.log_softmax(logits_clean.detach(), dim=-1)
    log_p_adv = torch.log_softmax(logits_adv, dim=-1)
    kl = (log_p_clean.exp() * (log_p_clean - log_p_adv)).sum(-1)  # [B, K, A]
    return kl.mean(dim=(1, 2))  # [B]
