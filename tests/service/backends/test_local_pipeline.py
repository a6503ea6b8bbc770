"""The local executor of the job pipeline, run in-process over the stand-in trainer (real processes)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from service.backends.local import LocalBackend
from service.backends.local_pipeline import Outcome, PipelineRun, bindings, state_file
from service.domain import JobSpec, JobState
from tests.service.backends.test_local import TERMINAL, wait_log, wait_state
from tests.service.factories import POOLS_YAML, stand_in_command, tiny_train_config


def job(trials: int = 0, attempt: int = 0) -> dict[str, Any]:
    return {
        "job_id": "job-1",
        "pool": "cpu",
        "model": "dqn",
        "commit_sha": "abc123",
        "attempt": attempt,
        "hyperopt_trials": trials,
    }


def run_pipeline(job_dir: Path, *knobs: str, trials: int = 0, **options: Any) -> tuple[Outcome, str]:
    """One pipeline run into job_dir/log.txt, as the supervisor runs it: the outcome and the log."""
    job_dir.mkdir(exist_ok=True)
    (job_dir / "config.json").write_text(json.dumps({"run": {"steps": 3}}))
    with open(job_dir / "log.txt", "a") as log:
        outcome = PipelineRun(job_dir, job(trials), stand_in_command(*knobs), out=log, **options).run()
    return outcome, (job_dir / "log.txt").read_text()


def started(log: str) -> list[str]:
    marks = [line.split(" starting: ")[0] for line in log.splitlines() if " starting: " in line]
    return [mark.removeprefix("--- foxhunt: step ") for mark in marks]


def exit_record(job_dir: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((job_dir / "run" / "status.json").read_text())
    return record


def test_placeholders_are_bound_to_the_job_directory(tmp_path: Path) -> None:
    assert bindings(tmp_path, {**job(trials=3), "train_epochs": 4}) == {
        "config": f"{tmp_path}/config.json",
        "model": "dqn",
        "train_epochs": "4",
        "pool": "cpu",
        "pools": f"{tmp_path}/pools.yaml",
        "run": f"{tmp_path}/run",
        "checkpoints": f"{tmp_path}/checkpoints",
        "storage": f"sqlite:///{tmp_path}/optuna.db",
        "study": "foxhunt-job-1",
        "job_id": "job-1",
        "commit": "abc123",
        "trials": "3",
    }


def test_without_trials_it_runs_resolve_compile_train_report_then_on_exit(tmp_path: Path) -> None:
    outcome, log = run_pipeline(tmp_path)
    assert outcome == Outcome(0)
    steps = ["resolve", "compile", "train", "report", "on-exit"]
    assert started(log) == steps
    assert f"resolve --config {tmp_path}/config.json --model dqn --train-epochs 0 --pool cpu" in log
    assert f"--pools-file {tmp_path}/pools.yaml --out {tmp_path}/run/config.json\n" in log
    assert f"check --config {tmp_path}/run/config.json --out {tmp_path}/run/check\n" in log
    assert f"train --config {tmp_path}/run/config.json --run-dir {tmp_path}/run/train --resume --no-progress" in log
    assert exit_record(tmp_path)["status"] == "Succeeded" and exit_record(tmp_path)["failures"] is None
    done = json.loads(state_file(tmp_path, 0).read_text())
    assert done["current"] is None and [d["step"] for d in done["done"]] == steps


def test_trials_fan_out_then_best_then_train_from_the_best_config(tmp_path: Path) -> None:
    outcome, log = run_pipeline(tmp_path, trials=3)
    assert outcome == Outcome(0)
    trials = ["hyperopt-trial 0", "hyperopt-trial 1", "hyperopt-trial 2"]
    assert started(log) == [
        "resolve", "compile", "hyperopt-suggest", *trials, "hyperopt-best", "train", "report", "on-exit",
    ]  # fmt: skip
    assert "--trials 3 --storage sqlite:///" in log and "--study foxhunt-job-1" in log
    assert f"hyperopt trial --trials 1 --storage sqlite:///{tmp_path}/optuna.db" in log
    assert f"--run-dir {tmp_path}/run/hyperopt\n" in log
    assert "stand-in: steps=3 resume=False config=best-config.json" in log
    summary = json.loads((tmp_path / "run" / "train" / "summary.json").read_text())
    assert summary["trial"] == 2  # the stand-in's best trial is the highest number


def test_packs_of_trials_fan_out_one_step_each_and_a_failed_trial_fails_only_itself(tmp_path: Path) -> None:
    """suggest printed ["0,1", "2"]: two trial steps; trial 1 fails inside its pack, whose step still succeeds."""
    outcome, log = run_pipeline(tmp_path, "--pack", "2", "--fail-trial", "1", trials=3)
    assert outcome == Outcome(0)
    assert started(log) == [
        "resolve", "compile", "hyperopt-suggest", "hyperopt-trial 0,1", "hyperopt-trial 2", "hyperopt-best", "train",
        "report", "on-exit",
    ]  # fmt: skip
    assert "hyperopt trial --trials 0,1 --storage" in log and "stand-in: trial 1 failed" in log
    assert "stand-in: trial 0 value=0" in log and "stand-in: best trial 2" in log
    assert exit_record(tmp_path)["failures"] is None


def test_a_failed_trial_does_not_stop_the_search_and_reaches_the_exit_handler(tmp_path: Path) -> None:
    outcome, log = run_pipeline(tmp_path, "--fail-trial", "2", trials=3)
    assert outcome == Outcome(0)
    assert "--- foxhunt: hyperopt-trial 2 failed; the trial fan-out goes on without it" in log
    assert "stand-in: best trial 1" in log and started(log)[-3:] == ["train", "report", "on-exit"]
    record = exit_record(tmp_path)
    assert record["status"] == "Succeeded"
    assert record["failures"] == [
        {
            "displayName": "hyperopt-trial 2",
            "templateName": "hyperopt-trial",
            "phase": "Failed",
            "exitCode": "1",
            "message": "exit code 1",
        }
    ]


def test_a_search_with_no_completed_trial_fails_at_best(tmp_path: Path) -> None:
    outcome, log = run_pipeline(tmp_path, "--fail-trial", "0", "--fail-trial", "1", trials=2)
    assert (outcome.code, outcome.step) == (1, "hyperopt-best")
    assert outcome.last_line == "error: the study has no completed trial"
    assert "train" not in started(log) and started(log)[-1] == "on-exit"
    assert [f["displayName"] for f in exit_record(tmp_path)["failures"]] == [
        "hyperopt-trial 0",
        "hyperopt-trial 1",
        "hyperopt-best",
    ]


def test_a_failed_train_fails_the_pipeline_with_its_code_and_still_runs_on_exit(tmp_path: Path) -> None:
    outcome, log = run_pipeline(tmp_path, "--exit", "3")
    assert outcome == Outcome(3, "train", "stand-in: done, exit 3")
    assert started(log) == ["resolve", "compile", "train", "on-exit"]  # no report of a run that failed
    assert "--- foxhunt: step train finished: exit 3" in log
    record = exit_record(tmp_path)
    assert record["status"] == "Failed" and record["failures"][0]["displayName"] == "train"


@pytest.mark.parametrize(
    ("command", "step", "steps"),
    [("resolve", "resolve", ["resolve", "on-exit"]), ("check", "compile", ["resolve", "compile", "on-exit"])],
)
def test_bad_input_at_resolve_or_compile_keeps_exit_2_and_its_error_line(
    tmp_path: Path, command: str, step: str, steps: list[str]
) -> None:
    outcome, log = run_pipeline(tmp_path, "--exit", "2", "--exit-in", command)
    assert outcome == Outcome(2, step, "error: bad input for the stand-in")
    assert started(log) == steps


def test_suggest_output_that_is_not_a_list_of_trials_fails_the_pipeline(tmp_path: Path) -> None:
    outcome, log = run_pipeline(tmp_path, "--exit-in", "suggest", trials=2)  # its last stdout line is not JSON
    assert outcome.code == 1 and outcome.step == "hyperopt-suggest"
    assert "hyperopt-suggest printed no JSON list of pack items (numbers or strings)" in log
    assert started(log) == ["resolve", "compile", "hyperopt-suggest", "on-exit"]


def test_a_failing_exit_handler_fails_a_pipeline_that_succeeded(tmp_path: Path) -> None:
    outcome, _ = run_pipeline(tmp_path, "--exit", "4", "--exit-in", "finish")
    assert (outcome.code, outcome.step) == (4, "on-exit")


def test_a_trainer_that_cannot_start_is_exit_127(tmp_path: Path) -> None:
    tmp_path.joinpath("config.json").write_text("{}")
    with open(tmp_path / "log.txt", "a") as log:
        outcome = PipelineRun(tmp_path, job(), [str(tmp_path / "no-such-trainer")], out=log).run()
    assert (outcome.code, outcome.step) == (127, "resolve")
    assert "error: cannot start" in (tmp_path / "log.txt").read_text()


def test_trials_run_a_few_at_a_time(tmp_path: Path) -> None:
    """Each trial waits until both have started: only a pipeline running 2 at once gets past it."""
    outcome, log = run_pipeline(tmp_path, "--trials-together", "2", trials=2, parallel_trials=2)
    assert outcome == Outcome(0), log
    assert "stand-in: trial 0 value=0" in log and "stand-in: trial 1 value=1" in log


def test_each_step_gets_the_job_env_its_checkpoint_and_the_gpu_only_when_it_needs_one(tmp_path: Path) -> None:
    outcome, log = run_pipeline(tmp_path, trials=1, gpu=1)
    assert outcome == Outcome(0)
    env = {line.split()[1]: line for line in log.splitlines() if line.startswith("stand-in: ") and " env " in line}
    for step in ("check", "trial", "train"):  # the pipeline's GPU steps get the trainer's identity, as on Argo
        assert " job=job-1 pool=cpu commit=abc123 attempt=0 " in env[step], env[step]
    for step in ("resolve", "suggest", "best", "report", "finish"):  # the others only what finds the process
        assert " job=job-1 pool=- commit=- attempt=0 " in env[step], env[step]
    assert env["resolve"].endswith("checkpoint=- cuda=")  # resolve needs no GPU, as its pod has none
    assert env["check"].endswith("checkpoint=- cuda=1")  # compile never writes the job's checkpoint
    assert env["trial"].endswith(f"checkpoint={tmp_path}/checkpoints cuda=1")  # trial n's: trial-<n> below it
    assert env["train"].endswith(f"checkpoint={tmp_path}/checkpoints/train cuda=1")
    for cpu_step in ("suggest", "best", "report", "finish"):
        assert env[cpu_step].endswith("checkpoint=- cuda="), env[cpu_step]


# ---- what a job asks, checked by the real trainer's resolve step ----------------------------------
REAL_TRAINER = [sys.executable, "-m", "trainer"]


@pytest.mark.parametrize(
    ("asks", "steps", "error"),
    [
        ({"model": "c51"}, None, "error: model 'c51' is not one this trainer trains; models: dqn"),
        ({"pool": "a100"}, None, "error: unknown pool 'a100'; configured: cpu, h200"),
        ({"train_epochs": 1}, 3, "error: the config sets run.steps (3) and the job asks for 1 epochs: give one"),
    ],
    ids=["model", "pool", "epochs-and-steps"],
)
def test_resolve_refuses_what_argo_refuses_with_the_same_message(
    tmp_path: Path, asks: dict[str, object], steps: int | None, error: str
) -> None:
    """The local pipeline runs the trainer's own resolve step, as Argo does: same step, same message, and
    nothing after it but the exit handler."""
    config = tiny_train_config(steps or 1)
    if steps is None:
        del config["run"]["steps"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "pools.yaml").write_text(POOLS_YAML)
    with open(tmp_path / "log.txt", "a") as log:
        outcome = PipelineRun(tmp_path, {**job(), **asks}, REAL_TRAINER, out=log).run()
    assert (outcome.code, outcome.step) == (2, "resolve")
    assert outcome.last_line is not None and outcome.last_line.startswith(error), outcome.last_line
    assert started((tmp_path / "log.txt").read_text()) == ["resolve", "on-exit"]
    assert not (tmp_path / "run" / "config.json").exists()


class _StopsAfter(threading.Event):
    """A stop that arrives after `checks` looks at it: lands between a step's check and its start."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks

    def is_set(self) -> bool:
        self.checks -= 1
        return self.checks < 0 or super().is_set()


