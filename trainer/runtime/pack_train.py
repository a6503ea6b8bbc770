"""`trainer train-pack`: the seeds of a sweep (or any runs `trainer.execution.pack` can pack) trained as one pack.

Each run is built as `trainer train` builds it (`build_run`: its own environment, replay, generators and run
folder) and warmed up on its own; then one `Pack` stacks their tensors and one `PackPlan` runs every update of
all of them (graph plans: the packed graph; eager: the vmapped eager step). Between updates each run collects
from its own environment with its own policy, and at its own points evaluates (best-policy selection), reports
(progress.json), checkpoints, and at the end writes its summary.json, exactly as a solo run's folder holds them.
Their metrics are served (`run.metrics_port`) and pushed as one registry, each sample labelled with its `run`.

Every report also goes, as one pack report with a `runs` entry per run (index, seed, trial, step, returns,
diverged), to `on_report`: the CLI sends it to the controller (`trainer/runtime/progress.py`), whose job shows
each run's progress (`service.domain.RunProgress`).

A run whose update the guard skipped (a non-finite loss or gradient) is reported at the next report and frozen:
its parameters stay as they were before the skipped update, it no longer collects or evaluates, and its summary
says so (`diverged_at_step`); the other runs go on.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import torch

from contracts.config import TrainConfig, dump_config
from trainer.algo.step import StepOutput
from trainer.execution.pack import Pack, PackError, PackOutput, PackPlan, PackRun
from trainer.runtime.metrics import pack_registry, push, resolve_metrics_port, serve
from trainer.runtime.train import (
    Run,
    build_run,
    collect,
    crossed,
    evaluate_for_selection,
    fill_replay,
    hold_run_dir,
    report,
    save_checkpoint,
    write_summary,
)


class PackMember:
    """Run i's view of the pack's plan, where the training loop's helpers (`report`) read a run's plan."""

    def __init__(self, plan: PackPlan, index: int) -> None:
        self.plan, self.index = plan, index
        self.name = plan.name
        self.steps_per_call = plan.steps_per_call

    def run(self, step: int) -> StepOutput:
        raise PackError("a packed run's updates run through its pack (PackPlan.run), not one run at a time")


def build_pack(
    configs: Sequence[TrainConfig], run_dirs: Sequence[Path], checkpoint_urls: Sequence[str | None] | None = None
) -> tuple[list[Run], PackPlan]:
    """Every run built and warmed up as `trainer train` does it, then packed (`PackError` if they cannot be).
    Run i checkpoints at `checkpoint_urls[i]` when given (a search's trial location), else in its run folder."""
    urls = list(checkpoint_urls) if checkpoint_urls is not None else [None] * len(configs)
    runs: list[Run] = []

    def make(i: int, config: TrainConfig) -> PackRun:
        run_dirs[i].mkdir(parents=True, exist_ok=True)
        dump_config(config, run_dirs[i] / "config.json")
        run = build_run(config, run_dirs[i], urls[i])
        if run.collect_in_graph:
            raise PackError("a packed run collects through its own objects: set run.collect_graph=false")
        fill_replay(run)
        runs.append(run)
        return PackRun(run.state, run.replay, run.generator)

    pack = Pack(configs, make)
    plan = PackPlan.for_plan(pack, runs[0].plan_name)
    for i, run in enumerate(runs):
        run.built_plan = PackMember(plan, i)
    return runs, plan


def _tagged(out: Callable[[str], None], tag: str, line: str) -> None:
    out(f"{tag} {line}")


def run_losses(output: PackOutput, index: int) -> dict[str, float]:
    return {name: float(values[index]) for name, values in output.losses.items()}


Report = Callable[[dict[str, Any]], None]


def run_pack_training(
    configs: Sequence[TrainConfig],
    run_dirs: Sequence[Path],
    out: Callable[[str], None] = print,
    *,
    trials: Sequence[int] | None = None,
    on_report: Report | None = None,
    checkpoint_urls: Sequence[str | None] | None = None,
) -> list[dict[str, Any]]:
    """Train every run to its `run.steps` as one pack; each run's summary (also in its run_dir/summary.json).

    `trials`: the Optuna trial each run trains (a search's pack), named in its log lines and its progress entry;
    `on_report` gets each pack report (`pack_report`) as the runs' progress.json files are written;
    `checkpoint_urls`: each run's checkpoint location (default: its run folder)."""
    if len(set(run_dirs)) != len(run_dirs):
        raise PackError("each run of a pack needs its own run folder")
    if trials is not None and len(trials) != len(configs):
        raise PackError(f"{len(configs)} runs and {len(trials)} trials: one trial per run")
    with contextlib.ExitStack() as held:
        for path in run_dirs:
            held.enter_context(hold_run_dir(path))
        return _train(configs, run_dirs, out, trials, on_report, checkpoint_urls)


def _tag(index: int, config: TrainConfig, trials: Sequence[int] | None) -> str:
    return f"[run {index} seed {config.run.seed}" + (f" trial {trials[index]}]" if trials is not None else "]")


def pack_report(
    runs: Sequence[Run],
    trials: Sequence[int] | None,
    evaluations: dict[int, float],
    frozen: Collection[int],
) -> dict[str, Any]:
    """The pack's progress as one report: a live run's plan and timings (one step serves every run), and per run
    (`runs`) its index, seed, trial, step, last training and evaluation return, and whether it diverged."""
    first = next((run.last_report for i, run in enumerate(runs) if i not in frozen), runs[0].last_report)
    shared = {key: first.get(key) for key in ("steps", "plan", "step_ms", "epoch_seconds", "breakdown_ms")}
    entries = [
        {
            "run": i,
            "seed": run.config.run.seed,
            "trial": None if trials is None else trials[i],
            "step": run.step,
            "train_return": run.last_report.get("train_return_mean"),
            "eval_return": evaluations.get(i),
            "diverged": i in frozen,
        }
        for i, run in enumerate(runs)
    ]
    return {**shared, "step": max(run.step for run in runs), "runs": entries}


def _train(
    configs: Sequence[TrainConfig],
    run_dirs: Sequence[Path],
    out: Callable[[str], None],
    trials: Sequence[int] | None,
    on_report: Report | None,
    checkpoint_urls: Sequence[str | None] | None,
) -> list[dict[str, Any]]:
    runs, plan = build_pack(configs, run_dirs, checkpoint_urls)
    config = configs[0]  # schedules (steps, log, eval, checkpoints) are shared by every run of a pack
    online = config.data.source != "offline"
    frozen: dict[int, dict[str, torch.Tensor]] = {}  # run -> its state when it was frozen
    diverged_at: dict[int, int] = {}
    skips = [0] * len(runs)  # each run's guard skips at the last report
    say = [functools.partial(_tagged, out, _tag(i, c, trials)) for i, c in enumerate(configs)]
    evaluations: dict[int, float] = {}  # run -> its last evaluation's mean return
    registry = pack_registry([run.metrics.registry for run in runs])  # every run's families, labelled `run`
    port = resolve_metrics_port(config.run.metrics_port)
    exporter = serve(registry, port) if port is not None else None
    if exporter is not None:
        out(f"serving the pack's metrics on :{exporter.port}/metrics (label run = 0..{len(runs) - 1})")
    started = time.perf_counter()
    step = 0
    while step < config.run.steps:
        advanced = plan.steps_per_call
        for i, run in enumerate(runs):
            if online and i not in frozen:
                collect(run, run.act_fn(), advanced)
        output = plan.run(step)
        step += advanced
        for i, saved in frozen.items():  # the pack steps every run; a frozen one's state is put back
            runs[i].state.load_tensors(saved)
        wall = time.perf_counter() - started
        finishing = step >= config.run.steps
        logging = crossed(step, advanced, config.run.log_every) or finishing
        if logging:  # one read of every run's guard per report
            now = [int(state.guard_skips) for state in plan.pack.states]
            for i, count in enumerate(now):
                if count > skips[i] and i not in frozen:
                    frozen[i] = {name: t.clone() for name, t in runs[i].state.tensors().items()}
                    diverged_at[i] = step
                    say[i](f"diverged: the guard skipped {count - skips[i]} update(s) by step {step}; frozen")
            skips = now
        for i, run in enumerate(runs):
            if i in frozen and diverged_at[i] < step:
                continue
            run.step, run.wall_seconds = step, wall
            run.timer.end_step()
            run.metrics.steps_done(advanced)
            periodic = config.run.eval_every > 0  # 0: no periodic evaluation (nor a division by it)
            evaluating = periodic and (crossed(step, advanced, config.run.eval_every) or finishing)
            if evaluating and i not in frozen:
                evaluations[i] = evaluate_for_selection(run, say[i])
            if logging:
                report(run, run_losses(output, i), say[i])
            if crossed(step, advanced, config.run.checkpoint_every) and not finishing:
                save_checkpoint(run)
        if logging and on_report is not None:
            on_report(pack_report(runs, trials, evaluations, frozen))
    summaries = [finish_run(run, diverged_at.get(i), say[i]) for i, run in enumerate(runs)]
    if on_report is not None:  # the last word: each run's final evaluation (a search's objective)
        finals = {i: s["eval_return_mean"] for i, s in enumerate(summaries) if s.get("eval_return_mean") is not None}
        on_report(pack_report(runs, trials, finals, frozen))
    pushgateway = config.run.pushgateway_url or os.environ.get("FOXHUNT_PUSHGATEWAY_URL")
    if pushgateway:  # as `trainer train` does: an unreachable Pushgateway must not fail finished runs
        try:
            push(registry, pushgateway, runs[0].metrics.info_labels["job_id"])
        except OSError as error:
            out(f"warning: metrics not pushed to {pushgateway}: {error}")
    if exporter is not None:
        exporter.close()
    return summaries


def finish_run(run: Run, diverged_at: int | None, out: Callable[[str], None]) -> dict[str, Any]:
    """A packed run's last checkpoint, best-policy selection, final evaluation and summary.json."""
    save_checkpoint(run)
    summary = write_summary(
        run,
        out,
        {"stopped_by_time_limit": False, "stopped_at_return": False, "packed": True, "diverged_at_step": diverged_at},
    )
    returns = summary["eval_returns"]
    if returns:
        out(f"evaluation: mean return {summary['eval_return_mean']:.2f} over {len(returns)} episodes")
    return summary
