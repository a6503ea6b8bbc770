"""Which K-step graphs the zerocopy plan captures for the periodic schedule (host logic, CPU)."""

from __future__ import annotations

from contracts.config import build_config
from tests.trainer.execution.plans.test_fallback import SMALL
from trainer.algo.step import StepFlags
from trainer.execution.plans._capture import flag_patterns

PLAIN, VACCINE, BOTH = StepFlags(), StepFlags(vaccine=True), StepFlags(vaccine=True, causal=True)


def test_k10_with_vaccine_and_causal_needs_two_patterns() -> None:
    config = build_config({}, [*SMALL, "loss.vaccine=true", "loss.causal=true"])
    patterns = flag_patterns(config, 10)
    assert patterns == [(BOTH, *[PLAIN] * 9), (VACCINE, *[PLAIN] * 9)]


def test_k1_captures_each_step_kind_once() -> None:
    config = build_config({}, [*SMALL, "loss.vaccine=true", "loss.causal=true"])
    assert flag_patterns(config, 1) == [(BOTH,), (PLAIN,), (VACCINE,)]


def test_no_periodic_work_is_one_pattern() -> None:
    assert flag_patterns(build_config({}, SMALL), 4) == [(PLAIN,) * 4]


def test_k_not_dividing_the_period_covers_every_window() -> None:
    config = build_config({}, [*SMALL, "loss.vaccine=true", "loss.vaccine_every=3"])
    patterns = flag_patterns(config, 2)
    # windows start at 0, 2, 4: vaccine at steps 0, 3 -> (V, P), (P, V), (P, P)
    assert patterns == [(VACCINE, PLAIN), (PLAIN, VACCINE), (PLAIN, PLAIN)]
