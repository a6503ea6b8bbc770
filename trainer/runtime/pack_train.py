"""`trainer train-pack`: the seeds of a sweep (or any runs `trainer.execution.pack` can pack) trained as one pack.

Each run is built as `trainer train` builds it (`build_run`: its own environment, replay, generators and run
folder) and warmed up on its own; then one `Pack` stacks their tensors and one `PackPlan` runs every update of
all of them (graph plans: the packed graph; eager: the vmapped eager step). Between updates every live run
collects from its own environment with its own policy, all of them at once (`PackCollector`: one batched act,
one batched replay write, on a GPU as CUDA graphs; the torch market's envs one batch of every run's; run by run
where it cannot, e.g. goal-conditioned Gymnasium envs). Each run at its own points
evaluates (best-policy selection; the runs' episodes played side by side with a collector), reports
(progress.json), checkpoints, and at the end writes its summary.json, exactly as a solo run's folder holds them.
Their metrics are served (`run.metrics_port`) and pushed as one registry, each sample labelled with its `run`.
One pack step serves every run, so it is timed once: the runs share one timer, each run's report and metrics
reading it.

Every report also goes, as one pack report with a `runs` entry per run (index, seed, trial, step, returns,
diverged), to `on_report`: the CLI sends it to the controller (`trainer/runtime/progress.py`), whose job shows
each run's progress (`service.domain.RunProgress`).

The pack stops at run.max_seconds of its training loop, as `trainer train` does (every run's summary then says
`stopped_by_time_limit`). A run whose update the guard skipped (a non-finite loss or gradient) is reported at the
next report and frozen: its parameters stay as they were before the skipped update, it no longer collects or
evaluates, and its summary says so (`diverged_at_step`); the other runs go on.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from contracts.config import TrainConfig, dump_config
from trainer.algo.step import StepOutput
from trainer.execution.pack import Pack, PackError, PackOutput, PackPlan, PackRun
from trainer.execution.pack_collect import PackCollector
from trainer.runtime.checkpoint import Checkpointer
from trainer.runtime.metrics import METRICS_READER, pack_registry, push, resolve_metrics_port, serve
from trainer.runtime.train import (
    EXIT_TERMINATED,
    FINAL_EVAL_SEED,
    SELECT_EVAL_SEED,
    Run,
    Termination,
    build_run,
    checkpoint_location,
    collect,
    crossed,
    evaluate_for_selection,
    evaluation_started,
    fill_replay,
    hold_run_dir,
    load_best,
    report,
    restore_checkpoint,
    save_checkpoint,
    select,
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


DIVERGED_AT = "diverged_at_step"
"""A packed run's checkpoint metadata: the step its guard froze it at (None while it trains)."""


def resume_points(locations: Sequence[str]) -> list[int | None]:
    """The checkpoint step each run of a pack resumes from, or all None (start at step 0).

    A run frozen as diverged resumes from its latest checkpoint (written when it froze) and stays frozen; every
    other run from the newest step that all of them completed, so the pack goes on from one step (a crash between
    the runs' checkpoints of one step leaves some a step behind: each keeps two). Where the running runs share no
    complete step, every run starts again at step 0."""
    checkpointers = [Checkpointer(location) for location in locations]
    steps = [checkpointer.complete_steps() for checkpointer in checkpointers]
    frozen = {
        i: found[-1]
        for i, (checkpointer, found) in enumerate(zip(checkpointers, steps, strict=True))
        if found and checkpointer.meta(found[-1]).get(DIVERGED_AT) is not None
    }
    running = [set(found) for i, found in enumerate(steps) if i not in frozen]
    common = set.intersection(*running) if running else set()
    if running and not common:
        return [None] * len(locations)
    at = max(common) if common else None
    return [frozen.get(i, at) for i in range(len(locations))]


def build_pack(
    configs: Sequence[TrainConfig],
    run_dirs: Sequence[Path],
    checkpoint_urls: Sequence[str | None] | None = None,
    resume: bool = False,
) -> tuple[list[Run], PackPlan, dict[int, int]]:
    """Every run built and warmed up as `trainer train` does it (`resume`: restored from `resume_points`), then
    packed (`PackError` if they cannot be); also the runs restored as diverged, with the step each froze at.
    Run i checkpoints at `checkpoint_urls[i]` when given (a search's trial location), else in its run folder."""
    urls = list(checkpoint_urls) if checkpoint_urls is not None else [None] * len(configs)
    points = resume_points([checkpoint_location(d, u) for d, u in zip(run_dirs, urls, strict=True)])
    runs: list[Run] = []
    diverged: dict[int, int] = {}

    def make(i: int, config: TrainConfig) -> PackRun:
        run_dirs[i].mkdir(parents=True, exist_ok=True)
        dump_config(config, run_dirs[i] / "config.json")
        run = build_run(config, run_dirs[i], urls[i])
        if run.collect_in_graph:
            raise PackError("a packed run collects through its own objects: set run.collect_graph=false")
        if resume and points[i] is not None:
            meta = restore_checkpoint(run, points[i]) or {}
            if meta.get(DIVERGED_AT) is not None:
                diverged[i] = meta[DIVERGED_AT]
        fill_replay(run)
        runs.append(run)
        return PackRun(run.state, run.replay, run.generator)

    pack = Pack(configs, make)
    plan = PackPlan.for_plan(pack, runs[0].plan_name)
    shared = runs[0].timer  # one pack step serves every run: one timer, read by each run's report and metrics
    for i, run in enumerate(runs):
        run.built_plan = PackMember(plan, i)
        if i > 0:
            run.timer = shared
            run.metrics.attach_timer(shared, reader=f"{METRICS_READER}-{i}")
    for i in diverged:
        runs[i].metrics.detach_timer()
    return runs, plan, diverged


