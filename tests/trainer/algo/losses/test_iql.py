"""IQL expectile loss against the hand-written asymmetric squared error."""

from __future__ import annotations

import pytest
import torch

from trainer.algo.losses.iql import expectile_loss


@pytest.mark.parametrize("expectile", [0.7, 0.2])
def test_expectile_matches_formula_for_both_signs(gen: torch.Generator, expectile: float) -> None:
    value = torch.randn(32, generator=gen)
    q_target = torch.randn(32, generator=gen)
    diff = (q_target.double() - value.double()).tolist()
    assert min(diff) < 0 < max(diff), "inputs must cover both signs"
    expected = torch.tensor([(1 - expectile if d < 0 else expectile) * d * d for d in diff], dtype=torch.float64)
    loss = expectile_loss(value, q_target, expectile)
    assert loss.shape == (32,)
    torch.testing.assert_close(loss.double(), expected, atol=1e-6, rtol=1e-6)


def test_expectile_one_half_is_half_the_squared_error(gen: torch.Generator) -> None:
    value = torch.randn(16, generator=gen)
    q_target = torch.randn(16, generator=gen)
    torch.testing.assert_close(expectile_loss(value, q_target, 0.5), 0.5 * (q_target - value) ** 2)


def test_expectile_above_one_half_pulls_value_up() -> None:
    # minimising over a constant V the upper expectile lies above the mean of the targets
    q_target = torch.tensor([0.0, 0.0, 0.0, 4.0])
    value = torch.zeros(1, requires_grad=True)
    optimiser = torch.optim.SGD([value], lr=0.1)
    for _ in range(500):
        optimiser.zero_grad()
        expectile_loss(value.expand(4), q_target, 0.9).mean().backward()
        optimiser.step()
    # first-order condition: 0.9 (4 - v) = 0.1 * 3 v  ->  v = 3.6 / 1.2 = 3.0
    assert abs(float(value.detach()) - 3.0) < 1e-3


def test_expectile_gradcheck_and_target_gets_no_gradient(gen: torch.Generator) -> None:
    value = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
    q_target = torch.randn(6, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: expectile_loss(v, q_target, 0.7), (value,))
    expectile_loss(value, q_target, 0.7).sum().backward()
    assert q_target.grad is None


@pytest.mark.parametrize(
    ("value", "q_target", "expectile", "message"),
    [
        (torch.zeros(4), torch.zeros(3), 0.7, "q_target has B=3 but B=4"),
        (torch.zeros(4, 1), torch.zeros(4), 0.7, r"value must be \[B\]"),
        (torch.zeros(4), torch.zeros(4), 1.0, r"expectile must lie in \(0, 1\)"),
    ],
)
def test_bad_input_raises(value: torch.Tensor, q_target: torch.Tensor, expectile: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expectile_loss(value, q_target, expectile)
