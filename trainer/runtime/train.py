"""The training loop: collect, update through the chosen plan, report, checkpoint, evaluate.

The loop only orchestrates; the update is `trainer.algo.step.train_step` run by a plan, the data comes
from a source (`trainer.execution.data`), and every figure it prints is also in `progress.json` and, when
enabled, on the Prometheus endpoint.

With `run.eval_every` set, the loop also evaluates the greedy policy every that many steps (and at
the last step) and keeps a copy of the best one, which the final evaluation then scores: a DQN's
last policy is often not its best, and which one it is can turn on float rounding.

A run folder has one trainer at a time: `run_training` holds an exclusive lock on `trainer.lock` in it
for its whole life and refuses a folder another live trainer holds (`RunDirBusy`), so a retry or a
second job started beside a trainer that is still running (an orphan whose supervisor died) cannot
interleave its checkpoints and progress with that trainer's.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from prometheus_client import CollectorRegistry
from torch import Tensor
from tqdm import tqdm

from contracts.config import STEPS_PER_EPOCH, TrainConfig, dump_config
from contracts.jsonfile import write_json_atomic
from trainer.algo.model import ModelDims, greedy_action
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.rng import make_generator
from trainer.algo.state import TrainState
from trainer.execution.collect import MarketCollector, collect_graph_applies, graph_capture
from trainer.execution.data import OnlineSource, Source, make_source
from trainer.execution.data.gym_source import linear_epsilon
from trainer.execution.plans import make_plan, resolve_plan
from trainer.execution.plans.base import Plan
from trainer.runtime.checkpoint import Checkpoint, Checkpointer, decode_generator, encode_generator
from trainer.runtime.metrics import Exporter, TrainerMetrics, build_info, push, resolve_metrics_port, serve
from trainer.runtime.timing import Interleaved, StepTimer, format_breakdown

if TYPE_CHECKING:
    from trainer.execution.data.market_torch import TorchMarketSource
    from trainer.execution.data.offline import OfflineSource

EXIT_TERMINATED = 143
MODEL_NAME = "c51-branching"
FINAL_EVAL_SEED = 10_000
"""Episode i of the final evaluation is seeded run.seed + FINAL_EVAL_SEED + i."""
SELECT_EVAL_SEED = 20_000
"""Episode i of every periodic evaluation is seeded run.seed + SELECT_EVAL_SEED + i: the same start
states each time, so snapshots are compared on equal terms, and none of the final evaluation's (while
run.eval_episodes <= 10,000), so the final figure is not the one the selection was made on."""
BEST_ONLINE = "best.online"
"""Name of the best snapshot in a checkpoint's state tensors, beside `TrainState.tensors()`."""


def default_run_dir() -> Path:
    return Path("runs") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


LOCK_FILE = "trainer.lock"
"""In the run folder: flock'ed by the trainer that writes there, and holding its pid (for the message)."""


class RunDirBusy(Exception):
    """Another live trainer holds the run folder."""


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """The run folder for this trainer alone while the block runs, else RunDirBusy at once.

    An flock, not a pid file: the kernel drops it when the holder dies, however it dies (SIGKILL, OOM),
    so a stale file never blocks a resume, while a live holder (and the processes it forked) keeps it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / LOCK_FILE, "a+")  # noqa: SIM115 (held open for the life of the block)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise RunDirBusy(
                f"run folder {run_dir} is in use by another live trainer{by}; two trainers must never write "
                "one run folder: wait for it to end, stop it, or give this run another --run-dir"
            ) from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def resolve_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        print("warning: run.device=cuda but no CUDA GPU is visible; training on the CPU", file=sys.stderr)
        return torch.device("cpu")
    if choice in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


class Termination:
    """SIGTERM/SIGINT set a flag; the loop checkpoints and exits 143 at the next step boundary."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self)


@dataclass
class BestPolicy:
    """The best greedy policy periodic evaluation has seen: its step, mean return and parameters.

    Ties go to the later evaluation, so the selection departs from the most recent policy only when
    an earlier one scored strictly higher. A mean that is not finite is never taken.
    """

    step: int | None = None
    mean_return: float | None = None
    online: Tensor | None = None  # [Pm] copy of TrainState.online, on the training device

    def offer(self, step: int, mean_return: float, online: Tensor) -> bool:
        """Keep `online` if its mean return is the best so far; True if it was kept."""
        if not math.isfinite(mean_return):
            return False
        if self.mean_return is not None and mean_return < self.mean_return:
            return False
        if self.online is None:
            self.online = online.clone()
        else:
            self.online.copy_(online)
        self.step, self.mean_return = step, mean_return
        return True

    def meta(self) -> dict[str, Any]:
        return {"step": self.step, "mean_return": self.mean_return}