def pack_collector(pack: Pack, runs: Sequence[Run], out: Callable[[str], None]) -> PackCollector | None:
    """The pack's batched collection, or None (said once) where its runs collect one by one."""
    try:
        return PackCollector(pack, [run.source for run in runs], [run.explore_generator for run in runs])
    except PackError as error:
        out(f"the pack's runs collect one by one: {error}")
        return None


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
    resume: bool = False,
) -> list[dict[str, Any]]:
    """Train every run to its `run.steps` as one pack; each run's summary (also in its run_dir/summary.json).

    `trials`: the Optuna trial each run trains (a search's pack), named in its log lines and its progress entry;
    `on_report` gets each pack report (`pack_report`) as the runs' progress.json files are written;
    `checkpoint_urls`: each run's checkpoint location (default: its run folder);
    `resume`: go on from the runs' checkpoints (`resume_points`). SIGTERM checkpoints every run and exits 143,
    as `trainer train` does."""
    if len(set(run_dirs)) != len(run_dirs):
        raise PackError("each run of a pack needs its own run folder")
    if trials is not None and len(trials) != len(configs):
        raise PackError(f"{len(configs)} runs and {len(trials)} trials: one trial per run")
    with contextlib.ExitStack() as held:
        for path in run_dirs:
            held.enter_context(hold_run_dir(path))
        return _train(configs, run_dirs, out, trials, on_report, checkpoint_urls, resume, held)


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
    resume: bool,
    held: contextlib.ExitStack,
) -> list[dict[str, Any]]:
    runs, plan, diverged_at = build_pack(configs, run_dirs, checkpoint_urls, resume)
    for run in runs:  # their envs' worker processes end with the pack (a search trains packs in one process)
        held.callback(run.source.close)
    config = configs[0]  # schedules (steps, log, eval, checkpoints) are shared by every run of a pack
    online = config.data.source != "offline"
    # run -> its state when it was frozen (a run restored as diverged is frozen from the start)
    frozen = {i: {name: t.clone() for name, t in runs[i].state.tensors().items()} for i in diverged_at}
    running = [run for i, run in enumerate(runs) if i not in frozen] or runs
    timer = runs[0].timer  # the pack's (`build_pack`)
    skips = [0] * len(runs)  # each run's guard skips at the last report
    say = [functools.partial(_tagged, out, _tag(i, c, trials)) for i, c in enumerate(configs)]
    evaluations: dict[int, float] = {}  # run -> its last evaluation's mean return
    registry = pack_registry([run.metrics.registry for run in runs])  # every run's families, labelled `run`
    port = resolve_metrics_port(config.run.metrics_port)
    exporter = serve(registry, port) if port is not None else None
    if exporter is not None:
        out(f"serving the pack's metrics on :{exporter.port}/metrics (label run = 0..{len(runs) - 1})")
    collector = pack_collector(plan.pack, runs, out) if online else None
    step = max(run.step for run in running)  # 0, or the step the pack resumed from
    if resume:
        say_resumed(out, step, diverged_at, say)
    started = time.perf_counter() - max(run.wall_seconds for run in running)
    termination = Termination()
    termination.install()
    limit = config.run.max_seconds
    timed_out = False
    while step < config.run.steps and not timed_out:
        if termination.requested:
            for i, run in enumerate(runs):
                save_checkpoint(run, {DIVERGED_AT: diverged_at.get(i)})
            out(f"terminated at step {step}: every run's checkpoint written")
            raise SystemExit(EXIT_TERMINATED)
        advanced = plan.steps_per_call
        live = [i for i in range(len(runs)) if i not in frozen]
        if live:  # the pack's step spans its collection and update; every run shares its timer
            timer.begin_step()
        if collector is not None and live:
            collector.collect(live, step, advanced, timer)
        elif online:
            for i in live:
                collect(runs[i], runs[i].act_fn(), advanced)
        with timer.section("update") if live else contextlib.nullcontext():  # the pack's, as one
            output = plan.run(step)
        if live:
            timer.end_step()
        step += advanced
        for i, saved in frozen.items():  # the pack steps every run; a frozen one's state is put back
            runs[i].state.load_tensors(saved)
        wall = time.perf_counter() - started
        timed_out = limit is not None and wall >= limit  # as `trainer train`: the loop's own time, shared by all runs
        finishing = step >= config.run.steps or timed_out
        logging = crossed(step, advanced, config.run.log_every) or finishing
        if logging:  # one read of every run's guard per report
            now = [int(state.guard_skips) for state in plan.pack.states]
            for i, count in enumerate(now):
                if count > skips[i] and i not in frozen:
                    frozen[i] = {name: t.clone() for name, t in runs[i].state.tensors().items()}
                    diverged_at[i] = step
                    runs[i].metrics.detach_timer()
                    say[i](f"diverged: the guard skipped {count - skips[i]} update(s) by step {step}; frozen")
            skips = now
        periodic = config.run.eval_every > 0  # 0: no periodic evaluation (nor a division by it)
        evaluating = periodic and (crossed(step, advanced, config.run.eval_every) or finishing)
        evaluated = 0.0  # the pack's evaluation time, every live run's
        if evaluating:
            evaluating_since = evaluation_started(runs[0].device)
            played = selection_returns(collector, runs, frozen)
            for i, run in enumerate(runs):
                if i not in frozen:
                    run.step = step  # the step its best policy is of
                    evaluations[i] = (
                        select(run, played[i], say[i]) if i in played else evaluate_for_selection(run, say[i])
                    )
            evaluated = time.perf_counter() - evaluating_since
        for i, run in enumerate(runs):
            if i in frozen and diverged_at[i] < step:
                continue
            run.step, run.wall_seconds = step, wall
            run.eval_seconds += 0.0 if i in frozen else evaluated
            run.metrics.steps_done(advanced)
            if logging:
                report(run, run_losses(output, i), say[i])
            froze_now = diverged_at.get(i) == step  # its checkpoint says so: a resumed pack keeps it frozen
            if (crossed(step, advanced, config.run.checkpoint_every) or froze_now) and not finishing:
                save_checkpoint(run, {DIVERGED_AT: diverged_at.get(i)})
        if logging and on_report is not None:
            on_report(pack_report(runs, trials, evaluations, frozen))
    wall = time.perf_counter() - started  # the loop's whole time, its last evaluation included, as a solo run's
    for i in range(len(runs)):
        if i not in frozen:
            runs[i].wall_seconds = wall
    if timed_out:
        out(f"time limit: stopped at step {step} of {config.run.steps} (run.max_seconds={limit:g})")
    summaries = finish_runs(runs, collector, diverged_at, say, timed_out)
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


