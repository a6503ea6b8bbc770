"""`trainer.algo.rng`: keyed draws, their distributions, generators that advance, save and restore, and K runs'
draws in one call that are each run's own (the Triton kernel: `tests/trainer/execution/kernels/test_keyed.py`)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algo.rng import (
    NORMAL,
    RANDINT,
    UNIFORM,
    KeyedGenerator,
    KeyedRows,
    keyed_values,
    make_generator,
    normal_,
    randint_,
    rows_draw_,
    uniform_,
)
from trainer.runtime.checkpoint import decode_generator, encode_generator


def test_uniforms_are_uniform_on_0_1_and_normals_standard() -> None:
    n = 200_000
    keys, counters = torch.tensor([5]), torch.tensor([0])
    for dtype in (torch.float32, torch.float64):
        u = keyed_values(keys, counters, n, UNIFORM, dtype)[0].double()
        assert u.min() >= 0.0 and u.max() < 1.0
        # four standard errors: mean 1/2 (sd 1/sqrt(12 n)), variance 1/12; each tenth holds n/10
        assert abs(u.mean() - 0.5) < 4 / math.sqrt(12 * n)
        assert abs(u.var() - 1 / 12) < 4 * math.sqrt(1 / 180 / n)
        tenths = torch.histc(u, bins=10, min=0, max=1)
        chi2 = ((tenths - n / 10) ** 2 / (n / 10)).sum()
        assert chi2 < 27.9  # χ²(9) at p = 0.001
        z = keyed_values(keys, counters, n, NORMAL, dtype)[0].double()
        assert z.isfinite().all()
        assert abs(z.mean()) < 4 / math.sqrt(n) and abs(z.std() - 1) < 4 / math.sqrt(2 * n)
        assert abs((z.abs() < 1).double().mean() - 0.6827) < 0.005
    counts = torch.bincount(keyed_values(keys, counters, n, RANDINT, torch.int64, high=7)[0], minlength=7)
    assert counts.numel() == 7 and ((counts - n / 7) ** 2 / (n / 7)).sum() < 22.5  # χ²(6) at p = 0.001


def test_draws_of_other_counters_and_keys_are_uncorrelated() -> None:
    """A run's successive draws, and two runs' draws of the same counter (keys 1 and 2: seeds one apart)."""
    n = 100_000
    draws = keyed_values(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), n, UNIFORM, torch.float64)
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert abs(torch.corrcoef(draws[[a, b]])[0, 1]) < 4 / math.sqrt(n)
        assert abs(torch.corrcoef(torch.stack([draws[a][1:], draws[b][:-1]]))[0, 1]) < 4 / math.sqrt(n)  # shifted
    assert torch.equal(draws[0], keyed_values(torch.tensor([1]), torch.tensor([0]), n, UNIFORM, torch.float64)[0])


def test_a_keyed_generator_advances_restores_and_survives_a_checkpoint() -> None:
    generator = KeyedGenerator(3, "step")
    first = uniform_(torch.empty(4, 8), generator).clone()
    state = generator.get_state()
    second = uniform_(torch.empty(4, 8), generator).clone()
    assert not torch.equal(first, second) and generator.counter.item() == 2
    generator.set_state(state)
    assert torch.equal(uniform_(torch.empty(4, 8), generator), second)
    counter = generator.counter
    assert torch.equal(uniform_(torch.empty(4, 8), generator.manual_seed(3)), first)  # afresh, in place
    assert generator.counter is counter
    again = KeyedGenerator(3, "step")
    with pytest.raises(ValueError, match="not a keyed generator's state"):  # a checkpoint under run.rng: torch
        decode_generator(again, encode_generator(torch.Generator().manual_seed(3)))
    decode_generator(again, encode_generator(generator))
    assert torch.equal(normal_(torch.empty(5), again), normal_(torch.empty(5), generator))
    # streams of one seed differ; torch's own draws from it are its seed's
    assert not torch.equal(uniform_(torch.empty(8), KeyedGenerator(3, "explore")), first[0])
    assert torch.equal(
        torch.rand(3, generator=KeyedGenerator(3, "step")), torch.rand(3, generator=torch.Generator().manual_seed(3))
    )


def test_k_runs_draw_in_one_call_each_its_own_numbers() -> None:
    """Rows of keyed generators: every kind, all runs or some (run 0 left out keeps its counter); each generator,
    drawing alone after, goes on from where the rows left it."""
    seeds = [4, 5, 6]
    packed = [KeyedGenerator(s, "explore") for s in seeds]
    solos = [KeyedGenerator(s, "explore") for s in seeds]
    rows = KeyedRows.of(packed)
    assert rows is not None and KeyedRows.of(packed) is rows
    u = rows_draw_(torch.empty(3, 2, 5), packed, UNIFORM)
    z = rows_draw_(torch.empty(3, 7, dtype=torch.float64), packed, NORMAL)
    k = rows_draw_(torch.empty(2, 6, dtype=torch.int64), packed, RANDINT, runs=[2, 1], high=4)
    for i, solo in enumerate(solos):
        assert torch.equal(u[i], uniform_(torch.empty(2, 5), solo))
        assert torch.equal(z[i], normal_(torch.empty(7, dtype=torch.float64), solo))
    assert torch.equal(k[0], randint_(torch.empty(6, dtype=torch.int64), 4, solos[2]))
    assert torch.equal(k[1], randint_(torch.empty(6, dtype=torch.int64), 4, solos[1]))
    assert rows.counters.tolist() == [2, 3, 3] and packed[0].counter.item() == 2  # the generators see their rows
    assert torch.equal(uniform_(torch.empty(9), packed[1]), uniform_(torch.empty(9), solos[1]))


def test_rows_of_torch_generators_draw_what_each_draws_alone() -> None:
    """`run.rng: torch`: one launch a row, the numbers torch's own calls draw (a solo run's, as before)."""
    packed = [torch.Generator().manual_seed(s) for s in (1, 2)]
    draw = rows_draw_(torch.empty(2, 3, 1), packed, UNIFORM)
    random = rows_draw_(torch.empty(1, 3, 2, dtype=torch.int64), packed, RANDINT, runs=[1], high=5)
    solo = [torch.Generator().manual_seed(s) for s in (1, 2)]
    assert torch.equal(draw[0], torch.rand(3, 1, generator=solo[0]))
    assert torch.equal(draw[1], torch.rand(3, 1, generator=solo[1]))
    assert torch.equal(random[0], torch.randint(0, 5, (3, 2), generator=solo[1]))
    assert KeyedRows.of(packed) is None


def test_run_rng_chooses_the_generators() -> None:
    assert type(make_generator(7, "explore", "cpu", "torch")) is torch.Generator
    assert torch.equal(
        torch.rand(4, generator=make_generator(7, "explore", "cpu", "torch")),
        torch.rand(4, generator=torch.Generator().manual_seed(8)),
    )
    assert isinstance(make_generator(7, "explore", "cpu", "keyed"), KeyedGenerator)


def test_a_keyed_generator_is_a_row_of_one_pack_only() -> None:
    """Its key and counter become views of the pack's rows (what a captured graph holds): another pack of it, or
    the same in another order, is refused rather than moving them."""
    first, second = KeyedGenerator(1, "step"), KeyedGenerator(2, "step")
    rows = KeyedRows.of([first, second])
    with pytest.raises(ValueError, match="one pack only"):
        KeyedRows.of([second, first])
    with pytest.raises(ValueError, match="one pack only"):
        KeyedRows.of([first])
    assert KeyedRows.of([first, second]) is rows