@dataclass
class Run:
    """Everything one training run holds, built from its config."""

    config: TrainConfig
    run_dir: Path
    device: torch.device
    state: TrainState
    replay: ReplayBuffer
    source: Source
    """Online (`OnlineSource`: market, gym) or offline (`OfflineSource`), as `data.source` says."""
    timer: StepTimer
    plan_name: str
    """The plan that runs: `run.plan`, or eager where that cannot run here (with a warning)."""
    generator: torch.Generator
    explore_generator: torch.Generator
    checkpointer: Checkpointer
    metrics: TrainerMetrics
    step: int = 0
    wall_seconds: float = 0.0
    eval_seconds: float = 0.0
    """Of `wall_seconds`, the loop's periodic evaluations (best-policy selection): where a run's time goes
    beside its timed step sections."""
    last_report: dict[str, Any] = field(default_factory=dict)
    best: BestPolicy = field(default_factory=BestPolicy)
    built_plan: Plan | None = None
    """Built by `start_plan` once the replay holds its warm-up (graph plans capture on real samples)."""
    collect_in_graph: bool = False
    """Collection runs through a `MarketCollector` (run.collect_graph where it applies; the replay's
    writer keeps its bookkeeping on the device)."""
    collector: MarketCollector | None = None
    """Built by `start_plan` when `collect_in_graph` (its graphs captured there, before the timed loop)."""

    @property
    def plan(self) -> Plan:
        """The plan that runs the updates (`start_plan` builds it)."""
        if self.built_plan is None:
            raise ValueError("no plan yet: start_plan builds it after the replay's warm-up")
        return self.built_plan

    @property
    def online_source(self) -> OnlineSource:
        """The source as the collecting kind; only online runs (data.source market or gym) collect."""
        return cast(OnlineSource, self.source)

    def act_fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        views = self.state.main.views(self.state.online)

        @torch.no_grad()
        def act(obs: torch.Tensor) -> torch.Tensor:
            return greedy_action(views, obs.to(self.device, torch.float32), self.state.dims, self.state.atoms)

        return act


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def checkpoint_location(run_dir: Path, checkpoint_url: str | None) -> str:
    """Where a run checkpoints: the job's location when given, else run_dir/checkpoints."""
    return checkpoint_url or str(run_dir / "checkpoints")


def build_run(config: TrainConfig, run_dir: Path, checkpoint_url: str | None = None) -> Run:
    """Everything a run holds, built from `config`; checkpoints go to `checkpoint_url` (any fsspec URL,
    the job's location the CLI resolved), else to run_dir/checkpoints."""
    seed_everything(config.run.seed)
    if config.run.cpu_threads is not None:
        torch.set_num_threads(config.run.cpu_threads)
    device = resolve_device(config.run.device)
    source = make_source(config, device)
    spec = source.spec
    dims = ModelDims.build(config.model, spec.obs_dim, spec.branches, spec.actions)
    state = TrainState.create(config, dims, device)
    generator = make_generator(config.run.seed, "step", device, config.run.rng)  # the replay's and the step's
    collect_steps = config.run.steps_per_replay * config.data.env_steps_per_update
    in_graph = config.run.collect_graph and collect_graph_applies(source, device, collect_steps)
    replay = ReplayBuffer(config, spec, device, generator, device_writer=in_graph)
    timer = StepTimer(device)
    plan_name = resolve_plan(config.run.plan, device)
    checkpoint_url = checkpoint_location(run_dir, checkpoint_url)
    explore_generator = make_generator(config.run.seed, "explore", device, config.run.rng)
    metrics = TrainerMetrics(
        CollectorRegistry(), plan=plan_name, info=build_info(plan=plan_name, model=MODEL_NAME, device=str(device))
    )
    metrics.attach_timer(timer)
    metrics.gpu_memory(device)
    metrics.learning_rates({"main": config.optim.lr, "aux": config.optim.aux_lr})
    return Run(
        config,
        run_dir,
        device,
        state,
        replay,
        source,
        timer,
        plan_name,
        generator,
        explore_generator,
        Checkpointer(checkpoint_url),
        metrics,
        collect_in_graph=in_graph,
    )