def say_resumed(
    out: Callable[[str], None], step: int, diverged_at: dict[int, int], say: Sequence[Callable[[str], None]]
) -> None:
    if step == 0 and not diverged_at:
        out("--resume: no checkpoint common to the pack's runs; starting at step 0")
        return
    out(f"resumed from checkpoint at step {step}")
    for i, at in sorted(diverged_at.items()):
        say[i](f"diverged at step {at} before the restart: stays frozen")


def selection_returns(
    collector: PackCollector | None, runs: Sequence[Run], frozen: Collection[int]
) -> dict[int, list[float]]:
    """Each live run's selection episodes (`evaluate_for_selection`'s), played at once; none without a collector."""
    if collector is None:
        return {}
    live = [i for i in range(len(runs)) if i not in frozen]
    episodes = runs[0].config.run.eval_select_episodes
    played = collector.evaluate(live, episodes, [runs[i].config.run.seed + SELECT_EVAL_SEED for i in live])
    return dict(zip(live, played, strict=True))


def finish_runs(
    runs: Sequence[Run],
    collector: PackCollector | None,
    diverged_at: dict[int, int],
    say: Sequence[Callable[[str], None]],
    timed_out: bool,
) -> list[dict[str, Any]]:
    """Every run's last checkpoint, best-policy selection, final evaluation (all runs' episodes played at once
    where the pack has a collector) and summary.json (`timed_out`: the pack stopped at run.max_seconds)."""
    for i, run in enumerate(runs):
        save_checkpoint(run, {DIVERGED_AT: diverged_at.get(i)})
    finals: list[list[float]] | None = None
    if collector is not None:
        for run, out in zip(runs, say, strict=True):
            load_best(run, out)
        seeds = [run.config.run.seed + FINAL_EVAL_SEED for run in runs]
        finals = collector.evaluate(range(len(runs)), runs[0].config.run.eval_episodes, seeds)
    return [
        finish_run(run, diverged_at.get(i), say[i], None if finals is None else finals[i], timed_out)
        for i, run in enumerate(runs)
    ]


def finish_run(
    run: Run, diverged_at: int | None, out: Callable[[str], None], returns: list[float] | None, timed_out: bool
) -> dict[str, Any]:
    """A packed run's summary.json, after its last checkpoint; `returns`: its final evaluation's, if played."""
    outcome = {"stopped_by_time_limit": timed_out, "stopped_at_return": False, "packed": True}
    summary = write_summary(run, out, {**outcome, DIVERGED_AT: diverged_at}, returns)
    returns = summary["eval_returns"]
    if returns:
        out(f"evaluation: mean return {summary['eval_return_mean']:.2f} over {len(returns)} episodes")
    return summary
