"""The training loop end to end on CPU: outputs, checkpoint round trip, kill-and-resume, best-policy selection."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from contracts.config import ConfigError, TrainConfig
from contracts.plans import PLANS
from tests.factories import FakeClock, needs_gpu, tiny_config
from trainer.algo.step import StepOutput
from trainer.execution.plans import PlanFallbackWarning
from trainer.execution.plans.eager import EagerPlan
from trainer.runtime import train
from trainer.runtime.checkpoint import Checkpoint, Checkpointer
from trainer.runtime.train import (
    FINAL_EVAL_SEED,
    SELECT_EVAL_SEED,
    BestPolicy,
    Run,
    build_run,
    crossed,
    evaluate_for_selection,
    fill_replay,
    restore_checkpoint,
    run_training,
    save_checkpoint,
    start_plan,
)


def test_a_short_run_writes_its_outputs_and_breakdown(tmp_path: Path) -> None:
    lines: list[str] = []
    summary = run_training(tiny_config(), tmp_path, show_progress=False, out=lines.append)
    breakdowns = [line for line in lines if line.startswith("Training step breakdown: sample=")]
    assert len(breakdowns) == 2  # log_every=10 over 20 steps
    assert "fused=" in breakdowns[0] and "guard=" in breakdowns[0] and "(per-step: " in breakdowns[0]
    for component in ("forward_backward", "adam", "attention", "iqn", "causal", "priority"):
        assert f"{component}=" in breakdowns[0]
    for name in ("config.json", "progress.json", "summary.json"):
        assert (tmp_path / name).is_file()
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 20 and progress["step_ms"] > 0
    assert summary["step"] == 20 and len(summary["eval_returns"]) == 10
    assert (tmp_path / "checkpoints" / "step-000000020" / "COMPLETE").exists()


def test_an_unreachable_pushgateway_warns_and_the_run_still_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on the test cluster: the templates' default Pushgateway address does not resolve there, and
    the push after the last step failed every compile step."""
    monkeypatch.setenv("FOXHUNT_PUSHGATEWAY_URL", "http://pushgateway.invalid:9091")
    monkeypatch.setenv("FOXHUNT_JOB_ID", "job-push")
    summary = run_training(tiny_config(), tmp_path, show_progress=False, out=lambda line: None)
    assert summary["steps"] == tiny_config().run.steps and (tmp_path / "summary.json").exists()
    assert "warning: metrics not pushed to http://pushgateway.invalid:9091" in capsys.readouterr().err


@pytest.mark.parametrize("rng", ["torch", "keyed"])
def test_checkpoint_round_trip_continues_identically(tmp_path: Path, rng: str) -> None:
    """The restored run's generators draw on as the original's (`run.rng: keyed`: its counters)."""
    config = tiny_config([f"run.rng={rng}"])
    original = build_run(config, tmp_path / "a")
    fill_replay(original)
    start_plan(original)
    for step in range(5):
        original.plan.run(step)
    original.step = 5
    save_checkpoint(original)

    restored = build_run(config, tmp_path / "b")
    restored.checkpointer = original.checkpointer
    assert restore_checkpoint(restored) and restored.step == 5
    start_plan(restored)
    for step in range(5, 9):
        original.plan.run(step)
        restored.plan.run(step)
    for name, tensor in original.state.tensors().items():
        assert torch.equal(tensor, restored.state.tensors()[name]), name


def record_plan_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The replay's size each time the loop builds a plan."""
    sizes: list[int] = []
    make_plan = train.make_plan

    def recording(*args: Any) -> Any:
        sizes.append(len(args[2]))  # make_plan(name, state, replay, ...)
        return make_plan(*args)

    monkeypatch.setattr(train, "make_plan", recording)
    return sizes


def test_the_plan_is_built_after_the_replay_holds_learning_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = record_plan_builds(monkeypatch)
    config = tiny_config(data={"learning_starts": 40})
    run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    assert len(sizes) == 1 and sizes[0] >= 40


def test_a_resumed_run_builds_its_plan_on_the_restored_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(run={"steps": 10, "checkpoint_every": 10})
    run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    sizes = record_plan_builds(monkeypatch)
    longer = tiny_config(run={"steps": 12, "checkpoint_every": 10})
    lines: list[str] = []
    summary = run_training(longer, tmp_path, resume=True, show_progress=False, out=lines.append)
    assert "resumed from checkpoint at step 10" in lines
    # the checkpoint's replay: the warm-up (2 envs x 16) and 2 rows for each of the 10 updates
    assert sizes == [32 + 2 * 10]
    assert summary["step"] == 12