def save_checkpoint(run: Run, extra_meta: dict[str, Any] | None = None) -> None:
    """Write the training state as of the last update, plus the best snapshot when there is one.

    `online` is always the live network, consistent with its target and Adam moments, so a resumed
    run (even with a larger `run.steps`) trains on from where it stopped. The best policy travels
    beside it as the tensor `best.online` and `meta["best_eval"]` ({"step", "mean_return"}).
    `extra_meta`: what a caller's own loop needs back on resume (a pack: the step a run diverged at).
    """
    state = run.state.tensors()
    if run.best.online is not None:
        state = {**state, BEST_ONLINE: run.best.online}
    run.checkpointer.save(
        Checkpoint(
            step=run.step,
            state=state,
            replay=run.replay.state_dict(),
            meta={
                "generator": encode_generator(run.generator),
                "explore_generator": encode_generator(run.explore_generator),
                "torch_cpu_rng": encode_generator(torch.default_generator),
                "wall_seconds": run.wall_seconds,
                "eval_seconds": run.eval_seconds,
                "config": run.config.model_dump(mode="json"),
                "best_eval": run.best.meta(),
                "param_layout": run.state.layout_record(),
                **(extra_meta or {}),
            },
        )
    )


def restore_checkpoint(run: Run, step: int | None = None) -> dict[str, Any] | None:
    """Load the latest complete checkpoint (or that of `step`) into `run`; its metadata, None if there is none."""
    checkpoint = run.checkpointer.load_latest() if step is None else run.checkpointer.load(step)
    if checkpoint is None:
        return None
    run.state.check_layout(checkpoint.meta.get("param_layout"))
    state = dict(checkpoint.state)
    best_online = state.pop(BEST_ONLINE, None)
    run.state.load_tensors({name: tensor.to(run.device) for name, tensor in state.items()})
    if best_online is not None:
        best = checkpoint.meta["best_eval"]
        run.best = BestPolicy(best["step"], best["mean_return"], best_online.to(run.device))
    run.replay.load_state_dict({name: tensor.to(run.device) for name, tensor in checkpoint.replay.items()})
    decode_generator(run.generator, checkpoint.meta["generator"])
    decode_generator(run.explore_generator, checkpoint.meta["explore_generator"])
    decode_generator(torch.default_generator, checkpoint.meta["torch_cpu_rng"])
    run.step = checkpoint.step
    run.wall_seconds = checkpoint.meta.get("wall_seconds", 0.0)
    run.eval_seconds = checkpoint.meta.get("eval_seconds", 0.0)
    return checkpoint.meta


def fill_replay(run: Run) -> None:
    """Offline: load the dataset once. Online: collect `learning_starts` transitions at random."""
    config = run.config
    if config.data.source == "offline":
        if len(run.replay) == 0:
            run.replay.extend(cast("OfflineSource", run.source).transitions())
        return
    while len(run.replay) < max(config.data.learning_starts, config.run.batch_size):
        run.replay.add(run.online_source.collect(None, 1.0, run.explore_generator))


def start_plan(run: Run) -> None:
    """Build the plan: after the replay is filled (or restored), as graph plans capture on real samples."""
    if len(run.replay) == 0:
        raise ValueError("the plan is built after the replay's warm-up: fill_replay first")
    run.built_plan = make_plan(run.plan_name, run.state, run.replay, run.config, run.timer, run.generator)
    if run.collect_in_graph:
        source = cast("TorchMarketSource", run.source)
        data, capture = run.config.data, graph_capture(run.device)
        run.collector = MarketCollector(source, run.replay, run.act_fn(), data, run.explore_generator, capture)
        run.collector.prepare(run.built_plan.steps_per_call)


