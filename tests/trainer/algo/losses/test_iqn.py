"""IQN cosine features, target and quantile Huber loss against hand-written float64 formulas."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from trainer.algo.losses.iqn import cosine_features, iqn_target, quantile_huber_loss


def test_cosine_features_match_formula(gen: torch.Generator) -> None:
    tau = torch.rand(3, 4, generator=gen)
    phi = cosine_features(tau, 8)
    assert phi.shape == (3, 4, 8)
    for b, t, i in [(0, 0, 0), (1, 2, 3), (2, 3, 7)]:
        assert math.isclose(float(phi[b, t, i]), math.cos(math.pi * i * float(tau[b, t])), abs_tol=1e-6)
    assert (phi[..., 0] == 1).all()


def test_iqn_target_matches_reference(gen: torch.Generator) -> None:
    next_quantiles = torch.randn(5, 6, 3, generator=gen)
    reward = torch.randn(5, generator=gen)
    done = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0])
    target = iqn_target(next_quantiles, reward, done, 0.97)
    assert target.shape == (5, 6, 3)
    for b in range(5):
        for t in range(6):
            for k in range(3):
                expected = float(reward[b]) + 0.97 * (1 - float(done[b])) * float(next_quantiles[b, t, k])
                assert math.isclose(float(target[b, t, k]), expected, abs_tol=1e-6)


def reference_quantile_huber(
    quantiles: torch.Tensor, target: torch.Tensor, tau: torch.Tensor, kappa: float
) -> torch.Tensor:
    B, T, K = quantiles.shape
    Tt = target.shape[1]
    out = torch.zeros(B, dtype=torch.float64)
    for b in range(B):
        total = 0.0
        for k in range(K):
            for t in range(T):
                for s in range(Tt):
                    u = float(target[b, s, k]) - float(quantiles[b, t, k])
                    huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
                    total += abs(float(tau[b, t]) - (1.0 if u < 0 else 0.0)) * huber / kappa / Tt
        out[b] = total / K
    return out


@pytest.mark.parametrize("kappa", [1.0, 0.5, 2.0])
def test_quantile_huber_matches_formula_in_both_regions(gen: torch.Generator, kappa: float) -> None:
    quantiles = torch.randn(4, 5, 3, generator=gen) * 2
    target = torch.randn(4, 6, 3, generator=gen) * 2
    tau = torch.rand(4, 5, generator=gen)
    u = target[:, None] - quantiles[:, :, None]
    assert (u.abs() <= kappa).any() and (u.abs() > kappa).any(), "inputs must cover both Huber regions"
    loss = quantile_huber_loss(quantiles, target, tau, kappa)
    assert loss.shape == (4,)
    expected = reference_quantile_huber(quantiles, target, tau, kappa)
    torch.testing.assert_close(loss.double(), expected, atol=1e-5, rtol=1e-6)


def test_quantile_huber_is_asymmetric_in_tau() -> None:
    # a target above the quantile (u > 0) costs tau, below costs 1 - tau
    quantiles = torch.zeros(1, 1, 1)
    tau = torch.tensor([[0.9]])
    above = quantile_huber_loss(quantiles, torch.full((1, 1, 1), 3.0), tau, 1.0)
    below = quantile_huber_loss(quantiles, torch.full((1, 1, 1), -3.0), tau, 1.0)
    torch.testing.assert_close(above, torch.tensor([0.9 * 2.5]))
    torch.testing.assert_close(below, torch.tensor([0.1 * 2.5]))


def test_quantile_huber_gradcheck_and_target_gets_no_gradient(gen: torch.Generator) -> None:
    quantiles = torch.randn(2, 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    target = (torch.randn(2, 4, 2, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    tau = torch.rand(2, 3, generator=gen, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: quantile_huber_loss(x, target, tau, 0.7), (quantiles,))
    quantile_huber_loss(quantiles, target, tau, 0.7).sum().backward()
    assert target.grad is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: cosine_features(torch.rand(3), 4), r"tau must be \[B, T\]"),
        (lambda: cosine_features(torch.rand(3, 2), 0), "n_cos must be at least 1"),
        (lambda: iqn_target(torch.zeros(2, 4, 3), torch.zeros(3), torch.zeros(2), 0.9), "reward has B=3 but B=2"),
        (
            lambda: quantile_huber_loss(torch.zeros(2, 4, 3), torch.zeros(2, 5, 3), torch.zeros(2, 5), 1.0),
            "tau has T=5 but T=4",
        ),
        (
            lambda: quantile_huber_loss(torch.zeros(2, 4, 3), torch.zeros(2, 5, 2), torch.zeros(2, 4), 1.0),
            "target_quantiles has K=2 but K=3",
        ),
        (
            lambda: quantile_huber_loss(torch.zeros(2, 4, 3), torch.zeros(2, 5, 3), torch.zeros(2, 4), 0.0),
            "kappa must be positive",
        ),
    ],
)
def test_bad_input_raises_one_line_errors(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