def test_start_plan_refuses_an_empty_replay(tmp_path: Path) -> None:
    run = build_run(tiny_config(), tmp_path)
    with pytest.raises(ValueError, match="fill_replay first"):
        start_plan(run)


@pytest.mark.parametrize("name", ["eager", *(name for name, plan in PLANS.items() if plan.needs_cuda)])
def test_train_runs_with_every_plan_name_on_the_cpu(tmp_path: Path, name: str) -> None:
    """GPU plans fall back to eager on the CPU, with a warning naming why, and train from an empty replay
    (compile runs as itself on the CPU: tests/trainer/tools/test_bench.py compares it with eager)."""
    config = tiny_config(run={"plan": name, "steps": 4, "log_every": 2, "checkpoint_every": 4})
    if name == "eager":
        summary = run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    else:
        with pytest.warns(PlanFallbackWarning, match=rf"plan '{name}' needs a CUDA GPU"):
            summary = run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    assert summary["step"] == 4 and summary["plan"] == "eager"


def test_collection_is_timed_as_act_env_and_store(tmp_path: Path) -> None:
    lines: list[str] = []
    run_training(tiny_config(), tmp_path, show_progress=False, out=lines.append)
    breakdown = next(line for line in lines if line.startswith("Training step breakdown: "))
    assert " collect=" in breakdown
    progress = json.loads((tmp_path / "progress.json").read_text())
    parts = progress["breakdown_ms"]
    assert all(parts[name] > 0 for name in ("act", "env", "store", "sample", "adam"))
    collect = sum(parts[name] for name in ("act", "env", "store"))
    assert collect < progress["step_ms"]


class KStepPlan:
    """The eager plan run `k` times per call, as a graph plan with run.steps_per_replay = k does."""

    name = "eager"

    def __init__(self, eager: EagerPlan, k: int) -> None:
        self.eager, self.steps_per_call = eager, k
        self.calls: list[tuple[int, int]] = []  # (first step, replay size) per call

    def run(self, step: int) -> StepOutput:
        self.calls.append((step, len(self.eager.replay)))
        output = None
        for i in range(self.steps_per_call):
            output = self.eager.run(step + i)
        assert output is not None
        return output


def test_k_updates_per_call_collect_k_updates_worth_and_log_on_crossing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans: list[KStepPlan] = []

    def k_step(*args: Any) -> Any:
        plans.append(KStepPlan(EagerPlan(*args[1:]), 3))
        return plans[-1]

    monkeypatch.setattr(train, "make_plan", k_step)
    lines: list[str] = []
    config = tiny_config(run={"steps": 15, "log_every": 5, "checkpoint_every": 5})
    summary = run_training(config, tmp_path, show_progress=False, out=lines.append)
    calls = plans[0].calls
    assert [step for step, _ in calls] == [0, 3, 6, 9, 12]
    # 2 envs x 1 env step per update x 3 updates collected before each call, after the warm-up of 32
    assert [size for _, size in calls] == [32 + 6 * (i + 1) for i in range(5)]
    assert summary["step"] == 15
    # reports at 6 (passing 5), 12 (passing 10) and 15 (the last); checkpoints at 6, 12 (then the final 15)
    assert len([line for line in lines if line.startswith("Training step breakdown: ")]) == 3
    assert Checkpointer(str(tmp_path / "checkpoints")).complete_steps() == [12, 15]


def _write_config(tmp_path: Path, steps: int) -> Path:
    config = tiny_config(run={"steps": steps, "log_every": 5, "checkpoint_every": 20})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def _train(config: Path, run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--config",
            str(config),
            "--run-dir",
            str(run_dir),
            "--no-progress",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_sigkill_then_resume_finishes_with_the_same_step_count(tmp_path: Path) -> None:
    config, run_dir = _write_config(tmp_path, steps=120), tmp_path / "run"
    process = _train(config, run_dir)
    checkpoints = run_dir / "checkpoints"
    deadline = time.monotonic() + 240
    while not list(checkpoints.glob("step-*/COMPLETE")):
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.05)
    # let it run on past the checkpoint, then kill it without warning
    progress_at_kill = 0
    while progress_at_kill < 45 and process.poll() is None:
        if (run_dir / "progress.json").exists():
            progress_at_kill = json.loads((run_dir / "progress.json").read_text())["step"]
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL

    resumed = _train(config, run_dir, "--resume")
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    resumed_from = int(output.split("resumed from checkpoint at step ")[1].split()[0])
    assert resumed_from >= progress_at_kill - 20  # at most one checkpoint interval lost
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 120


