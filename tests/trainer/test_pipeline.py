"""The job pipeline's commands as the trainer CLI reads them: every step of contracts/pipeline.py
parses back with the CLI itself, so an option renamed in the CLI fails here, not on a cluster."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import typer.main

from contracts.pipeline import (
    BENCH_STEP,
    BEST_STEP,
    CHECK_STEP,
    PIPELINE,
    RESOLVE_STEP,
    RESOLVED_CONFIG,
    SUGGEST_STEP,
    TRAIN_STEP,
    TRIAL_STEP,
    Node,
    Step,
)
from trainer.cli import app

# One value per placeholder of contracts/pipeline.py, as a backend would bind them.
BOUND = {
    "config": "/jobs/j/submitted.json",
    "model": "dqn",
    "train_epochs": "3",
    "pool": "h100",
    "pools": "/etc/pools.yaml",
    "job_id": "j",
    "commit": "abc",
    "run": "/jobs/j",
    "checkpoints": "/jobs/j/checkpoints",
    "storage": "sqlite:////jobs/j/optuna.db",
    "study": "foxhunt-j",
    "trials": "2",
    "pack": "0,1",
    "status": "Succeeded",
    "duration": "12.5",
    "failures": "[]",
}


class RejectedError(ValueError):
    """The trainer CLI does not accept an argument list."""


@functools.cache
def _cli() -> Any:
    """The trainer's CLI as Typer builds it (Click objects; Typer vendors its own Click, so duck-typed)."""
    return typer.main.get_command(app)


def parse_trainer_args(argv: list[str]) -> dict[str, Any]:
    """Parse `argv` with the trainer CLI itself, running nothing: the leaf command's parameters."""
    node, rest = _cli(), list(argv)
    while rest and rest[0] in getattr(node, "commands", {}):
        node = node.commands[rest.pop(0)]
    if hasattr(node, "commands"):
        raise RejectedError(f"{' '.join(argv)!r} names no trainer command")
    try:
        context = node.make_context(node.name, rest)
    except Exception as error:  # Typer's vendored click raises its own UsageError/BadParameter
        raise RejectedError(f"the trainer CLI rejects {' '.join(argv)!r}: {error}") from error
    return dict(context.params)


def calls() -> list[tuple[str, Step, dict[str, str]]]:
    """Every step as each of its nodes calls it (train twice: resolved config, best config), and on-exit."""
    out = [(node.name, node.run, node.values(BOUND)) for _, node in PIPELINE.graph.walk() if isinstance(node.run, Step)]
    return [*out, ("on-exit", PIPELINE.on_exit, BOUND), ("bench", BENCH_STEP, {"out": "/bench/h100/1"})]


@pytest.mark.parametrize("name, step, values", calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_step_command_parses_with_the_trainer_cli(name: str, step: Step, values: dict[str, str]) -> None:
    params = parse_trainer_args(step.command(values))
    assert params, name
    if step is RESOLVE_STEP:  # the one step that reads the config as submitted
        assert str(params["config"]) == BOUND["config"]
    elif "config" in params:
        assert str(params["config"]) in ("/jobs/j/config.json", "/jobs/j/hyperopt/best-config.json")


def test_resolve_checks_the_jobs_asks_and_writes_the_config_every_later_step_reads() -> None:
    resolve = parse_trainer_args(RESOLVE_STEP.command(BOUND))
    assert (resolve["model"], resolve["train_epochs"], resolve["pool"]) == ("dqn", 3, "h100")
    assert str(resolve["pools_file"]) == BOUND["pools"]
    resolved = RESOLVED_CONFIG.format(**BOUND)
    assert str(resolve["out"]) == resolved
    train = PIPELINE.graph.node("train")
    for step, values in [(s, BOUND) for s in (CHECK_STEP, SUGGEST_STEP, TRIAL_STEP, BEST_STEP)] + [
        (TRAIN_STEP, train.values(BOUND))
    ]:
        assert str(parse_trainer_args(step.command(values))["config"]) == resolved, step.name
    for step in PIPELINE.steps():
        if step is not RESOLVE_STEP:
            assert not {"config", "model", "train_epochs", "pools"} & step.placeholders(), step.name


def test_resolve_runs_first_on_a_cpu_so_a_wrong_ask_fails_before_any_gpu_step() -> None:
    """An unknown pool must fail the job at once: a GPU step placed on a pool with no nodes would wait for ever."""
    first, second = PIPELINE.graph.layers()[:2]
    assert [n.run for n in first] == [RESOLVE_STEP] and [n.run for n in second] == [CHECK_STEP]
    assert RESOLVE_STEP.resources == "tiny" and RESOLVE_STEP.retry == "on-error"
    assert CHECK_STEP.resources == "gpu"


def test_train_resumes_from_the_jobs_checkpoint_and_the_search_feeds_it() -> None:
    train_best: Node = PIPELINE.graph.node("train-best")
    train = parse_trainer_args(TRAIN_STEP.command(train_best.values(BOUND)))
    best = parse_trainer_args(BEST_STEP.command(BOUND))
    assert train["resume"] is True
    assert str(train["config"]) == str(best["out"])
    assert TRAIN_STEP.environment(BOUND)["FOXHUNT_CHECKPOINT_URL"] == "/jobs/j/checkpoints/train"


@pytest.mark.parametrize(
    "argv",
    [["train", "--plan", "graph"], ["hyperopt"], ["bench", "--check-only"], ["train", "--config"]],
)
def test_the_cli_rejects_what_it_does_not_have(argv: list[str]) -> None:
    with pytest.raises(RejectedError):
        parse_trainer_args(argv)


def test_an_unbound_placeholder_is_named() -> None:
    with pytest.raises(KeyError, match="config"):
        RESOLVE_STEP.command({})
