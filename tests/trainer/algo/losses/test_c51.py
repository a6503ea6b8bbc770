"""C51 projection, Double-DQN action, cross entropy, expected Q and dueling against float64 references."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from trainer.algo.losses.c51 import (
    c51_cross_entropy,
    categorical_projection,
    double_dqn_action,
    dueling_logits,
    expected_q,
)


def random_pmf(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.softmax(torch.randn(*shape, generator=gen) * 2, dim=-1)


def reference_projection(
    next_pmf: torch.Tensor, reward: torch.Tensor, done: torch.Tensor, gamma: float, support: torch.Tensor
) -> torch.Tensor:
    """Brute force, one atom at a time, in float64 (Bellemare et al. 2017, Algorithm 1)."""
    B, K, N = next_pmf.shape
    z = support.double().tolist()
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / (N - 1)
    out = torch.zeros(B, K, N, dtype=torch.float64)
    for i in range(B):
        r, d = float(reward[i]), float(done[i])
        for k in range(K):
            for j in range(N):
                p = float(next_pmf[i, k, j])
                tz = min(max(r + gamma * (1.0 - d) * z[j], v_min), v_max)
                b = min(max((tz - v_min) / dz, 0.0), N - 1.0)
                lower, upper = math.floor(b), math.ceil(b)
                if lower == upper:
                    out[i, k, lower] += p
                else:
                    out[i, k, lower] += p * (upper - b)
                    out[i, k, upper] += p * (b - lower)
    return out


@pytest.mark.parametrize(("v_min", "v_max", "atoms"), [(-10.0, 10.0, 51), (-3.0, 7.0, 11)])
def test_projection_matches_brute_force(gen: torch.Generator, v_min: float, v_max: float, atoms: int) -> None:
    B, K = 8, 3
    support = torch.linspace(v_min, v_max, atoms)
    next_pmf = random_pmf(gen, B, K, atoms)
    reward = torch.randn(B, generator=gen) * 3
    done = (torch.rand(B, generator=gen) < 0.3).float()
    target_pmf = categorical_projection(next_pmf, reward, done, 0.99, support)
    assert target_pmf.shape == (B, K, atoms)
    expected = reference_projection(next_pmf, reward, done, 0.99, support)
    torch.testing.assert_close(target_pmf.double(), expected, atol=1e-5, rtol=0)


def test_projection_conserves_mass(gen: torch.Generator) -> None:
    support = torch.linspace(-10, 10, 51)
    next_pmf = random_pmf(gen, 64, 3, 51)
    reward = torch.randn(64, generator=gen) * 20  # many clamp at either end
    done = (torch.rand(64, generator=gen) < 0.5).float()
    target_pmf = categorical_projection(next_pmf, reward, done, 0.9, support)
    assert (target_pmf >= 0).all()
    torch.testing.assert_close(target_pmf.sum(-1), torch.ones(64, 3), atol=1e-5, rtol=0)


def test_projection_integral_b_keeps_all_mass_on_the_atom(gen: torch.Generator) -> None:
    # dz = 1 and gamma = 1 with integer rewards: every tz lands exactly on an atom (b integral)
    support = torch.linspace(-10, 10, 21)
    B, K, N = 7, 2, 21
    next_pmf = random_pmf(gen, B, K, N)
    reward = torch.tensor([-3.0, -1.0, 0.0, 1.0, 2.0, 3.0, 0.0])
    done = torch.zeros(B)
    target_pmf = categorical_projection(next_pmf, reward, done, 1.0, support)
    # the exact answer: atom j moves to atom clamp(j + r), nothing is split or lost
    expected = torch.zeros(B, K, N, dtype=torch.float64)
    for i in range(B):
        for j in range(N):
            expected[i, :, min(max(j + int(reward[i]), 0), N - 1)] += next_pmf[i, :, j].double()
    torch.testing.assert_close(target_pmf.double(), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(target_pmf.sum(-1), torch.ones(B, K), atol=1e-6, rtol=0)


def test_projection_terminal_puts_all_mass_at_the_reward(gen: torch.Generator) -> None:
    support = torch.linspace(-10, 10, 51)  # dz = 0.4
    next_pmf = random_pmf(gen, 3, 2, 51)
    reward = torch.tensor([2.0, 0.3, -10.0])
    target_pmf = categorical_projection(next_pmf, reward, torch.ones(3), 0.99, support)
    # r = 2.0 is atom 30; r = 0.3 splits 0.25 / 0.75 between atoms 25 (z=0) and 26 (z=0.4); -10 is atom 0
    expected = torch.zeros(3, 2, 51)
    expected[0, :, 30] = 1.0
    expected[1, :, 25] = 0.25
    expected[1, :, 26] = 0.75
    expected[2, :, 0] = 1.0
    torch.testing.assert_close(target_pmf, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("reward", "atom"), [(100.0, 50), (-100.0, 0)])
@pytest.mark.parametrize(("v_min", "v_max"), [(-10.0, 10.0), (-0.3, 7.0)])
def test_projection_clamps_at_both_ends(
    gen: torch.Generator, reward: float, atom: int, v_min: float, v_max: float
) -> None:
    # on [-0.3, 7] the float32 b of v_max is 50.000004: the last atom must still get all the mass
    support = torch.linspace(v_min, v_max, 51)
    next_pmf = random_pmf(gen, 4, 3, 51)
    target_pmf = categorical_projection(next_pmf, torch.full((4,), reward), torch.zeros(4), 0.99, support)
    expected = torch.zeros(4, 3, 51)
    expected[:, :, atom] = 1.0
    torch.testing.assert_close(target_pmf, expected, atol=1e-6, rtol=0)


def test_projection_of_a_poisoned_sample_is_nan_and_leaves_the_others_alone(gen: torch.Generator) -> None:
    # the guard must see a NaN loss, not an out-of-range index (a device-side assert on CUDA)
    support = torch.linspace(-10, 10, 51)
    next_pmf = random_pmf(gen, 3, 2, 51)
    reward = torch.tensor([0.5, float("nan"), float("inf")])
    done = torch.zeros(3)
    target_pmf = categorical_projection(next_pmf, reward, done, 0.99, support)
    assert target_pmf[1].isnan().any()
    clean = categorical_projection(next_pmf[[0]], reward[[0]], done[[0]], 0.99, support)
    torch.testing.assert_close(target_pmf[0], clean[0])
    expected_inf = torch.zeros(2, 51)
    expected_inf[:, 50] = 1.0  # an infinite reward clamps to v_max
    torch.testing.assert_close(target_pmf[2], expected_inf)


def reference_expected_q(logits: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    B, K, A, _ = logits.shape
    q = torch.zeros(B, K, A, dtype=torch.float64)
    for i in range(B):
        for k in range(K):
            for a in range(A):
                row = [float(x) for x in logits[i, k, a]]
                top = max(row)
                weights = [math.exp(x - top) for x in row]
                total = sum(weights)
                q[i, k, a] = sum(w / total * float(z) for w, z in zip(weights, support, strict=True))
    return q


def test_expected_q_matches_reference(gen: torch.Generator) -> None:
    support = torch.linspace(-5, 5, 11)
    logits = torch.randn(4, 3, 5, 11, generator=gen) * 2
    torch.testing.assert_close(
        expected_q(logits, support).double(), reference_expected_q(logits, support), atol=1e-5, rtol=0
    )


def test_double_dqn_picks_the_online_argmax_of_expected_q(gen: torch.Generator) -> None:
    support = torch.linspace(-10, 10, 51)
    next_logits_online = torch.randn(16, 3, 5, 51, generator=gen) * 3
    a_star = double_dqn_action(next_logits_online, support)
    assert a_star.shape == (16, 3)
    assert a_star.dtype == torch.int64
    q = reference_expected_q(next_logits_online, support)
    for i in range(16):
        for k in range(3):
            assert int(a_star[i, k]) == max(range(5), key=lambda a, i=i, k=k: float(q[i, k, a]))


def test_double_dqn_maximises_expected_q_not_the_largest_logit() -> None:
    support = torch.tensor([-1.0, 0.0, 1.0])
    logits = torch.zeros(1, 1, 2, 3)
    logits[0, 0, 0] = torch.tensor([9.0, 0.0, 0.0])  # the largest logit, on the worst atom: Q ~ -1
    logits[0, 0, 1] = torch.tensor([0.0, 0.0, 2.0])  # Q > 0
    assert double_dqn_action(logits, support).tolist() == [[1]]


def reference_cross_entropy(logits: torch.Tensor, action: torch.Tensor, target_pmf: torch.Tensor) -> torch.Tensor:
    B, K, _, N = logits.shape
    out = torch.zeros(B, dtype=torch.float64)
    for i in range(B):
        for k in range(K):
            row = [float(x) for x in logits[i, k, int(action[i, k])]]
            log_total = math.log(sum(math.exp(x) for x in row))
            out[i] += -sum(float(target_pmf[i, k, n]) * (row[n] - log_total) for n in range(N)) / K
    return out


def test_cross_entropy_matches_reference(gen: torch.Generator) -> None:
    logits = torch.randn(6, 3, 5, 21, generator=gen) * 2
    action = torch.randint(0, 5, (6, 3), generator=gen)
    target_pmf = random_pmf(gen, 6, 3, 21)
    loss = c51_cross_entropy(logits, action, target_pmf)
    assert loss.shape == (6,)
    torch.testing.assert_close(loss.double(), reference_cross_entropy(logits, action, target_pmf), atol=1e-5, rtol=1e-6)


def test_cross_entropy_gradcheck_and_target_gets_no_gradient(gen: torch.Generator) -> None:
    logits = torch.randn(3, 2, 4, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    action = torch.randint(0, 4, (3, 2), generator=gen)
    target_pmf = random_pmf(gen, 3, 2, 7).double().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: c51_cross_entropy(x, action, target_pmf), (logits,), fast_mode=True)
    c51_cross_entropy(logits, action, target_pmf).sum().backward()
    assert target_pmf.grad is None
    # only the data action's logits receive gradient
    taken = torch.zeros(3, 2, 4, dtype=torch.bool)
    taken[torch.arange(3)[:, None], torch.arange(2)[None, :], action] = True
    assert logits.grad is not None
    assert (logits.grad[~taken] == 0).all()
    assert (logits.grad[taken].abs().sum(-1) > 0).all()


def test_cross_entropy_is_minimal_when_prediction_equals_target(gen: torch.Generator) -> None:
    target_pmf = random_pmf(gen, 4, 2, 11)
    action = torch.zeros(4, 2, dtype=torch.int64)
    matching = target_pmf.log()[:, :, None, :].expand(4, 2, 3, 11)
    other = torch.randn(4, 2, 3, 11, generator=gen)
    entropy = -(target_pmf * target_pmf.log()).sum(-1).mean(-1)
    torch.testing.assert_close(c51_cross_entropy(matching, action, target_pmf), entropy, atol=1e-5, rtol=0)
    assert (c51_cross_entropy(other, action, target_pmf) > entropy).all()


@pytest.mark.parametrize("value_branches", [1, 3])
def test_dueling_advantages_average_to_zero(gen: torch.Generator, value_branches: int) -> None:
    value = torch.randn(4, value_branches, 1, 11, generator=gen, dtype=torch.float64)
    advantage = torch.randn(4, 3, 5, 11, generator=gen, dtype=torch.float64)
    logits = dueling_logits(value, advantage)
    assert logits.shape == (4, 3, 5, 11)
    # mean over actions recovers V; a per-(branch, atom) shift of A changes nothing
    torch.testing.assert_close(logits.mean(2), value.expand(4, 3, 1, 11)[:, :, 0], atol=1e-12, rtol=0)
    shift = torch.randn(4, 3, 1, 11, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(dueling_logits(value, advantage + shift), logits, atol=1e-12, rtol=0)
    for i, k, a in [(0, 0, 0), (3, 2, 4), (1, 1, 2)]:
        expected = value[i, min(k, value_branches - 1), 0] + advantage[i, k, a] - advantage[i, k].mean(0)
        torch.testing.assert_close(logits[i, k, a], expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: categorical_projection(torch.ones(2, 3), torch.zeros(2), torch.zeros(2), 0.9, torch.ones(3)),
            r"next_pmf must be \[B, K, N\]",
        ),
        (
            lambda: categorical_projection(torch.ones(2, 1, 3), torch.zeros(4), torch.zeros(2), 0.9, torch.ones(3)),
            "reward has B=4 but B=2",
        ),
        (
            lambda: categorical_projection(torch.ones(2, 1, 3), torch.zeros(2), torch.zeros(2), 0.9, torch.ones(5)),
            "support has N=5 but N=3",
        ),
        (
            lambda: c51_cross_entropy(
                torch.ones(2, 1, 4, 3), torch.zeros(2, 2, dtype=torch.int64), torch.ones(2, 1, 3)
            ),
            "action has K=2 but K=1",
        ),
        (lambda: expected_q(torch.ones(2, 1, 4, 3), torch.ones(4)), "support has N=4 but N=3"),
        (lambda: dueling_logits(torch.ones(2, 2, 1, 3), torch.ones(2, 3, 4, 3)), r"value must be \[B, K, 1, N\]"),
        (lambda: dueling_logits(torch.ones(2, 1, 4, 3), torch.ones(2, 3, 4, 3)), r"value must be \[B, K, 1, N\]"),
    ],
)
def test_bad_shapes_raise_one_line_errors(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