def test_sigterm_writes_a_checkpoint_and_exits_143(tmp_path: Path) -> None:
    config, run_dir = _write_config(tmp_path, steps=100_000), tmp_path / "run"
    process = _train(config, run_dir)
    deadline = time.monotonic() + 240
    while not (run_dir / "progress.json").exists():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143, output
    step = int(output.split("terminated at step ")[1].split(":")[0])
    assert (run_dir / "checkpoints" / f"step-{step:09d}" / "COMPLETE").exists()


def test_a_second_trainer_refuses_the_run_folder_a_live_trainer_holds(tmp_path: Path) -> None:
    """Two trainers in one run folder (an orphan and its job's retry) would interleave checkpoints and progress."""
    config, run_dir = _write_config(tmp_path, steps=100_000), tmp_path / "run"
    first = _train(config, run_dir)
    second: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "progress.json").exists():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        second = _train(config, run_dir, "--resume")
        output, _ = second.communicate(timeout=120)
        assert second.returncode == 2, output
        assert f"error: run folder {run_dir} is in use by another live trainer (pid {first.pid})" in output
        assert first.poll() is None  # the holder trains on, untouched
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=60)
    assert first.returncode == 143


def test_the_run_folder_lock_is_held_for_the_run_and_dies_with_its_holder(tmp_path: Path) -> None:
    with train.hold_run_dir(tmp_path), pytest.raises(train.RunDirBusy, match=f"pid {os.getpid()}"):
        run_training(tiny_config(run={"steps": 2}), tmp_path, show_progress=False)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_SLEEP, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(train.RunDirBusy, match=f"pid {holder.pid}"), train.hold_run_dir(tmp_path):
        pass
    holder.kill()  # SIGKILL: no clean-up runs, the kernel drops the lock
    holder.wait(timeout=30)
    assert run_training(tiny_config(run={"steps": 2}), tmp_path, show_progress=False)["step"] == 2


