"""Vaccine: the FGSM step and the KL distribution-shift penalty."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from trainer.algo.losses.vaccine import distribution_shift_penalty, fgsm_states


def test_fgsm_moves_each_feature_by_epsilon_along_the_gradient_sign(gen: torch.Generator) -> None:
    obs = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    grad_obs = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    adv_obs = fgsm_states(obs, grad_obs, 0.05)
    step = adv_obs - obs
    torch.testing.assert_close(step.abs(), torch.full_like(obs, 0.05), atol=1e-12, rtol=0)
    assert (torch.sign(step) == torch.sign(grad_obs)).all()


def test_fgsm_increases_a_linear_loss_by_epsilon_times_the_l1_norm(gen: torch.Generator) -> None:
    weight = torch.randn(9, generator=gen, dtype=torch.float64)
    obs = torch.randn(4, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    loss = (obs @ weight).sum()
    (grad_obs,) = torch.autograd.grad(loss, obs)
    adv_obs = fgsm_states(obs.detach(), grad_obs, 0.1)
    torch.testing.assert_close((adv_obs @ weight).sum() - loss.detach(), 4 * 0.1 * weight.abs().sum())


def reference_kl(clean: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    B, K, A, _ = clean.shape
    out = torch.zeros(B, dtype=torch.float64)
    for b in range(B):
        for k in range(K):
            for a in range(A):
                p = [math.exp(float(x)) for x in clean[b, k, a]]
                q = [math.exp(float(x)) for x in adv[b, k, a]]
                p = [x / sum(p) for x in p]
                q = [x / sum(q) for x in q]
                out[b] += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True)) / (K * A)
    return out


def test_kl_penalty_matches_reference_and_is_positive(gen: torch.Generator) -> None:
    clean = torch.randn(3, 2, 4, 7, generator=gen)
    adv = clean + 0.5 * torch.randn(3, 2, 4, 7, generator=gen)
    penalty = distribution_shift_penalty(clean, adv)
    assert penalty.shape == (3,)
    torch.testing.assert_close(penalty.double(), reference_kl(clean, adv), atol=1e-6, rtol=1e-5)
    assert (penalty > 0).all()


def test_kl_penalty_is_zero_for_identical_distributions(gen: torch.Generator) -> None:
    clean = torch.randn(3, 2, 4, 7, generator=gen)
    assert (distribution_shift_penalty(clean, clean).abs() < 1e-6).all()
    # a shift of all logits of one row leaves its distribution unchanged
    assert (distribution_shift_penalty(clean, clean + 3.0).abs() < 1e-6).all()


def test_kl_penalty_gradient_reaches_only_the_perturbed_logits(gen: torch.Generator) -> None:
    clean = torch.randn(2, 2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    adv = (clean.detach() + torch.randn(2, 2, 3, 5, generator=gen, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: distribution_shift_penalty(clean, x), (adv,))
    distribution_shift_penalty(clean, adv).sum().backward()
    assert clean.grad is None
    assert adv.grad is not None and adv.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fgsm_states(torch.zeros(2, 3), torch.zeros(2, 4), 0.1), "grad_obs has F=4 but F=3"),
        (
            lambda: distribution_shift_penalty(torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 5, 5)),
            "logits_adv has A=5 but A=4",
        ),
    ],
)
def test_bad_shapes_raise(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
