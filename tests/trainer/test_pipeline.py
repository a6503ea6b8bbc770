"""The job pipeline: arguments spelled by the trainer CLI, and every step's command parsed back by it."""

from __future__ import annotations

import string

import pytest

from contracts.pipeline import PIPELINE, RESOLVED_CONFIG, PipelineError, Step, parse_trainer_args, trainer_args

# One value per placeholder of contracts/pipeline.py, as a backend would bind them.
BOUND = {
    "config": "/jobs/j/submitted.json",
    "model": "dqn",
    "train_epochs": "3",
    "pool": "h100",
    "pools": "/etc/pools.yaml",
    "run": "/jobs/j",
    "checkpoints": "/jobs/j/checkpoints",
    "storage": "sqlite:////jobs/j/optuna.db",
    "study": "foxhunt-j",
    "trials": "2",
    "trial": "1",
    "status": "Succeeded",
    "duration": "12.5",
    "failures": "[]",
}


def test_flags_are_spelled_as_the_cli_spells_them() -> None:
    argv = trainer_args("train", config="c.json", run_dir="out", resume=True, progress=False)
    assert argv == ("train", "--config", "c.json", "--run-dir", "out", "--resume", "--no-progress")


@pytest.mark.parametrize(
    "command, options, message",
    [
        ("train", {"plan": "graph"}, "has no option for 'plan'"),
        ("trian", {}, "no command 'trian'"),
        ("hyperopt nope", {}, "no command 'hyperopt nope'"),
        ("train", {"config": True}, "takes a value, not a flag"),
    ],
)
def test_an_option_the_cli_lacks_is_an_error(command: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        trainer_args(command, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("step", [*PIPELINE.steps(), PIPELINE.train_best], ids=lambda s: s.name)
def test_every_step_command_parses_with_the_trainer_cli(step: Step) -> None:
    params = parse_trainer_args(step.command(BOUND))
    assert params, step.name
    if step is PIPELINE.resolve:  # the one step that reads the config as submitted
        assert str(params["config"]) == BOUND["config"]
    elif "config" in params:
        assert str(params["config"]) in ("/jobs/j/config.json", "/jobs/j/hyperopt/best-config.json")


def test_resolve_checks_the_jobs_asks_and_writes_the_config_every_later_step_reads() -> None:
    resolve = parse_trainer_args(PIPELINE.resolve.command(BOUND))
    assert (resolve["model"], resolve["train_epochs"], resolve["pool"]) == ("dqn", 3, "h100")
    assert str(resolve["pools_file"]) == BOUND["pools"]
    resolved = RESOLVED_CONFIG.format(**BOUND)
    assert str(resolve["out"]) == resolved
    for step in (PIPELINE.check, PIPELINE.suggest, PIPELINE.trial, PIPELINE.best, PIPELINE.train):
        assert str(parse_trainer_args(step.command(BOUND))["config"]) == resolved, step.name
    for step in [*PIPELINE.steps(), PIPELINE.train_best]:
        if step is not PIPELINE.resolve:
            assert not {"config", "model", "train_epochs", "pool", "pools"} & placeholders(step), step.name


def test_resolve_runs_first_on_a_cpu_so_a_wrong_ask_fails_before_any_gpu_step() -> None:
    """An unknown pool must fail the job at once: a GPU step placed on a pool with no nodes would wait for ever."""
    steps = PIPELINE.steps()
    assert steps[0] is PIPELINE.resolve and steps[1] is PIPELINE.check
    assert PIPELINE.resolve.resources == "tiny" and PIPELINE.resolve.retry == "on-error"
    assert PIPELINE.check.resources == "gpu"


def placeholders(step: Step) -> set[str]:
    return {field for part in step.argv for _, field, _, _ in string.Formatter().parse(part) if field}


def test_train_resumes_from_the_jobs_checkpoint_and_the_search_feeds_it() -> None:
    train = parse_trainer_args(PIPELINE.train.command(BOUND))
    best = parse_trainer_args(PIPELINE.best.command(BOUND))
    assert train["resume"] is True
    assert str(parse_trainer_args(PIPELINE.train_best.command(BOUND))["config"]) == str(best["out"])
    assert PIPELINE.train.checkpoint_url is not None
    assert PIPELINE.train.checkpoint_url.format(**BOUND) == "/jobs/j/checkpoints/train"


@pytest.mark.parametrize(
    "argv",
    [["train", "--plan", "graph"], ["hyperopt"], ["bench", "--check-only"], ["train", "--config"]],
)
def test_the_cli_rejects_what_it_does_not_have(argv: list[str]) -> None:
    with pytest.raises(PipelineError):
        parse_trainer_args(argv)


def test_an_unbound_placeholder_is_named() -> None:
    with pytest.raises(KeyError, match="config"):
        PIPELINE.resolve.command({})