HOLD_AND_SLEEP = """
import sys, time
from pathlib import Path
from trainer.runtime.train import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


@dataclass
class Seen:
    """One call of a scripted evaluation: the step, the first seed, and the parameters the policy had."""

    step: int
    seed: int
    online: torch.Tensor


def script_evaluations(
    monkeypatch: pytest.MonkeyPatch,
    means: list[float],
    terminate_at_step: int | None = None,
    clock: FakeClock | None = None,
) -> list[Seen]:
    """Periodic evaluations of the next run score `means` in turn (the final one scores 0); each call is recorded.

    With `terminate_at_step`, the evaluation at that step also sends the process SIGTERM; with `clock`, each
    periodic evaluation moves it on by 2 s.
    """
    seen: list[Seen] = []
    scripted = iter(means)

    def build_scripted(config: TrainConfig, run_dir: Path, checkpoint_url: str | None = None) -> Run:
        run = build_run(config, run_dir, checkpoint_url)

        def evaluate(greedy_fn: Callable[[torch.Tensor], torch.Tensor], episodes: int, seed: int) -> list[float]:
            if (
                greedy_fn.__module__ == "trainer.execution.data.market_torch"
            ):  # the market's baselines, not the run's policy
                return [0.0] * episodes
            seen.append(Seen(run.step, seed, run.state.online.clone()))
            if seed == config.run.seed + FINAL_EVAL_SEED:
                return [0.0] * episodes
            if run.step == terminate_at_step:
                signal.raise_signal(signal.SIGTERM)
            if clock is not None:
                clock.now += 2.0
            return [next(scripted)] * episodes

        run.source.evaluate = evaluate
        return run

    monkeypatch.setattr(train, "build_run", build_scripted)
    return seen


def last_checkpoint(run_dir: Path) -> Checkpoint:
    checkpoint = Checkpointer(str(run_dir / "checkpoints")).load_latest()
    assert checkpoint is not None
    return checkpoint


def test_the_best_periodic_policy_is_restored_before_the_final_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = script_evaluations(monkeypatch, [1.0, 7.0, 3.0, 2.0])
    lines: list[str] = []
    config = tiny_config(run={"eval_every": 5, "eval_select_episodes": 2})
    summary = run_training(config, tmp_path, show_progress=False, out=lines.append)

    select, final_seed = config.run.seed + SELECT_EVAL_SEED, config.run.seed + FINAL_EVAL_SEED
    assert [(call.step, call.seed) for call in seen] == [
        (5, select),
        (10, select),
        (15, select),
        (20, select),
        (20, final_seed),
    ]
    assert (summary["best_eval_step"], summary["best_eval_return"]) == (10, 7.0)
    final, best, last = seen[-1].online, seen[1].online, seen[3].online
    assert not torch.equal(best, last)
    assert torch.equal(final, best)
    assert "evaluation at step 10: mean return 7.00 over 2 episodes (best so far)" in lines
    assert "evaluation at step 15: mean return 3.00 over 2 episodes (best 7.00 at step 10)" in lines
    assert "selected the policy of step 10 (mean return 7.00)" in lines
    # the final checkpoint is the last update's state, with the best snapshot beside it
    checkpoint = last_checkpoint(tmp_path)
    assert torch.equal(checkpoint.state["online"], last)
    assert torch.equal(checkpoint.state["best.online"], best)
    assert checkpoint.meta["best_eval"] == {"step": 10, "mean_return": 7.0}


def test_off_by_default_the_last_policy_is_evaluated_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = script_evaluations(monkeypatch, [])
    lines: list[str] = []
    summary = run_training(tiny_config(), tmp_path, show_progress=False, out=lines.append)

    assert [(call.step, call.seed) for call in seen] == [(20, FINAL_EVAL_SEED)]
    assert summary["best_eval_step"] is None and summary["best_eval_return"] is None
    assert not [line for line in lines if line.startswith(("evaluation at step", "selected the policy"))]
    checkpoint = last_checkpoint(tmp_path)
    assert torch.equal(checkpoint.state["online"], seen[0].online)
    assert "best.online" not in checkpoint.state


def test_periodic_evaluation_leaves_the_training_trajectory_alone(tmp_path: Path) -> None:
    """Evaluation draws on no training generator, so the last update's state is the same with or without it."""
    plain = run_training(tiny_config(), tmp_path / "plain", show_progress=False, out=lambda line: None)
    config = tiny_config(run={"eval_every": 5, "eval_select_episodes": 1})
    selecting = run_training(config, tmp_path / "selecting", show_progress=False, out=lambda line: None)

    assert plain["best_eval_step"] is None and selecting["best_eval_step"] in (5, 10, 15, 20)
    want, got = last_checkpoint(tmp_path / "plain").state, last_checkpoint(tmp_path / "selecting").state
    for name, tensor in want.items():
        assert torch.equal(tensor, got[name]), name


def test_a_resumed_run_keeps_the_best_policy_from_before_the_interruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config(run={"eval_every": 5, "eval_select_episodes": 1, "checkpoint_every": 100})
    before = script_evaluations(monkeypatch, [1.0, 9.0], terminate_at_step=10)
    with pytest.raises(SystemExit) as exited:
        run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    assert exited.value.code == train.EXIT_TERMINATED
    assert last_checkpoint(tmp_path).meta["best_eval"] == {"step": 10, "mean_return": 9.0}

    after = script_evaluations(monkeypatch, [3.0, 2.0])
    summary = run_training(config, tmp_path, resume=True, show_progress=False, out=lambda line: None)

    assert [call.step for call in after] == [15, 20, 20]
    assert (summary["best_eval_step"], summary["best_eval_return"], summary["step"]) == (10, 9.0, 20)
    assert torch.equal(after[-1].online, before[1].online)


def test_the_summary_says_how_much_of_the_loop_was_evaluation_across_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock that moves only while a periodic evaluation plays (2 s each, at steps 5, 10, 15, 20): the loop's
    time is all evaluation, and a run stopped at step 10 and resumed keeps the first two's."""
    clock = FakeClock()
    monkeypatch.setattr(train, "time", clock)
    config = tiny_config(run={"eval_every": 5, "eval_select_episodes": 1, "checkpoint_every": 100})
    script_evaluations(monkeypatch, [1.0, 2.0], terminate_at_step=10, clock=clock)
    with pytest.raises(SystemExit):
        run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    assert last_checkpoint(tmp_path).meta["eval_seconds"] == 4.0

    script_evaluations(monkeypatch, [3.0, 4.0], clock=clock)
    summary = run_training(config, tmp_path, resume=True, show_progress=False, out=lambda line: None)
    assert summary["eval_seconds"] == summary["wall_seconds"] == 8.0
    plain = run_training(tiny_config(), tmp_path / "plain", show_progress=False, out=lambda line: None)
    assert plain["eval_seconds"] == 0.0  # no periodic evaluation (the final one is not the loop's)