def test_a_stop_before_a_step_starts_runs_only_the_exit_handler(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    outcome, log = run_pipeline(tmp_path, stop=stop)
    assert (outcome.code, outcome.step) == (143, "resolve")
    assert started(log) == ["on-exit"]
    record = exit_record(tmp_path)
    assert record["status"] == "Failed" and record["failures"][0]["message"] == "stopped on request"


def test_a_stop_that_lands_while_a_step_starts_stops_that_step(tmp_path: Path) -> None:
    outcome, log = run_pipeline(tmp_path, stop=_StopsAfter(checks=1))
    assert (outcome.code, outcome.step) == (143, "resolve")
    assert started(log) == ["resolve", "on-exit"] and "--- foxhunt: step resolve finished: exit 143" in log


def spec(trials: int) -> JobSpec:
    return JobSpec.model_validate(
        {**job(trials), "tenant": "t", "plan": "eager", "epochs": 1, "config": {"run": {"steps": 3}}}
    )


def test_cancel_during_the_trials_shows_the_trial_runs_on_exit_and_ends_cancelled(tmp_path: Path) -> None:
    # trial 0 waits for a second trial that a pipeline running one at a time never starts: it is running
    backend = LocalBackend(
        tmp_path, command=stand_in_command("--trials-together", "2"), gpus=0, grace_seconds=10, poll_seconds=0.05
    )
    backend.submit(spec(trials=2))
    wait_log(backend, "job-1", "stand-in: trial env")
    assert backend.status("job-1").phase == "running: hyperopt-trial 1/2"
    backend.cancel("job-1")
    status = wait_state(backend, "job-1", TERMINAL)
    assert (status.state, status.reason) == (JobState.CANCELLED, "Cancelled")
    log = "".join(backend.logs("job-1"))
    assert started(log)[-1] == "on-exit" and "hyperopt-trial 1" not in started(log)
    assert "hyperopt-best" not in started(log)
    assert exit_record(tmp_path / "job-1")["status"] == "Failed"


def test_a_cancelled_step_that_finishes_anyway_still_ends_the_pipeline(tmp_path: Path) -> None:
    """The train step ignores SIGTERM and ends its work (exit 0): nothing after it runs but on-exit."""
    command = stand_in_command("--ignore-term", "--sleep", "3")
    backend = LocalBackend(tmp_path, command=command, gpus=0, poll_seconds=0.05)
    backend.submit(spec(trials=0))
    wait_log(backend, "job-1", "stand-in: steps=3")
    backend.cancel("job-1")
    status = wait_state(backend, "job-1", TERMINAL)
    assert (status.state, status.message) == (JobState.CANCELLED, "stopped on request (exit 143)")
    log = "".join(backend.logs("job-1"))
    assert "--- foxhunt: step train finished: exit 0" in log and started(log)[-2:] == ["train", "on-exit"]
