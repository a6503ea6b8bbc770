"""The sum-tree PER sampler: frequencies, weights, updates, schedule, validation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.algo.replay.sampler import PrioritizedSampler, sum_paths


def make(capacity: int = 64, alpha: float = 0.6, **kwargs: float | str) -> PrioritizedSampler:
    args = {"beta_start": 0.4, "beta_end": 1.0, "total_steps": 100, **kwargs}
    return PrioritizedSampler(capacity, "cpu", alpha=alpha, **args)  # type: ignore[arg-type]


def filled(capacity: int, priorities: torch.Tensor, alpha: float = 0.6, search: str = "tree") -> PrioritizedSampler:
    sampler = make(capacity, alpha, search=search)
    slots = torch.arange(priorities.numel())
    sampler.on_write(slots, priorities.numel())
    sampler.update(slots, priorities - sampler.eps)  # p_i = |loss| + eps = priorities
    return sampler


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(("alpha", "search"), [(0.0, "tree"), (0.6, "tree"), (1.0, "tree"), (0.6, "cdf")])
def test_sampling_frequencies_follow_priorities(alpha: float, search: str) -> None:
    n = 50  # capacity 64: 14 empty leaves must never be drawn
    gen = torch.Generator().manual_seed(1)
    priorities = torch.rand(n, generator=gen, dtype=torch.float64) * 4 + 0.1
    sampler = filled(64, priorities, alpha, search)
    counts = torch.zeros(64, dtype=torch.float64)
    draws = 0
    for _ in range(100):
        index, _ = sampler.sample(997, 0, gen)
        counts += torch.bincount(index, minlength=64).double()
        draws += 997
    assert counts[n:].sum() == 0
    expected = priorities.pow(alpha) / priorities.pow(alpha).sum() * draws
    chi2 = float(((counts[:n] - expected) ** 2 / expected).sum())
    assert chi2 < chi2_critical(n - 1)
    # and the test has power: uniform expectations are rejected when alpha > 0
    if alpha > 0:
        uniform = torch.full((n,), draws / n, dtype=torch.float64)
        assert float(((counts[:n] - uniform) ** 2 / uniform).sum()) > chi2_critical(n - 1)


def test_tree_descent_and_cdf_search_draw_the_same_slots() -> None:
    gen = torch.Generator().manual_seed(4)
    priorities = torch.rand(90, generator=gen, dtype=torch.float64) * torch.randint(0, 2, (90,), generator=gen)
    tree, cdf = filled(100, priorities + 1e-3, 0.7, "tree"), filled(100, priorities + 1e-3, 0.7, "cdf")
    for step in range(5):
        state = gen.get_state()
        want = tree.sample(512, step, gen)
        gen.set_state(state)
        got = cdf.sample(512, step, gen)
        torch.testing.assert_close(got, want)
        loss = torch.rand(512, generator=gen) * 4  # the write-back between steps: the cdf mode keeps only leaves
        tree.update(want[0], loss)
        cdf.update(got[0], loss)
        torch.testing.assert_close(cdf.total(), tree.total())


def _ops_run_by(fn: Callable[[], object]) -> int:
    """ATen operations `fn` dispatches: on a GPU, about the kernels it launches."""
    count = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            nonlocal count
            count += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return count


def test_cdf_write_back_costs_a_few_kernels_not_one_per_tree_level() -> None:
    """The point of search="cdf" inside a CUDA graph: no log2(P) level sums per step (P = 2^20 in the bench)."""
    index, loss = torch.arange(0, 4096, 4), torch.rand(1024)
    tree, cdf = make(1 << 16, search="tree"), make(1 << 16, search="cdf")
    tree_ops, cdf_ops = _ops_run_by(lambda: tree.update(index, loss)), _ops_run_by(lambda: cdf.update(index, loss))
    assert tree_ops >= tree.depth and cdf_ops <= tree_ops - tree.depth
    sample_ops = {s.search: _ops_run_by(lambda s=s: s.sample(1024, 3, torch.Generator())) for s in (tree, cdf)}
    assert sample_ops["cdf"] < sample_ops["tree"] / 2


def test_a_checkpoint_of_a_cdf_run_resumes_under_the_tree_descent() -> None:
    """search="cdf" keeps only the leaves current; loading into a descending sampler rebuilds the sums."""
    gen = torch.Generator().manual_seed(5)
    cdf = filled(64, torch.rand(50, generator=gen, dtype=torch.float64) + 0.1, 0.6, "cdf")
    cdf.update(torch.arange(10), torch.rand(10, generator=gen) * 5)
    tree = make(64, search="tree")
    tree.load_state_dict({k: v.clone() for k, v in cdf.state_dict().items()})
    torch.testing.assert_close(tree.total(), cdf.total())
    want = cdf.sample(256, 7, torch.Generator().manual_seed(1))
    torch.testing.assert_close(tree.sample(256, 7, torch.Generator().manual_seed(1)), want)


def test_importance_weights_match_formula() -> None:
    gen = torch.Generator().manual_seed(2)
    priorities = torch.rand(30, generator=gen, dtype=torch.float64) + 0.05
    sampler = filled(32, priorities, alpha=0.7)
    step = 40
    index, weight = sampler.sample(256, step, gen)
    beta = 0.4 + (1.0 - 0.4) * step / 100
    prob = priorities.pow(0.7) / priorities.pow(0.7).sum()
    w = (30 * prob[index]).pow(-beta)
    torch.testing.assert_close(weight, (w / w.max()).float())
    assert weight.dtype == torch.float32 and float(weight.max()) == 1.0


@pytest.mark.parametrize("step", [0, 17, 50, 99, 100, 250])
def test_a_tensor_step_gives_the_same_weights_as_an_int_bit_for_bit(step: int) -> None:
    """Eager passes the step as an int, graphs as a device scalar: the weights must not differ by rounding."""
    priorities = torch.rand(30, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.05
    sampler = filled(32, priorities, alpha=0.6)
    index, weight = sampler.sample(64, step, torch.Generator().manual_seed(4))
    again, tensor_weight = sampler.sample(64, torch.tensor(step), torch.Generator().manual_seed(4))
    assert torch.equal(index, again) and torch.equal(weight, tensor_weight)


def test_beta_schedule_is_linear_and_clamped() -> None:
    sampler = make(beta_start=0.2, beta_end=0.8)
    assert sampler.beta(0) == pytest.approx(0.2)
    assert sampler.beta(50) == pytest.approx(0.5)
    assert sampler.beta(1000) == pytest.approx(0.8)
    assert float(sampler.beta(torch.tensor(25))) == pytest.approx(0.35)


def test_duplicate_indices_in_update_keep_tree_consistent() -> None:
    sampler = filled(16, torch.ones(16, dtype=torch.float64), alpha=1.0)
    index = torch.tensor([3, 3, 3, 7, 7])
    sampler.update(index, torch.tensor([2.0, 2.0, 2.0, 5.0, 5.0]))
    leaves = sampler.priorities()
    assert leaves[3] == pytest.approx(2.0 + sampler.eps)
    assert leaves[7] == pytest.approx(5.0 + sampler.eps)
    assert float(sampler.total()) == pytest.approx(float(leaves.sum()))
    assert float(sampler.max_priority) == pytest.approx(5.0 + sampler.eps)


@pytest.mark.parametrize("alpha", [1.0, 0.6])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("search", ["tree", "cdf"])
def test_a_slot_drawn_twice_keeps_its_larger_priority_whatever_the_write_order(
    search: str, compiled: bool, alpha: float
) -> None:
    """Two draws of one slot with different losses: the larger wins, in any order, so the result does
    not depend on which duplicate a GPU writes last (eager and graph runs must agree bit for bit). Eagerly
    by ATen's scatter_reduce, compiled by the pairwise max (`max_of_duplicates`), which raises to α after
    taking the max: the leaf is the largest (|loss| + ε)^α either way."""
    results = []
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]):
        sampler = filled(16, torch.ones(16, dtype=torch.float64), alpha=alpha, search=search)
        index, loss = torch.tensor([5, 5, 9, 5]), torch.tensor([2.0, 6.0, 3.0, 4.0])
        update = torch.compile(sampler.update, backend="aot_eager", fullgraph=True) if compiled else sampler.update
        update(index[order], loss[order])
        results.append(sampler.priorities().clone())
        want = torch.tensor([6.0, 3.0], dtype=torch.float64).add(sampler.eps).pow(alpha)
        torch.testing.assert_close(sampler.priorities()[[5, 9]], want, rtol=1e-15, atol=0.0)
    assert all(torch.equal(results[0], other) for other in results[1:])


def test_tree_sums_stay_exact_after_random_updates() -> None:
    gen = torch.Generator().manual_seed(3)
    sampler = make(100, alpha=0.5)
    sampler.on_write(torch.arange(100), 100)
    for _ in range(50):
        index = torch.randint(0, 100, (32,), generator=gen)
        sampler.update(index, torch.randn(32, generator=gen) * 3)
    tree = sampler.tree
    internal = torch.arange(1, sampler.leaves)
    torch.testing.assert_close(tree[internal], tree[2 * internal] + tree[2 * internal + 1])
    torch.testing.assert_close(sampler.total(), sampler.priorities().sum())


def test_new_rows_get_max_priority_and_nan_loss_is_ignored() -> None:
    sampler = make(8, alpha=1.0)
    sampler.on_write(torch.arange(4), 4)
    sampler.update(torch.tensor([0, 1]), torch.tensor([3.0, float("nan")]))
    assert float(sampler.priorities()[1]) == pytest.approx(1.0)  # nan -> the max before this update
    assert torch.isfinite(sampler.tree).all()
    sampler.on_write(torch.tensor([4]), 5)
    assert float(sampler.priorities()[4]) == pytest.approx(3.0 + sampler.eps)
    assert int(sampler.size) == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 1.5}, r"replay.alpha must be in \[0, 1\], got 1.5"),
        ({"beta_start": -0.1}, r"replay.beta_start must be in \[0, 1\]"),
        ({"beta_end": 2.0}, r"replay.beta_end must be in \[0, 1\]"),
        ({"total_steps": 0}, "total_steps"),
        ({"eps": 0.0}, "priority eps"),
        ({"search": "linear"}, "search must be 'tree' or 'cdf'"),
    ],
)
def test_bad_parameters_raise_clear_errors(kwargs: dict[str, float | str], message: str) -> None:
    args = {"alpha": 0.6, "beta_start": 0.4, "beta_end": 1.0, "total_steps": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        PrioritizedSampler(16, "cpu", **args)  # type: ignore[arg-type]


def test_state_dict_round_trip_and_capacity_mismatch() -> None:
    sampler = filled(16, torch.arange(1, 11, dtype=torch.float64))
    other = make(16)
    other.load_state_dict({k: v.clone() for k, v in sampler.state_dict().items()})
    a = sampler.sample(32, 5, torch.Generator().manual_seed(9))
    b = other.sample(32, 5, torch.Generator().manual_seed(9))
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="capacity changed"):
        make(64).load_state_dict(sampler.state_dict())


def test_level_sums_are_each_pairs_sum_bit_for_bit() -> None:
    """`_sum_levels` adds each pair's columns: the values the reduction over pairs (`sum(dim=1)`) gave, bit for bit,
    over leaves of magnitudes 1e-6 .. 1e6 (where the order of additions would show)."""
    sampler = make(1000)
    gen = torch.Generator().manual_seed(3)
    leaves = 10.0 ** (torch.rand(1000, generator=gen, dtype=torch.float64) * 12 - 6)
    sampler.tree[sampler.leaves : sampler.leaves + 1000] = leaves
    want = sampler.tree.clone()
    for depth in range(sampler.depth - 1, -1, -1):
        want[1 << depth : 2 << depth] = want[2 << depth : 4 << depth].view(-1, 2).sum(dim=1)
    sampler._sum_levels()
    assert torch.equal(sampler.tree, want)


def test_summing_the_changed_paths_of_stacked_trees_gives_the_level_sums() -> None:
    """`sum_paths` over three stacked trees, leaves written in two of them (a slot twice): each tree equals a
    sampler's own after the same writes."""
    gen = torch.Generator().manual_seed(5)
    solos = [make(100) for _ in range(3)]
    for sampler in solos:
        sampler.on_write(torch.arange(60), 60)
        sampler.update(torch.arange(60), torch.rand(60, generator=gen, dtype=torch.float64))
    trees = torch.stack([s.tree for s in solos])  # [R, 2P]
    rows = torch.tensor([0, 0, 2, 2, 2])
    slots = torch.tensor([7, 61, 3, 3, 99])
    values = torch.rand(5, generator=gen, dtype=torch.float64)
    values[3] = values[2]  # a slot written twice gets one value (new rows' max priority)
    trees[rows, slots + solos[0].leaves] = values
    sum_paths(trees, rows, slots + solos[0].leaves, solos[0].depth)
    for row, slot, value in zip(rows.tolist(), slots.tolist(), values, strict=True):
        solos[row].tree[slot + solos[row].leaves] = value
    for row, sampler in enumerate(solos):
        sampler._sum_levels()
        assert torch.equal(trees[row], sampler.tree), row