def test_best_policy_keeps_a_copy_of_the_best_and_later_ties_win() -> None:
    params = torch.zeros(3)
    best = BestPolicy()
    assert best.offer(5, 2.0, params)
    params += 1.0  # training moves on; the snapshot must not
    assert not best.offer(10, 1.0, params)
    assert (best.step, best.mean_return) == (5, 2.0) and torch.equal(best.online, torch.zeros(3))
    assert best.offer(15, 2.0, params)
    assert (best.step, best.mean_return) == (15, 2.0) and torch.equal(best.online, torch.ones(3))


@pytest.mark.parametrize("mean_return", [math.nan, math.inf, -math.inf])
def test_best_policy_never_takes_a_mean_that_is_not_finite(mean_return: float) -> None:
    best = BestPolicy()
    assert not best.offer(5, mean_return, torch.zeros(3))
    assert best.online is None and best.step is None
    best.offer(10, -3.0, torch.zeros(3))
    assert not best.offer(15, mean_return, torch.ones(3))
    assert (best.step, best.mean_return) == (10, -3.0)


def test_an_evaluation_that_is_not_finite_is_reported_and_not_kept(tmp_path: Path) -> None:
    run = build_run(tiny_config(run={"eval_every": 5}), tmp_path)
    scores = iter([math.nan, 4.0, math.nan])
    run.source.evaluate = lambda greedy_fn, episodes, seed: [next(scores)] * episodes
    lines: list[str] = []
    for step in (5, 10, 15):
        run.step = step
        evaluate_for_selection(run, lines.append)
    assert lines == [
        "evaluation at step 5: mean return nan over 5 episodes (not kept: no finite mean yet)",
        "evaluation at step 10: mean return 4.00 over 5 episodes (best so far)",
        "evaluation at step 15: mean return nan over 5 episodes (best 4.00 at step 10)",
    ]
    assert (run.best.step, run.best.mean_return) == (10, 4.0)


@pytest.mark.parametrize(
    "step, advanced, due",
    [(10, 1, True), (11, 1, False), (8, 4, False), (12, 4, True), (20, 4, True), (24, 4, False)],
)
def test_evaluation_is_due_whenever_a_multiple_is_passed(step: int, advanced: int, due: bool) -> None:
    assert crossed(step, advanced, 10) is due


def test_the_time_limit_stops_early_and_finishes_as_at_the_end(tmp_path: Path) -> None:
    config = tiny_config(run={"max_seconds": 1e-6, "eval_every": 5, "eval_select_episodes": 1})
    lines: list[str] = []
    summary = run_training(config, tmp_path, show_progress=False, out=lines.append)
    assert summary["step"] == 1 and summary["stopped_by_time_limit"] is True
    assert summary["best_eval_step"] == 1  # the policy it stopped with was evaluated for selection
    assert len(summary["eval_returns"]) == config.run.eval_episodes
    assert "time limit: stopped at step 1 of 20 (run.max_seconds=1e-06)" in lines
    assert json.loads((tmp_path / "progress.json").read_text())["step"] == 1
    assert last_checkpoint(tmp_path).step == 1
    unlimited = run_training(tiny_config(), tmp_path / "unlimited", show_progress=False, out=lambda line: None)
    assert unlimited["step"] == 20 and unlimited["stopped_by_time_limit"] is False


def test_reaching_the_stop_return_ends_the_run_as_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = script_evaluations(monkeypatch, [1.0, 4.0, 6.0, 9.0])
    lines: list[str] = []
    config = tiny_config(run={"eval_every": 5, "eval_select_episodes": 2, "stop_at_return": 5.5})
    summary = run_training(config, tmp_path, show_progress=False, out=lines.append)

    select, final_seed = config.run.seed + SELECT_EVAL_SEED, config.run.seed + FINAL_EVAL_SEED
    assert [(call.step, call.seed) for call in seen] == [(5, select), (10, select), (15, select), (15, final_seed)]
    assert summary["step"] == 15 and summary["stopped_at_return"] is True and summary["stopped_by_time_limit"] is False
    assert (summary["best_eval_step"], summary["best_eval_return"]) == (15, 6.0)
    assert "return reached: stopped at step 15 of 20 (run.stop_at_return=5.5)" in lines
    assert json.loads((tmp_path / "progress.json").read_text())["step"] == 15
    assert last_checkpoint(tmp_path).step == 15


