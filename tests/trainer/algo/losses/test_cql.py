"""CQL penalty against a float64 reference and its defining property (zero iff the data action dominates)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algo.losses.cql import cql_penalty


def reference_cql(q: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    B, K, _ = q.shape
    out = torch.zeros(B, dtype=torch.float64)
    for i in range(B):
        for k in range(K):
            row = [float(x) for x in q[i, k]]
            top = max(row)
            logsumexp = top + math.log(sum(math.exp(x - top) for x in row))
            out[i] += (logsumexp - row[int(action[i, k])]) / K
    return out


def test_cql_matches_reference_and_is_positive(gen: torch.Generator) -> None:
    q = torch.randn(16, 3, 5, generator=gen) * 4
    action = torch.randint(0, 5, (16, 3), generator=gen)
    penalty = cql_penalty(q, action)
    assert penalty.shape == (16,)
    torch.testing.assert_close(penalty.double(), reference_cql(q, action), atol=1e-5, rtol=1e-6)
    assert (penalty > 0).all()


def test_cql_is_zero_when_the_data_action_dominates(gen: torch.Generator) -> None:
    action = torch.randint(0, 5, (8, 3), generator=gen)
    q = torch.randn(8, 3, 5, generator=gen)
    q.scatter_(-1, action[:, :, None], 100.0)  # Q(s, a_data) >> every other action
    penalty = cql_penalty(q, action)
    assert (penalty.abs() < 1e-6).all()
    # the same Q with another action in the data is penalised by about the gap
    other = (action + 1) % 5
    assert (cql_penalty(q, other) > 90).all()


def test_cql_gradcheck(gen: torch.Generator) -> None:
    q = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    action = torch.randint(0, 4, (3, 2), generator=gen)
    assert torch.autograd.gradcheck(lambda x: cql_penalty(x, action), (q,))
    # the data action is pushed up, every other action down
    cql_penalty(q, action).sum().backward()
    assert q.grad is not None
    data_grad = q.grad.gather(-1, action[:, :, None])
    assert (data_grad < 0).all()
    assert (q.grad.sum(-1).abs() < 1e-12).all()


def test_cql_rejects_mismatched_action() -> None:
    with pytest.raises(ValueError, match="action has K=2 but K=3"):
        cql_penalty(torch.zeros(4, 3, 5), torch.zeros(4, 2, dtype=torch.int64))
