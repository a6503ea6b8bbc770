"""Implicit quantile networks (Dabney et al. 2018): tau embedding, target and quantile Huber loss.

Per sample ([B]); the per-sample quantile loss also sets the PER priorities. Pure tensor ops,
capture-safe (the taus are drawn by the caller).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainer.algo.losses._shapes import expect_shape


def cosine_features(tau: Tensor, n_cos: int) -> Tensor:
    """phi_i(tau) = cos(pi i tau), i = 0..n_cos-1: the embedding the IQN head multiplies into h_s2."""
    expect_shape("cosine_features", "tau", tau, "B T", {})
    if n_cos < 1:
        raise ValueError(f"cosine_features: n_cos must be at least 1, got {n_cos}")
    i = torch.arange(n_cos, dtype=tau.dtype, device=tau.device)  # [n_cos]
    # phi = cos(pi i tau)
    return torch.cos(math.pi * i * tau[:, :, None])  # [B, T, n_cos]


def iqn_target(next_quantiles_target: Tensor, reward: Tensor, done: Tensor, gamma: float) -> Tensor:
    """Target quantiles r + gamma (1 - done) Z_tau'(s', a*) from the target net at the Double-DQN action."""
    sizes: dict[str, int] = {}
    expect_shape("iqn_target", "next_quantiles_target", next_quantiles_target, "B Tt K", sizes)
    expect_shape("iqn_target", "reward", reward, "B", sizes)
    expect_shape("iqn_target", "done", done, "B", sizes)
    # target = r + gamma (1 - done) Z
    discount = gamma * (1.0 - done)  # [B]
    return reward[:, None, None] + discount[:, None, None] * next_quantiles_target  # [B, Tt, K]


def check_quantile_huber_inputs(quantiles: Tensor, target_quantiles: Tensor, tau: Tensor, kappa: float) -> None:
    """Shapes [B, T, K], [B, Tt, K], [B, T] and kappa > 0, for every implementation of the loss."""
    sizes: dict[str, int] = {}
    expect_shape("quantile_huber_loss", "quantiles", quantiles, "B T K", sizes)
    expect_shape("quantile_huber_loss", "target_quantiles", target_quantiles, "B Tt K", sizes)
    expect_shape("quantile_huber_loss", "tau", tau, "B T", sizes)
    if kappa <= 0:
        raise ValueError(f"quantile_huber_loss: kappa must be positive, got {kappa}")


def quantile_huber_loss(quantiles: Tensor, target_quantiles: Tensor, tau: Tensor, kappa: float) -> Tensor:
    """Per-sample quantile Huber loss: sum over T, mean over T' and branches of rho_tau^kappa(u).

    quantiles [B, T, K] are the online quantiles at the data action for the taus `tau` [B, T];
    target_quantiles [B, Tt, K] are detached here, so gradients reach only the online quantiles.
    """
    check_quantile_huber_inputs(quantiles, target_quantiles, tau, kappa)
    # u = target - quantile, every (tau, tau') pair
    u = target_quantiles.detach()[:, None, :, :] - quantiles[:, :, None, :]  # [B, T, Tt, K]
    # huber_kappa(u) = u^2 / 2 if |u| <= kappa else kappa (|u| - kappa / 2)
    abs_u = u.abs()
    huber = torch.where(abs_u <= kappa, 0.5 * u.square(), kappa * (abs_u - 0.5 * kappa))
    # rho = |tau - 1{u < 0}| huber / kappa
    below = (u.detach() < 0).to(u.dtype)
    rho = (tau[:, :, None, None] - below).abs() * huber / kappa
    # sum over T, mean over T', mean over K
    return rho.sum(1).mean(1).mean(-1)  # [B]
