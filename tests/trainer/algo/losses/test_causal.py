"""Causal probe: the intervened batch and the per-feature effects on Q."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from trainer.algo.losses.causal import intervene, intervention_effects


def test_intervene_replaces_exactly_one_feature_per_copy(gen: torch.Generator) -> None:
    B, F = 6, 4
    obs = torch.randn(B, F, generator=gen)
    perm = torch.randperm(B, generator=gen)
    out = intervene(obs, perm)
    assert out.shape == (F, B, F)
    for f in range(F):
        for b in range(B):
            for g in range(F):
                expected = obs[int(perm[b]), f] if g == f else obs[b, g]
                assert out[f, b, g] == expected


def linear_q(obs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A Q function [..., F] -> [..., K, A] linear in the state."""
    return torch.einsum("...f,fka->...ka", obs, weight)


def test_effects_match_reference_and_vanish_for_an_ignored_feature(gen: torch.Generator) -> None:
    B, F, K, A = 32, 5, 2, 3
    obs = torch.randn(B, F, generator=gen, dtype=torch.float64)
    perm = torch.randperm(B, generator=gen)
    weight = torch.randn(F, K, A, generator=gen, dtype=torch.float64)
    weight[2] = 0.0  # Q ignores feature 2
    q_clean = linear_q(obs, weight)  # [B, K, A]
    q_intervened = linear_q(intervene(obs, perm), weight)  # [F, B, K, A]
    effects = intervention_effects(q_clean, q_intervened)
    assert effects.shape == (F,)
    assert effects[2] == 0
    assert (effects[[0, 1, 3, 4]] > 0).all()
    for f in range(F):
        total = 0.0
        for b in range(B):
            delta = float(obs[int(perm[b]), f] - obs[b, f])
            total += sum(abs(delta * float(weight[f, k, a])) for k in range(K) for a in range(A))
        assert abs(float(effects[f]) - total / (B * K * A)) < 1e-10


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: intervene(torch.zeros(4, 3), torch.zeros(5, dtype=torch.int64)), "perm has B=5 but B=4"),
        (
            lambda: intervention_effects(torch.zeros(4, 2, 3), torch.zeros(6, 4, 2, 5)),
            "q_intervened has A=5 but A=3",
        ),
    ],
)
def test_bad_shapes_raise(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