def test_a_run_that_never_reaches_the_stop_return_trains_to_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script_evaluations(monkeypatch, [1.0, 2.0, 3.0, 4.0])
    config = tiny_config(run={"eval_every": 5, "eval_select_episodes": 1, "stop_at_return": 5.0})
    summary = run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    assert summary["step"] == 20 and summary["stopped_at_return"] is False


def test_the_stop_return_needs_periodic_evaluations() -> None:
    with pytest.raises(ConfigError, match="run.stop_at_return needs run.eval_every > 0"):
        tiny_config(run={"stop_at_return": 475.0})


def test_a_market_run_scores_the_baselines_on_its_own_evaluation_episodes(tmp_path: Path) -> None:
    from trainer.execution.data import make_source
    from trainer.execution.data.market_torch import baseline_returns

    config = tiny_config(data={"market_backend": "torch"})
    lines: list[str] = []
    summary = run_training(config, tmp_path, show_progress=False, out=lines.append)
    seed = config.run.seed + FINAL_EVAL_SEED
    expected = baseline_returns(make_source(config).evaluate, config.run.eval_episodes, seed)
    assert summary["baseline_returns"] == expected
    means = summary["baseline_means"]
    assert means == {name: pytest.approx(sum(values) / len(values)) for name, values in expected.items()}
    assert summary["margin_over_heuristic"] == pytest.approx(summary["eval_return_mean"] - means["heuristic"])
    assert means["heuristic"] > means["random"]
    assert lines[-1].startswith("baselines on the same episodes: heuristic ")
    assert json.loads((tmp_path / "summary.json").read_text())["baseline_means"] == means


def test_only_the_market_has_baselines(tmp_path: Path) -> None:
    run = build_run(tiny_config(data={"source": "gym", "env_id": "CartPole-v1"}), tmp_path)
    assert train.market_baselines(run, [10.0, 12.0]) == {}
    market = build_run(tiny_config(), tmp_path / "market")
    assert train.market_baselines(market, []) == {}  # no final evaluation, nothing to compare with


HOST_READS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")
"""Tensor methods that bring a value to the host: on a CUDA tensor each one waits for the device."""


