"""Ensemble loss against a float64 reference, and the sign of its diversity term."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algo.losses.ensemble import ensemble_loss


def reference_ensemble(
    head_logits: torch.Tensor, action: torch.Tensor, target_pmf: torch.Tensor, support: torch.Tensor, weight: float
) -> torch.Tensor:
    E, B, K, _, N = head_logits.shape
    z = support.double().tolist()
    out = torch.zeros(B, dtype=torch.float64)
    for b in range(B):
        cross_entropy = 0.0
        variance = 0.0
        for k in range(K):
            qs = []
            for e in range(E):
                row = [float(x) for x in head_logits[e, b, k, int(action[b, k])]]
                log_total = math.log(sum(math.exp(x) for x in row))
                cross_entropy += -sum(float(target_pmf[b, k, n]) * (row[n] - log_total) for n in range(N)) / (E * K)
                qs.append(sum(math.exp(row[n] - log_total) * z[n] for n in range(N)))
            mean = sum(qs) / E
            variance += sum((q - mean) ** 2 for q in qs) / E / K
        half_width = (z[-1] - z[0]) / 2
        out[b] = cross_entropy - weight * variance / half_width**2
    return out


def make_inputs(
    gen: torch.Generator, shape: tuple[int, int, int, int, int] = (4, 5, 3, 4, 11)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random head logits [E, B, K, A, N], actions, a target pmf and a support for `shape` = (E, B, K, A, N)."""
    E, B, K, A, N = shape
    head_logits = torch.randn(E, B, K, A, N, generator=gen) * 2
    action = torch.randint(0, A, (B, K), generator=gen)
    target_pmf = torch.softmax(torch.randn(B, K, N, generator=gen), -1)
    support = torch.linspace(-5, 5, N)
    return head_logits, action, target_pmf, support


@pytest.mark.parametrize("weight", [0.0, 0.3])
def test_ensemble_matches_reference(gen: torch.Generator, weight: float) -> None:
    head_logits, action, target_pmf, support = make_inputs(gen)
    loss = ensemble_loss(head_logits, action, target_pmf, support, weight)
    assert loss.shape == (5,)
    expected = reference_ensemble(head_logits, action, target_pmf, support, weight)
    torch.testing.assert_close(loss.double(), expected, atol=1e-5, rtol=1e-6)


def test_diversity_lowers_the_loss_only_when_heads_differ(gen: torch.Generator) -> None:
    head_logits, action, target_pmf, support = make_inputs(gen)
    plain = ensemble_loss(head_logits, action, target_pmf, support, 0.0)
    diverse = ensemble_loss(head_logits, action, target_pmf, support, 0.5)
    assert (diverse < plain).all()
    same = head_logits[:1].expand_as(head_logits)
    torch.testing.assert_close(
        ensemble_loss(same, action, target_pmf, support, 0.5), ensemble_loss(same, action, target_pmf, support, 0.0)
    )


def test_diversity_term_is_bounded_by_one(gen: torch.Generator) -> None:
    """Two heads at opposite ends of the support: the largest spread there is gives a term of exactly 1."""
    _, action, target_pmf, support = make_inputs(gen, (2, 5, 3, 4, 11))
    head_logits = torch.full((2, 5, 3, 4, 11), -1e4)
    head_logits[0, ..., 0] = 0.0  # all mass on v_min
    head_logits[1, ..., -1] = 0.0  # all mass on v_max
    plain = ensemble_loss(head_logits, action, target_pmf, support, 0.0)
    diverse = ensemble_loss(head_logits, action, target_pmf, support, 1.0)
    torch.testing.assert_close(plain - diverse, torch.ones(5))


def test_one_head_has_no_diversity(gen: torch.Generator) -> None:
    head_logits, action, target_pmf, support = make_inputs(gen, (1, 5, 3, 4, 11))
    loss = ensemble_loss(head_logits, action, target_pmf, support, 0.5)
    assert torch.isfinite(loss).all()
    torch.testing.assert_close(loss, ensemble_loss(head_logits, action, target_pmf, support, 0.0))


def test_ensemble_gradcheck(gen: torch.Generator) -> None:
    head_logits, action, target_pmf, support = make_inputs(gen, (3, 2, 2, 3, 5))
    x = head_logits.double().requires_grad_()
    target, z = target_pmf.double(), support.double()
    assert torch.autograd.gradcheck(lambda h: ensemble_loss(h, action, target, z, 0.2), (x,), fast_mode=True)


def test_ensemble_rejects_mismatched_target(gen: torch.Generator) -> None:
    head_logits, action, _, support = make_inputs(gen)
    with pytest.raises(ValueError, match="target_pmf has N=7 but N=11"):
        ensemble_loss(head_logits, action, torch.zeros(5, 3, 7), support, 0.1)