def collect(run: Run, act: Callable[[Tensor], Tensor], updates: int) -> None:
    """The rows of the next `updates` updates: `data.env_steps_per_update` per update, epsilon-greedy
    at that update's step. Timed as `act` (the policy), `env` (the rest of a collect call: the
    epsilon draw, stepping the environments) and `store` (writing the rows into the replay).

    With a collector (run.collect_graph on the torch market), all of it is one CUDA graph replay with
    the network the collector captured (`act` is not called), timed as `collect_graph`."""
    if run.collector is not None:
        with run.timer.section("collect_graph"):
            run.collector.run(run.step, updates)
        return
    data = run.config.data
    for step in range(run.step, run.step + updates):
        epsilon = linear_epsilon(step, data.epsilon_start, data.epsilon_end, data.epsilon_decay_steps)
        for _ in range(data.env_steps_per_update):
            with Interleaved(run.timer, "env", "act") as split:
                rows = run.online_source.collect(split.wrap(act), epsilon, run.explore_generator)
            with run.timer.section("store"):
                run.replay.add(rows)


def report(run: Run, losses: dict[str, float], out: Callable[[str], None]) -> dict[str, Any]:
    # The timer's steps are plan calls of K updates each: report per update.
    per_call = run.plan.steps_per_call
    window = max(1, run.config.run.log_every // per_call)
    means = {name: ms / per_call for name, ms in run.timer.means_ms(window=window).items()}
    step_ms = means.pop("step", sum(means.values()))
    out(format_breakdown(run.plan.name, means))
    progress: dict[str, Any] = {
        "step": run.step,
        "steps": run.config.run.steps,
        "plan": run.plan.name,
        "step_ms": step_ms,
        "epoch_seconds": step_ms * STEPS_PER_EPOCH / 1000.0,
        "breakdown_ms": means,
        "losses": losses,
        "guard_skips": int(run.state.guard_skips),
        "replay_size": len(run.replay),
        "wall_seconds": run.wall_seconds,
    }
    metrics = run.metrics
    metrics.set_losses(losses)
    metrics.guard_skips(progress["guard_skips"])
    priorities = run.replay.sampler.priorities()[: len(run.replay)]
    if len(priorities):
        low, mean, high = (float(p) for p in (priorities.min(), priorities.mean(), priorities.max()))
        metrics.replay(len(run.replay), low, min(max(mean, low), high), high)  # equal priorities: a mean 1 ulp off
    if run.config.loss.causal:
        metrics.causal(run.state.causal_effects.tolist())
    finished = getattr(run.source, "finished_returns", None)
    if finished:
        progress["train_return_mean"] = float(np.mean(finished[-20:]))
    write_json_atomic(run.run_dir / "progress.json", progress, indent=2)
    run.last_report = progress
    return progress


def evaluate_for_selection(run: Run, out: Callable[[str], None]) -> float:
    """Score the current greedy policy on the selection seeds, keep it if it is the best so far; its mean."""
    config = run.config.run
    returns = run.source.evaluate(run.act_fn(), config.eval_select_episodes, config.seed + SELECT_EVAL_SEED)
    return select(run, returns, out)


def select(run: Run, returns: list[float], out: Callable[[str], None]) -> float:
    """Keep the current greedy policy if its selection `returns` have the best mean so far; that mean.
    `evaluate_for_selection`'s second half, for a pack that plays every run's selection episodes at once."""
    mean_return = float(np.mean(returns))
    if run.best.offer(run.step, mean_return, run.state.online):
        note = "best so far"
    elif run.best.mean_return is None:
        note = "not kept: no finite mean yet"
    else:
        note = f"best {run.best.mean_return:.2f} at step {run.best.step}"
    out(f"evaluation at step {run.step}: mean return {mean_return:.2f} over {len(returns)} episodes ({note})")
    return mean_return


def market_baselines(run: Run, returns: list[float]) -> dict[str, Any]:
    """The market's reference policies on the final evaluation's episodes (same seeds, same markets).

    For the market source with a final evaluation: `baseline_returns` and `baseline_means` (heuristic,
    random) and `margin_over_heuristic` = trained mean - heuristic mean; otherwise nothing.
    """
    config = run.config
    if config.data.source != "market" or not returns:
        return {}
    from trainer.execution.data.market_torch import baseline_returns

    played = baseline_returns(run.source.evaluate, len(returns), config.run.seed + FINAL_EVAL_SEED)
    means = {name: float(np.mean(values)) for name, values in played.items()}
    return {
        "baseline_returns": played,
        "baseline_means": means,
        "margin_over_heuristic": float(np.mean(returns)) - means["heuristic"],
    }


def load_best(run: Run, out: Callable[[str], None]) -> None:
    """Put the best policy periodic evaluation kept (if any) into the state, for the final evaluation."""
    if run.best.online is not None:
        with torch.no_grad():
            run.state.online.copy_(run.best.online)
        out(f"selected the policy of step {run.best.step} (mean return {run.best.mean_return:.2f})")


def write_summary(
    run: Run, out: Callable[[str], None], outcome: dict[str, Any], returns: list[float] | None = None
) -> dict[str, Any]:
    """Select the best policy seen, evaluate it, and write summary.json: one place for `train` and a pack's runs.

    `outcome` says how the run ended (time limit, return reached, pack divergence); the market's
    baselines, where there are any, come last. `returns`: the final evaluation's, where the caller played it
    (a pack plays every run's at once, after `load_best`); else this loads the best policy and plays it.
    """
    config = run.config
    if returns is None:
        load_best(run, out)
        returns = run.source.evaluate(run.act_fn(), config.run.eval_episodes, config.run.seed + FINAL_EVAL_SEED)
    summary = {
        **run.last_report,
        "step": run.step,
        "eval_returns": returns,
        "eval_return_mean": float(np.mean(returns)) if returns else None,
        "best_eval_step": run.best.step,
        "best_eval_return": run.best.mean_return,
        "wall_seconds": run.wall_seconds,
        "eval_seconds": run.eval_seconds,
        "device": str(run.device),
        "parameters": run.state.parameter_count(),
        **outcome,
        **market_baselines(run, returns),
    }
    write_json_atomic(run.run_dir / "summary.json", summary, indent=2)
    return summary


def evaluation_started(device: torch.device) -> float:
    """The clock at a periodic evaluation's start, once `device` has run the training work queued before it: else
    the evaluation's first read-back waits for that work, and the wait counts as evaluating (`Run.eval_seconds`)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def crossed(step: int, advanced: int, every: int) -> bool:
    """Whether going from step - advanced to step passed a multiple of `every` (plans may advance > 1)."""
    return step // every > (step - advanced) // every


def run_training(
    config: TrainConfig,
    run_dir: Path,
    resume: bool = False,
    show_progress: bool = True,
    out: Callable[[str], None] = print,
    on_report: Callable[[dict[str, Any]], None] | None = None,
    checkpoint_url: str | None = None,
) -> dict[str, Any]:
    """Train to `config.run.steps` (or to run.max_seconds, or run.stop_at_return) and return the summary
    (also written to run_dir/summary.json). RunDirBusy if another live trainer holds `run_dir`.
    Checkpoints go to `checkpoint_url` (a job's fixed location, so a retry resumes), else run_dir/checkpoints.

    `on_report` gets each progress report as it is written to progress.json (trainer/runtime/progress.py).

    With `run.eval_every` > 0 the best policy of the periodic evaluations is loaded into the state
    after the final checkpoint (which keeps the last update's state plus the snapshot) and before
    the final evaluation; the summary's `best_eval_step` and `best_eval_return` name it (None if off).
    """
    with hold_run_dir(run_dir), contextlib.ExitStack() as held:
        return _run_training(config, run_dir, resume, show_progress, out, on_report, checkpoint_url, held)


def _run_training(
    config: TrainConfig,
    run_dir: Path,
    resume: bool,
    show_progress: bool,
    out: Callable[[str], None],
    on_report: Callable[[dict[str, Any]], None] | None,
    checkpoint_url: str | None,
    held: contextlib.ExitStack,
) -> dict[str, Any]:
    """run_training's body, with the run folder held; the run's source is closed when `held` closes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, run_dir / "config.json")
    run = build_run(config, run_dir, checkpoint_url)
    held.callback(run.source.close)  # its envs' worker processes end with the run, also in a long-lived process
    if resume and restore_checkpoint(run):
        out(f"resumed from checkpoint at step {run.step}")
    elif resume:
        out(f"--resume: no checkpoint in {run.checkpointer.url}; starting at step 0")
    fill_replay(run)
    start_plan(run)
    termination = Termination()
    termination.install()
    port = resolve_metrics_port(config.run.metrics_port)
    exporter: Exporter | None = serve(run.metrics.registry, port) if port is not None else None
    if exporter is not None:
        out(f"serving metrics on :{exporter.port}/metrics")

    online = config.data.source != "offline"
    bar = tqdm(total=config.run.steps, initial=run.step, disable=not show_progress, unit="step", file=sys.stderr)
    say = tqdm.write if show_progress else out
    losses: dict[str, float] = {}
    started = time.perf_counter() - run.wall_seconds
    epoch_started = time.perf_counter()
    limit = config.run.max_seconds
    timed_out = False
    target = config.run.stop_at_return
    solved = False
    while run.step < config.run.steps and not timed_out and not solved:
        if termination.requested:
            run.wall_seconds = time.perf_counter() - started
            save_checkpoint(run)
            bar.close()
            out(f"terminated at step {run.step}: checkpoint written")
            raise SystemExit(EXIT_TERMINATED)
        advanced = run.plan.steps_per_call
        if online:
            collect(run, run.act_fn(), advanced)
        output = run.plan.run(run.step)
        run.timer.end_step()
        run.step += advanced
        run.metrics.steps_done(advanced)
        bar.update(advanced)
        if crossed(run.step, advanced, STEPS_PER_EPOCH):
            run.metrics.epoch_done(time.perf_counter() - epoch_started)
            epoch_started = time.perf_counter()
        timed_out = limit is not None and time.perf_counter() - started >= limit
        finishing = run.step >= config.run.steps or timed_out
        if config.run.eval_every and (crossed(run.step, advanced, config.run.eval_every) or finishing):
            evaluating_since = evaluation_started(run.device)
            mean_return = evaluate_for_selection(run, say)
            run.eval_seconds += time.perf_counter() - evaluating_since
            solved = target is not None and mean_return >= target
        last = finishing or solved
        if crossed(run.step, advanced, config.run.log_every) or last:
            run.wall_seconds = time.perf_counter() - started
            losses = {name: float(value) for name, value in output.losses.items()}
            progress = report(run, losses, say)
            if on_report is not None:
                on_report(progress)
            bar.set_postfix({name: f"{value:.3g}" for name, value in losses.items() if name in ("c51", "iqn")})
        if crossed(run.step, advanced, config.run.checkpoint_every) and not last:
            run.wall_seconds = time.perf_counter() - started
            save_checkpoint(run)
    bar.close()
    run.wall_seconds = time.perf_counter() - started
    save_checkpoint(run)
    if timed_out:
        out(f"time limit: stopped at step {run.step} of {config.run.steps} (run.max_seconds={limit:g})")
    if solved:
        out(f"return reached: stopped at step {run.step} of {config.run.steps} (run.stop_at_return={target:g})")

    summary = write_summary(run, out, {"stopped_by_time_limit": timed_out, "stopped_at_return": solved})
    pushgateway = config.run.pushgateway_url or os.environ.get("FOXHUNT_PUSHGATEWAY_URL")
    if pushgateway:  # the run's last figures; a Pushgateway that cannot be reached must not fail a finished run
        try:
            push(run.metrics.registry, pushgateway, run.metrics.info_labels["job_id"])
        except OSError as error:  # URLError and connection errors are OSErrors
            print(f"warning: metrics not pushed to {pushgateway}: {error}", file=sys.stderr)
    if exporter is not None:
        exporter.close()
    if summary["eval_returns"]:
        out(f"evaluation: mean return {summary['eval_return_mean']:.2f} over {len(summary['eval_returns'])} episodes")
    if "baseline_means" in summary:
        means = summary["baseline_means"]
        out(
            f"baselines on the same episodes: heuristic {means['heuristic']:.2f}, random {means['random']:.2f}; "
            f"margin over the heuristic {summary['margin_over_heuristic']:+.2f}"
        )
    return summary


def run_check(config: TrainConfig, out_dir: Path, steps: int) -> dict[str, Any]:
    """`steps` updates of `config` as `train` runs them (warm-up, capture, graphs), in `out_dir`.

    Checkpoints only in `out_dir`, never at the job's location: the job's train step must not resume from a check.
    """
    short = config.model_copy(deep=True)
    short.run.steps = steps
    short.run.log_every = steps
    short.run.checkpoint_every = steps
    short.run.eval_every = 0
    short.run.eval_episodes = 0
    started = time.perf_counter()
    summary = run_training(short, out_dir, show_progress=False)
    result = {
        "plan_requested": config.run.plan,
        "plan": summary.get("plan"),
        "device": summary["device"],
        "steps": summary["step"],
        "seconds": time.perf_counter() - started,
        "step_ms": summary.get("step_ms"),
    }
    write_json_atomic(out_dir / "check.json", result, indent=2)
    return result