class HostReadSpy:
    """Wraps a rows-making function and records every host read (HOST_READS) of a tensor other than the
    rows' host-side `last` and `episode_step` columns, which sources build on the host."""

    def __init__(self, make_rows: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
        self.make_rows, self.made, self.reads = make_rows, [], []  # made: the rows, kept alive so ids stay unique
        self.host: set[int] = set()
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._spy(name, getattr(torch.Tensor, name)))

    def __call__(self, *args: Any) -> Any:
        rows = self.make_rows(*args)
        self.made.append(rows)
        self.host.update({id(rows.last), id(rows.episode_step)})
        return rows

    def _spy(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def spy(tensor: torch.Tensor, *args: Any) -> Any:
            if id(tensor) not in self.host:
                self.reads.append(name)
            return original(tensor, *args)

        return spy


def test_market_collection_on_the_torch_env_reads_nothing_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Acting, stepping and storing 40 updates' rows (two episode ends, HER columns included) read no
    tensor back to the host except the rows' host-side `last` and `episode_step`, which the source
    builds on the host: on the GPU the same path is checked with CUDA's sync debug mode."""
    config = tiny_config(data={"market_backend": "torch"})
    run = build_run(config, tmp_path)
    fill_replay(run)
    spy = HostReadSpy(run.source.collect, monkeypatch)
    monkeypatch.setattr(run.source, "collect", spy)
    before = len(run.replay)
    train.collect(run, run.act_fn(), 40)
    monkeypatch.undo()
    assert spy.reads == []
    assert len(spy.made) == 40 and len(run.replay) == before + 40 * config.data.num_envs
    rows = spy.made[-1]
    device_columns = [
        rows.obs,
        rows.action,
        rows.reward,
        rows.next_obs,
        rows.done,
        rows.achieved_goal,
        rows.base_reward,
    ]
    assert all(column is not None and column.device == run.device for column in device_columns)
    assert [rows.last.device.type, rows.episode_step.device.type] == ["cpu", "cpu"]


def collector_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """run.collect_graph applies to the torch market on the CPU too: its collector runs uncaptured."""
    from trainer.execution.data.market_torch import TorchMarketSource

    def applies(source: object, device: torch.device, steps: int) -> bool:
        return isinstance(source, TorchMarketSource) and steps <= source.params.horizon

    monkeypatch.setattr(train, "collect_graph_applies", applies)


def test_the_collection_graph_s_body_reads_nothing_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a collection graph captures (acting with a device epsilon, stepping, storing with the device
    writer, 40 updates' rows across two episode ends and a wrap of the ring), run uncaptured on the CPU
    under the same spies: no tensor is read back but the rows' host `last` and `episode_step`, and no
    operation makes a shape from values (nonzero, masked_select, unique, a boolean index). (Either
    fails a capture: the GPU tests capture the same body.)"""
    collector_on_the_cpu(monkeypatch)
    config = tiny_config(["run.collect_graph=true"], data={"market_backend": "torch"}, replay={"capacity": 64})
    run = build_run(config, tmp_path)
    fill_replay(run)
    start_plan(run)
    assert run.collector is not None
    source = run.collector.source
    spy = HostReadSpy(source.step_rows, monkeypatch)
    reads = spy.reads

    def dynamic(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any, **kwargs: Any) -> Any:
            reads.append(name)
            return original(*args, **kwargs)

        return spy

    getitem = torch.Tensor.__getitem__

    def index(self: torch.Tensor, key: Any) -> Any:
        keys = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, torch.Tensor) and k.dtype == torch.bool for k in keys):
            reads.append("boolean index")
        return getitem(self, key)

    monkeypatch.setattr(source, "step_rows", spy)
    for name in ("nonzero", "masked_select", "unique"):
        monkeypatch.setattr(torch.Tensor, name, dynamic(name, getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch, name, dynamic(name, getattr(torch, name)))
    monkeypatch.setattr(torch.Tensor, "__getitem__", index)
    torch.arange(3)[torch.tensor([True, False, True])]
    assert reads == ["boolean index"]  # the spies see a shape made from values
    reads.clear()
    for _ in range(40):
        train.collect(run, run.act_fn(), 1)
        run.step += 1
    monkeypatch.undo()
    assert reads == []
    assert len(spy.made) == 40 and run.replay.writer.written == 32 + 40 * config.data.num_envs
    assert len(source.finished_returns) == 3 * config.data.num_envs  # 16-step episodes end at 16 (warm-up), 32, 48


def test_the_collection_graph_is_timed_as_one_component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collector_on_the_cpu(monkeypatch)
    lines: list[str] = []
    config = tiny_config(["run.collect_graph=true"], data={"market_backend": "torch"})
    run_training(config, tmp_path, show_progress=False, out=lines.append)
    breakdown = next(line for line in lines if line.startswith("Training step breakdown: "))
    assert " collect=" in breakdown and "collect_graph=" in breakdown
    parts = json.loads((tmp_path / "progress.json").read_text())["breakdown_ms"]
    assert parts["collect_graph"] > 0 and not {"act", "env", "store"} & set(parts)


def test_the_collection_graph_is_on_by_default_and_off_with_its_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector_on_the_cpu(monkeypatch)
    for flag, collected_in_graph in (([], True), (["run.collect_graph=false"], False)):
        run = build_run(tiny_config(flag, data={"market_backend": "torch"}), tmp_path / str(collected_in_graph))
        fill_replay(run)
        start_plan(run)
        assert (run.collector is not None, run.collect_in_graph) == (collected_in_graph, collected_in_graph)


CARTPOLE = Path(__file__).resolve().parents[3] / "examples" / "cartpole.yaml"


def cartpole_on_gpu(plan: str, steps: int, *extra: str) -> TrainConfig:
    from contracts.config import load_config

    return load_config(
        CARTPOLE,
        [
            "run.device=cuda",
            f"run.plan={plan}",
            f"run.steps={steps}",
            f"run.log_every={steps // 3}",
            f"run.checkpoint_every={steps}",
            "run.eval_every=0",
            "run.stop_at_return=null",
            "run.eval_episodes=5",
            *extra,
        ],
    )


@pytest.mark.parametrize(
    ("plan", "extra"),
    [
        ("eager", ()),
        ("graph", ()),
        ("dual", ()),
        ("fused", ()),
        ("zerocopy", ()),
        ("zerocopy", ("run.steps_per_replay=10",)),
    ],
    ids=["eager", "graph", "dual", "fused", "zerocopy", "zerocopy-k10"],
)
@pytest.mark.gpu
@needs_gpu
def test_cartpole_trains_3000_updates_with_each_plan_from_an_empty_replay(
    tmp_path: Path, plan: str, extra: tuple[str, ...]
) -> None:
    lines: list[str] = []
    summary = run_training(cartpole_on_gpu(plan, 3000, *extra), tmp_path, show_progress=False, out=lines.append)
    breakdown = [line for line in lines if line.startswith("Training step breakdown: ")][-1]
    print(f"{plan} {extra}: {summary['step'] / summary['wall_seconds']:.1f} updates/s; {breakdown}")
    assert summary["plan"] == plan and summary["step"] == 3000 and summary["device"] == "cuda"
    assert all(math.isfinite(value) for value in summary["losses"].values())
    assert summary["guard_skips"] == 0
    assert all(summary["breakdown_ms"][name] > 0 for name in ("act", "env", "store"))
    assert "train_return_mean" in summary  # episodes finished while training


MARKET_GPU = Path(__file__).resolve().parents[3] / "examples" / "market-gpu.yaml"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("collect_graph", [True, False], ids=["collect-graph", "uncaptured"])
def test_the_market_trains_on_the_gpu_env_with_zerocopy_and_collects_without_a_sync(
    tmp_path: Path, collect_graph: bool
) -> None:
    """examples/market-gpu.yaml, shortened: the torch market on the GPU, K = 10 updates per zerocopy
    replay. Acting, stepping and storing (HER columns included) make no synchronising call once warm,
    across an episode end, whether collection replays as one graph per plan call (run.collect_graph, its
    graphs captured when the plan is) or runs an operation at a time; then a short real run trains,
    times collection and scores the baselines."""
    from contracts.config import load_config
    from trainer.execution.data.market_torch import TorchMarketSource

    overrides = ["run.steps=600", "run.log_every=200", "run.checkpoint_every=600", "run.eval_every=0"]
    overrides += [f"run.collect_graph={str(collect_graph).lower()}"]
    config = load_config(MARKET_GPU, [*overrides, "run.eval_episodes=10", "replay.capacity=50000"])
    run = build_run(config, tmp_path / "collect")
    assert isinstance(run.source, TorchMarketSource) and run.device.type == "cuda"
    fill_replay(run)
    start_plan(run)
    assert (run.collector is not None) == collect_graph
    k = run.plan.steps_per_call
    train.collect(run, run.act_fn(), k)  # warm-up: lazy initialisations
    run.step += k
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(config.data.market_horizon // k):  # crosses an episode end
            train.collect(run, run.act_fn(), k)
            run.plan.run(run.step)
            run.step += k
    finally:
        torch.cuda.set_sync_debug_mode("default")
    summary = run_training(config, tmp_path / "run", show_progress=False, out=lambda line: None)
    assert summary["plan"] == "zerocopy" and summary["step"] == 600 and summary["device"] == "cuda"
    assert all(math.isfinite(value) for value in summary["losses"].values())
    collection = ("collect_graph",) if collect_graph else ("act", "env", "store")
    assert all(summary["breakdown_ms"][name] > 0 for name in collection)
    assert set(summary["baseline_means"]) == {"heuristic", "random"}
    print(
        f"market zerocopy K=10 collect_graph={collect_graph}: {summary['step'] / summary['wall_seconds']:.1f} "
        f"updates/s; {summary['breakdown_ms']}"
    )


def test_an_evaluation_is_timed_from_when_the_device_has_run_the_training_queued_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU the clock starts after a synchronize (else the evaluation's first read-back waits for the queued
    updates, and the wait counts as evaluating); on the CPU, where nothing is queued, at once."""
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: events.append(f"synchronize {device}"))
    monkeypatch.setattr(train.time, "perf_counter", lambda: events.append("clock") or 7.0)
    assert train.evaluation_started(torch.device("cuda", 1)) == 7.0
    assert events == ["synchronize cuda:1", "clock"]
    events.clear()
    assert train.evaluation_started(torch.device("cpu")) == 7.0
    assert events == ["clock"]
