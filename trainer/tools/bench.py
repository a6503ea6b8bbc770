"""`python -m trainer bench`: every execution plan on the pinned model, beside eager and torch.compile.

For each preset (`core`: ensemble, vaccine, causal and HER off; `full`: all on; chosen with `--configs`,
and named `config` in bench.json's rows, as before) one replay
of random transitions is filled (so every batch differs: nothing is timed out of cache), then each
method gets a fresh TrainState, the same seeds and the replay's priorities as filled, and runs:
`warmup` steps (untimed: capture, compilation, cuBLAS handles), then `repeats` windows of `steps`
steps, each timed with CUDA events around the window. Reported: median ms/step over the windows and
their spread, the 2000-step epoch seconds, speed-up over eager and peak GPU memory. The cost of
per-step timing (`StepTimer` on vs off) is measured the same way.

Methods: the plans of `trainer.execution.plans`, plus `compile`: `torch.compile(train_step,
mode="reduce-overhead")` (Inductor with its own CUDA graphs) in the eager loop, state buffers marked
static. `eager` is the project's eager plan, which reads the losses back every step as trainers do.
A method may carry a precision suffix, `METHOD-fp32|tf32|bf16`, which runs it with `run.precision`
set so: `compile-bf16` is what a user gets from two flags (TF32 on, bf16 autocast) on top of
torch.compile, and `zerocopy-bf16` the fastest plan in bf16. Without a suffix a method runs at its
own precision (`run.precision=auto`: float32, TF32 for fused and zerocopy). The compiled plans take
one more suffix, `+combo` (`zerocopy-bf16+combo`): `run.combo_kernels`, Inductor's combined Triton kernels
(`trainer.execution.plans.fused.HORIZONTAL_OPTIONS`).

`train` rows (`--train cartpole`): real training as `trainer train` runs it, collection included: a recipe
from `examples/` trains `train_updates` updates from an empty replay with each of `train_plans` (graph plans
with K = `steps_per_replay` updates per replay). The clock starts after the warm-up to learning_starts
and the plan's capture, and stops at the last update: updates/s over that span, with the mean per-update
breakdown (act, env, store, then the update's components) of the run's last `train_updates` updates.

The table, the picture and the files written from the results: `trainer.tools.bench_report`.
"""

from __future__ import annotations

import datetime as dt
import gc
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from contracts.config import STEPS_PER_EPOCH, TrainConfig, build_config, load_config
from contracts.packs import MAX_PACK
from contracts.plans import PLANS
from trainer.algo.model import ModelDims
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.rng import make_generator
from trainer.algo.state import TrainState
from trainer.algo.step import StepOutput
from trainer.execution.data.spec import EnvSpec, Transitions, goal_columns
from trainer.execution.pack import Pack, PackPlan, PackRun
from trainer.execution.plans import PlanClass, make_plan, plan_class, unavailable_reason
from trainer.execution.plans.base import Plan
from trainer.runtime.timing import StepTimer

BRANCHES, ACTIONS = 3, 5
PRESETS: dict[str, list[str]] = {
    "core": ["model.ensemble_heads=0", "loss.vaccine=false", "loss.causal=false", "replay.her=false"],
    "full": ["model.ensemble_heads=2", "loss.vaccine=true", "loss.causal=true", "replay.her=true"],
}
"""Bench presets: name -> the overrides that switch the optional parts (`preset_config` builds the TrainConfig)."""
TIMED_WITH_TIMER_OFF = ("eager", "zerocopy")
"""Base methods whose StepTimer overhead the bench measures in the first preset, each variant (precision,
`+combo`) of them: the slowest plan and the fastest."""
SAMPLER = ["replay.search=cdf"]
"""Every method samples by the cumulative-sum search: the same draws as the sum-tree descent in
a tenth of the time on a GPU (trainer/algo/replay/sampler.py)."""
BASE_METHODS: tuple[str, ...] = tuple(PLANS)
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16")
"""Suffixes a method may carry (`zerocopy-bf16`): the `run.precision` it runs with."""
HORIZONTAL = "combo"
"""The suffix `+combo` (`zerocopy-bf16+combo`): compiled with Inductor's combined kernels."""
HORIZONTAL_METHODS: tuple[str, ...] = ("fused", "zerocopy")
"""The methods Inductor compiles as a plan, which `+combo` applies to."""
METHODS: tuple[str, ...] = ("eager", "compile", "compile-bf16", "graph", "dual", "fused", "zerocopy", "zerocopy-bf16")
"""The default methods: every plan, both torch.compile baselines, and the fastest plan in bf16."""
EPISODE = 200
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAIN_RECIPES: dict[str, Path] = {"cartpole": EXAMPLES / "cartpole.yaml", "market": EXAMPLES / "market-gpu.yaml"}
"""Recipes the `train` rows can run (the market's: its torch environment on the training device)."""
TRAIN_PLANS: tuple[str, ...] = ("eager", "zerocopy")
"""The baseline and the fastest plan of the update-only rows."""
PACK_BASES: tuple[str, ...] = ("eager", "graph", "fused")
"""The plans a pack can run as (`trainer.pack.PackPlan`): vmapped eager kernels, uncaptured or in CUDA graphs, or
("fused") the vmapped update through Inductor in CUDA graphs, TF32 as the fused plan."""
PACK_METHODS: tuple[str, ...] = ("graph",)
"""The default `pack` rows' method."""


@dataclass
class BenchOptions:
    configs: list[str] = field(default_factory=lambda: list(PRESETS))
    """Presets of `PRESETS` to run; named after the CLI flag `--configs` (and bench.json's "options")."""
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    batch_size: int = 1024
    capacity: int = 1_000_000
    obs_dim: int = 64
    steps: int = 100
    repeats: int = 5
    warmup: int = 20
    steps_per_replay: int = 10
    timer_overhead: bool = True
    """Also time eager and zerocopy with StepTimer disabled (in the first preset)."""
    seed: int = 0
    overrides: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    """"preset:method" pairs not to run (e.g. "full:compile" where its compile time does not fit)."""
    train: list[str] = field(default_factory=list)
    """Recipes of `TRAIN_RECIPES` to time in real training (the `train` rows); none by default."""
    train_plans: list[str] = field(default_factory=lambda: list(TRAIN_PLANS))
    train_updates: int = 4000
    train_overrides: list[str] = field(default_factory=list)
    """Overrides for the recipes (the update-only rows' `overrides` do not apply to them)."""
    pack: list[int] = field(default_factory=list)
    """Pack sizes K for the `pack` rows (`--pack 1,4,16,64`): K runs of each preset as one pack; none by default."""
    pack_methods: list[str] = field(default_factory=lambda: list(PACK_METHODS))
    """How each pack runs (`PACK_BASES`, with a precision suffix), each beside the solo method of that name."""


@dataclass
class Result:
    config: str
    """The preset's name (`core`, `full`): the key bench.json's rows have always had, which the metrics
    (label `config`), the A/B tables and the documents under docs/benchmarks read."""
    method: str
    ms_median: float | None = None
    ms_min: float | None = None
    ms_max: float | None = None
    windows_ms: list[float] = field(default_factory=list)
    epoch_s: float | None = None
    speedup: float | None = None
    peak_mem_gib: float | None = None
    setup_s: float | None = None
    losses: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class PackResult:
    """A `pack` row: K runs of `config` as one pack, run as `method`, beside the solo row of that method."""

    config: str
    method: str
    pack: int
    """K: the runs in the pack."""
    ms_median: float | None = None
    """Per pack step (one update of every run): the median over the windows."""
    ms_min: float | None = None
    ms_max: float | None = None
    windows_ms: list[float] = field(default_factory=list)
    updates_per_s: float | None = None
    """Every run's updates together: K × 1000 / ms_median."""
    solo_ms: float | None = None
    """The solo row's ms/step (same method, same bench run)."""
    aggregate_speedup: float | None = None
    """updates_per_s over the solo row's updates/s."""
    peak_mem_gib: float | None = None
    """The pack's peak GPU memory (the bench's own filled replay, which the pack copies, not counted)."""
    peak_mem_per_run_gib: float | None = None
    solo_peak_mem_gib: float | None = None
    setup_s: float | None = None
    error: str | None = None


@dataclass
class TrainResult:
    recipe: str
    plan: str
    updates: int
    steps_per_replay: int
    seconds: float | None = None
    updates_per_s: float | None = None
    ms_per_update: float | None = None
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    setup_s: float | None = None
    train_return_mean: float | None = None
    error: str | None = None


def split_method(method: str) -> tuple[str, str | None]:
    """(base method, precision or None): "zerocopy-bf16" -> ("zerocopy", "bf16"); a `+combo` suffix
    (`is_horizontal`) is allowed on the compiled plans."""
    name, _, variant = method.partition("+")
    base, _, precision = name.partition("-")
    if (
        base not in BASE_METHODS
        or (precision and precision not in PRECISIONS)
        or (variant and (variant != HORIZONTAL or base not in HORIZONTAL_METHODS))
    ):
        raise ValueError(
            f"unknown bench method {method!r} (methods: {', '.join(BASE_METHODS)}, each with an optional "
            f"suffix -{'|-'.join(PRECISIONS)}; {' and '.join(HORIZONTAL_METHODS)} also +{HORIZONTAL})"
        )
    return base, precision or None


def is_horizontal(method: str) -> bool:
    """Whether `method` (e.g. "zerocopy-bf16+combo") compiles with Inductor's combined kernels."""
    split_method(method)  # refuses an unknown method or a `+combo` on a plan that compiles nothing
    return method.partition("+")[2] == HORIZONTAL


def method_config(config: TrainConfig, method: str) -> TrainConfig:
    """The configuration `method` runs: `config` with its suffixes applied (precision; `+combo`:
    `run.combo_kernels`)."""
    _, precision = split_method(method)
    run: dict[str, Any] = {"precision": precision} if precision else {}
    if is_horizontal(method):
        run["combo_kernels"] = True
    if not run:
        return config
    return config.model_copy(update={"run": config.run.model_copy(update=run)})


def preset_config(preset: str, options: BenchOptions) -> TrainConfig:
    """The TrainConfig of bench preset `preset`: the pinned model (TrainConfig defaults, F = obs_dim) and
    the preset's switches."""
    if preset not in PRESETS:
        raise ValueError(f"unknown bench preset {preset!r} (choose from {', '.join(PRESETS)})")
    return build_config(
        {},
        [
            f"data.market_features={options.obs_dim}",
            f"run.batch_size={options.batch_size}",
            f"replay.capacity={options.capacity}",
            f"run.seed={options.seed}",
            f"run.steps_per_replay={options.steps_per_replay}",
            *PRESETS[preset],
            *SAMPLER,
            *options.overrides,
        ],
    )


def bench_spec(config: TrainConfig) -> EnvSpec:
    """Market-shaped data (3 assets × 5 positions), goal-conditioned when HER is on."""
    goal = None
    if config.replay.her:
        from trainer.execution.data.market import market_goal_spec

        goal = market_goal_spec()
    return EnvSpec(obs_dim=config.data.market_features, branches=BRANCHES, actions=ACTIONS, goal=goal)


def fill_with_random_transitions(replay: ReplayBuffer, rows: int, seed: int, chunk: int = 1 << 17) -> None:
    """Write `rows` random transitions in whole episodes of EPISODE steps (random, so batches differ)."""
    spec, device = replay.spec, replay.device
    chunk = max(EPISODE, chunk // EPISODE * EPISODE)  # `extend` starts an episode at each block's start
    generator = torch.Generator(device).manual_seed(seed)
    written = 0
    while written < rows:
        n = min(chunk, rows - written)
        obs = torch.randn(n, spec.obs_dim, device=device, generator=generator)
        next_obs = torch.randn(n, spec.obs_dim, device=device, generator=generator)
        reward = torch.randn(n, device=device, generator=generator)
        action = torch.randint(0, spec.actions, (n, spec.branches), device=device, generator=generator)
        step = (torch.arange(written, written + n) % EPISODE).to(torch.int64)
        achieved = base = None
        if spec.goal is not None:
            achieved, base = goal_columns(spec, obs, next_obs, reward)
        replay.extend(
            Transitions(
                obs=obs,
                action=action,
                reward=reward,
                next_obs=next_obs,
                done=torch.zeros(n, device=device),
                last=step == EPISODE - 1,
                episode_step=step,
                achieved_goal=achieved,
                base_reward=base,
            )
        )
        written += n


def check_options(options: BenchOptions) -> None:
    """One-line errors for unknown presets or methods and sizes that cannot run."""
    unknown = [p for p in options.configs if p not in PRESETS] + [m for m in options.methods if not _known(m)]
    if unknown:
        raise ValueError(
            f"unknown bench names {', '.join(unknown)} (presets, --configs: {', '.join(PRESETS)}; methods: "
            f"{', '.join(BASE_METHODS)}, each with an optional suffix -{'|-'.join(PRECISIONS)})"
        )
    if min(options.steps, options.repeats, options.batch_size, options.capacity) < 1 or options.warmup < 0:
        raise ValueError("bench sizes must be positive (steps, repeats, batch size, capacity) and warmup >= 0")
    if options.steps % options.steps_per_replay:
        raise ValueError(f"steps ({options.steps}) must be a multiple of steps_per_replay ({options.steps_per_replay})")
    unknown_train = [r for r in options.train if r not in TRAIN_RECIPES] + [
        p for p in options.train_plans if p not in PLANS
    ]
    if unknown_train:
        raise ValueError(
            f"unknown train names {', '.join(unknown_train)} (recipes: {', '.join(TRAIN_RECIPES)}; "
            f"plans: {', '.join(PLANS)})"
        )
    if options.pack:
        if not all(1 <= k <= MAX_PACK for k in options.pack):
            raise ValueError(f"pack sizes must be 1 to {MAX_PACK}, got {options.pack}")
        for method in options.pack_methods:
            pack_base(method)
    if options.train and options.train_updates % options.steps_per_replay:
        raise ValueError(
            f"train updates ({options.train_updates}) must be a multiple of "
            f"steps_per_replay ({options.steps_per_replay})"
        )


def _known(method: str) -> bool:
    try:
        split_method(method)
    except ValueError:
        return False
    return True


def method_plan(method: str, config: TrainConfig) -> tuple[PlanClass, TrainConfig]:
    """Method `method`'s plan class and the config it runs (its precision suffix applied, see `split_method`)."""
    base, _ = split_method(method)
    return plan_class(base), method_config(config, method)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def _window(device: torch.device, out: list[float]) -> Iterator[None]:
    """Milliseconds of the enclosed steps: CUDA events on the GPU, the host clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    else:
        began = time.perf_counter()
        yield
        out.append(1e3 * (time.perf_counter() - began))


def run_steps(plan: Plan, timer: StepTimer, start: int, steps: int) -> tuple[int, StepOutput | None]:
    """`steps` steps from global step `start` (rounded to whole calls); returns the next step."""
    output = None
    step = start
    while step < start + steps:
        output = plan.run(step)
        timer.end_step()
        step += plan.steps_per_call
    timer.drain()
    return step, output


def time_method(
    preset: str,
    method: str,
    config: TrainConfig,
    replay: ReplayBuffer,
    priorities: dict[str, torch.Tensor],
    options: BenchOptions,
    timer_enabled: bool = True,
) -> Result:
    """Fresh state and seeds, warm-up, then `repeats` timed windows of `steps` steps."""
    result = Result(config=preset, method=method)
    device = replay.device
    for key, tensor in replay.sampler.state_dict().items():
        tensor.copy_(priorities[key])
    replay.generator.manual_seed(options.seed + 1)
    generator = make_generator(options.seed + 2, "step", device, config.run.rng)
    dims = ModelDims.build(config.model, replay.spec.obs_dim, replay.spec.branches, replay.spec.actions)
    timer = StepTimer(device, enabled=timer_enabled)
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    plan: Plan | None = None
    try:
        state = TrainState.create(config, dims, device)
        plan_type, plan_config = method_plan(method, config)
        plan = plan_type(state, replay, plan_config, timer, generator)
        step, _ = run_steps(plan, timer, 0, options.warmup)
        _sync(device)
        result.setup_s = time.perf_counter() - began
        windows: list[float] = []
        output = None
        for _ in range(options.repeats):
            with _window(device, windows):
                step, output = run_steps(plan, timer, step, options.steps)
        per_step = options.steps // plan.steps_per_call * plan.steps_per_call
        result.windows_ms = [ms / per_step for ms in windows]
        result.ms_median = statistics.median(result.windows_ms)
        result.ms_min, result.ms_max = min(result.windows_ms), max(result.windows_ms)
        result.epoch_s = result.ms_median * STEPS_PER_EPOCH / 1e3
        if output is not None:
            result.losses = {key: float(value) for key, value in output.losses.items()}
        if device.type == "cuda":
            result.peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2**30
    except Exception as error:  # a method that cannot run is reported, not hidden
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
    finally:
        del plan
    return result


def random_run(i: int, config: TrainConfig, transitions: int) -> PackRun:
    """Run i of a pack over `transitions` random transitions (`bench_spec`'s shapes), its replay and draws seeded
    by i: what the packs' GPU tests and `scripts/profile_pack.py` train."""
    device = torch.device(config.run.device)
    spec = bench_spec(config)
    dims = ModelDims.build(config.model, spec.obs_dim, spec.branches, spec.actions)
    replay = ReplayBuffer(config, spec, device, make_generator(10 + i, "step", device, config.run.rng))
    fill_with_random_transitions(replay, transitions, seed=i)
    draws = make_generator(20 + i, "step", device, config.run.rng)
    return PackRun(TrainState.create(config, dims, device), replay, draws)


def relative_error(got: object, want: object) -> float:
    """‖got − want‖ / ‖want‖ over every tensor of two like structures (a tensor, or gradients as torch.func returns
    them), in float64: what the benchmarks' and the packs' checks report."""
    flat_got, flat_want = (torch.cat([t.double().flatten() for t in pytree.tree_leaves(x)]) for x in (got, want))
    return ((flat_got - flat_want).norm() / flat_want.norm()).item()


def solo_runs_beside_pack(
    configs: list[TrainConfig], make: Callable[[int, TrainConfig], PackRun], plan: str = "graph"
) -> tuple[list[tuple[PackRun, Plan]], PackPlan]:
    """Each run built twice by `make`: alone under solo plan `plan`, and in one pack under its pack plan
    (`PackPlan.for_plan`): what the packs' equivalence checks step side by side."""
    return solo_runs(configs, make, plan), PackPlan.for_plan(Pack(configs, make), plan)


def solo_runs(
    configs: list[TrainConfig], make: Callable[[int, TrainConfig], PackRun], plan: str
) -> list[tuple[PackRun, Plan]]:
    """Each run built by `make`, alone under solo plan `plan` (untimed)."""
    solos = []
    for i, config in enumerate(configs):
        run = make(i, config)
        timer = StepTimer(run.state.atoms.device, enabled=False)
        solos.append((run, make_plan(plan, run.state, run.replay, config, timer, run.generator)))
    return solos


def pack_base(method: str) -> str:
    """The plan a pack method runs as ("graph-bf16" -> "graph", "fused-bf16+combo" -> "fused": `+combo` is
    `run.combo_kernels`, `pack.PACK_COMBO_OPTIONS`); `ValueError` for one a pack cannot run."""
    base, _ = split_method(method)
    if base not in PACK_BASES:
        raise ValueError(f"a pack runs as {' or '.join(PACK_BASES)} (with a precision suffix), not {method!r}")
    return base


def time_pack(
    preset: str,
    method: str,
    size: int,
    config: TrainConfig,
    replay: ReplayBuffer,
    priorities: dict[str, torch.Tensor],
    options: BenchOptions,
) -> PackResult:
    """K = `size` runs as one pack (`trainer.pack`): run i is the solo method's run with seed `options.seed` + i,
    its own copy of the filled replay and its own generators (run 0's are the solo row's); warm-up, then
    `repeats` windows of `steps` pack steps, as `time_method` times a solo run."""
    result = PackResult(config=preset, method=method, pack=size)
    device = replay.device
    config = method_config(config, method)
    dims = ModelDims.build(config.model, replay.spec.obs_dim, replay.spec.branches, replay.spec.actions)
    own_replay_gib = sum(t.numel() * t.element_size() for t in replay.state_dict().values()) / 2**30
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    pack = plan = None
    try:
        configs = [
            config.model_copy(update={"run": config.run.model_copy(update={"seed": options.seed + i})})
            for i in range(size)
        ]

        def make(i: int, run_config: TrainConfig) -> PackRun:
            seed = options.seed + 1000 * i
            run_replay = ReplayBuffer(
                run_config, replay.spec, device, make_generator(seed + 1, "step", device, run_config.run.rng)
            )
            run_replay.load_state_dict(replay.state_dict())
            for key, tensor in run_replay.sampler.state_dict().items():
                tensor.copy_(priorities[key])
            generator = make_generator(seed + 2, "step", device, run_config.run.rng)
            return PackRun(TrainState.create(run_config, dims, device), run_replay, generator)

        pack = Pack(configs, make)
        plan = PackPlan.for_plan(pack, pack_base(method))
        step = 0
        while step < options.warmup:
            plan.run(step)
            step += plan.steps_per_call
        _sync(device)
        result.setup_s = time.perf_counter() - began
        windows: list[float] = []
        for _ in range(options.repeats):
            with _window(device, windows):
                end = step + options.steps
                while step < end:
                    plan.run(step)
                    step += plan.steps_per_call
        per_step = options.steps // plan.steps_per_call * plan.steps_per_call
        result.windows_ms = [ms / per_step for ms in windows]
        result.ms_median = statistics.median(result.windows_ms)
        result.ms_min, result.ms_max = min(result.windows_ms), max(result.windows_ms)
        result.updates_per_s = size * 1e3 / result.ms_median
        if device.type == "cuda":
            result.peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2**30 - own_replay_gib
            result.peak_mem_per_run_gib = result.peak_mem_gib / size
    except Exception as error:  # a pack that cannot run is reported, not hidden
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
    finally:
        del plan, pack
    return result


def run_pack_rows(
    preset: str,
    config: TrainConfig,
    replay: ReplayBuffer,
    priorities: dict[str, torch.Tensor],
    results: list[Result],
    options: BenchOptions,
    log: Callable[[str], None],
) -> list[PackResult]:
    """The `pack` rows of one preset: each pack method at each K, beside the solo row of that method (timed
    here if `options.methods` did not include it)."""
    rows = []
    for method in options.pack_methods:
        solo = next((r for r in results if r.config == preset and r.method == method), None)
        if solo is None:
            solo = time_method(preset, method, config, replay, priorities, options)
            results.append(solo)
            log(f"[{preset}] {method} (solo, for the packs): {solo.error or f'{solo.ms_median:.3f} ms/step'}")
        for size in options.pack:
            row = time_pack(preset, method, size, config, replay, priorities, options)
            if solo.ms_median and row.updates_per_s:
                row.solo_ms, row.solo_peak_mem_gib = solo.ms_median, solo.peak_mem_gib
                row.aggregate_speedup = row.updates_per_s / (1e3 / solo.ms_median)
            rows.append(row)
            timing = (
                f"{row.ms_median:.3f} ms per pack step, {row.updates_per_s:.0f} updates/s, "
                f"{row.aggregate_speedup or float('nan'):.2f}x solo (setup {row.setup_s:.1f}s)"
                if row.ms_median
                else ""
            )
            log(f"[{preset}] pack {method} K={size}: {row.error or timing}")
    return rows


def train_config(recipe: str, plan: str, options: BenchOptions, device: torch.device) -> TrainConfig:
    """The recipe as `trainer train` runs it, for `train_updates` updates, with no evaluation or report in between."""
    k = 1 if plan == "eager" else options.steps_per_replay
    return load_config(
        TRAIN_RECIPES[recipe],
        [
            f"run.plan={plan}",
            f"run.device={device.type}",
            f"run.steps={options.train_updates}",
            f"run.steps_per_replay={k}",
            f"run.log_every={options.train_updates}",
            f"run.checkpoint_every={options.train_updates}",
            "run.eval_every=0",
            "run.stop_at_return=null",
            "run.eval_episodes=0",
            *options.train_overrides,
        ],
    )


def time_training(recipe: str, plan: str, options: BenchOptions, device: torch.device) -> TrainResult:
    """One real training run (see the module docstring); a run that fails is reported, not hidden."""
    from trainer.runtime.train import run_training

    result = TrainResult(recipe=recipe, plan=plan, updates=options.train_updates, steps_per_replay=1)
    began = time.perf_counter()
    try:
        config = train_config(recipe, plan, options, device)
        with tempfile.TemporaryDirectory(prefix="foxhunt-bench-train-") as run_dir:  # checkpoints in it, never a job's
            summary = run_training(config, Path(run_dir), show_progress=False, out=lambda line: None)
        result.plan = summary["plan"]
        result.steps_per_replay = config.run.steps_per_replay if result.plan != "eager" else 1
        result.seconds = summary["wall_seconds"]
        result.setup_s = time.perf_counter() - began - summary["wall_seconds"]
        result.updates_per_s = summary["step"] / summary["wall_seconds"]
        result.ms_per_update = 1e3 / result.updates_per_s
        result.breakdown_ms = dict(summary["breakdown_ms"])
        result.train_return_mean = summary.get("train_return_mean")
    except Exception as error:  # a plan that cannot train is reported, not hidden
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
    return result


def run_train_rows(options: BenchOptions, device: torch.device, log: Callable[[str], None]) -> list[TrainResult]:
    """The `train` rows: each recipe of `options.train` with each of `options.train_plans`."""
    results = []
    for recipe in options.train:
        for plan in options.train_plans:
            reason = unavailable_reason(plan, device)
            if reason is not None:  # never time eager under a GPU plan's name
                results.append(TrainResult(recipe, plan, options.train_updates, 1, error=f"not run: {reason}"))
                log(f"[train {recipe}] {plan}: not run: {reason}")
                continue
            result = time_training(recipe, plan, options, device)
            results.append(result)
            timing = (
                f"{result.updates_per_s:.1f} updates/s (setup {result.setup_s:.1f}s)" if result.updates_per_s else ""
            )
            log(f"[train {recipe}] {plan} K={result.steps_per_replay}: {result.error or timing}")
    return results


def environment(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device": str(device),
        "host": platform.node(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    return info


def run_bench(options: BenchOptions, device: torch.device, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every method in every preset; returns the JSON document (environment, options, results)."""
    results: list[Result] = []
    packs: list[PackResult] = []
    overhead: list[dict[str, Any]] = []
    # Each method and variant is its own compiled entry; Dynamo's default limit would fall back to eager.
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.accumulated_cache_size_limit = 1024
    for preset in options.configs:
        config = preset_config(preset, options)
        spec = bench_spec(config)
        replay = ReplayBuffer(config, spec, device, make_generator(options.seed + 1, "step", device, config.run.rng))
        began = time.perf_counter()
        fill_with_random_transitions(replay, options.capacity, options.seed)
        log(f"[{preset}] replay of {len(replay)} random transitions filled in {time.perf_counter() - began:.1f}s")
        priorities = {key: tensor.clone() for key, tensor in replay.sampler.state_dict().items()}
        eager_ms: float | None = None
        for method in options.methods:
            if f"{preset}:{method}" in options.skip:
                results.append(Result(config=preset, method=method, error="skipped (--skip)"))
                continue
            base, _ = split_method(method)
            reason = unavailable_reason(base, device) if base in PLANS else None
            if reason is not None:  # never time eager under a GPU plan's name
                results.append(Result(config=preset, method=method, error=f"not run: {reason}"))
                log(f"[{preset}] {method}: not run: {reason}")
                continue
            result = time_method(preset, method, config, replay, priorities, options)
            if method == "eager":
                eager_ms = result.ms_median
            if eager_ms and result.ms_median:
                result.speedup = eager_ms / result.ms_median
            results.append(result)
            timing = f"{result.ms_median:.3f} ms/step (setup {result.setup_s:.1f}s)" if result.ms_median else ""
            log(f"[{preset}] {method}: {result.error or timing}")
        if options.timer_overhead and preset == options.configs[0]:
            for method in [m for m in options.methods if split_method(m)[0] in TIMED_WITH_TIMER_OFF]:
                on = next(r for r in results if r.config == preset and r.method == method)
                off = time_method(preset, method, config, replay, priorities, options, timer_enabled=False)
                if on.ms_median and off.ms_median:
                    overhead.append(
                        {
                            "config": preset,
                            "method": method,
                            "ms_timer_on": on.ms_median,
                            "ms_timer_off": off.ms_median,
                            "overhead_pct": 100 * (on.ms_median - off.ms_median) / off.ms_median,
                        }
                    )
        if options.pack:
            packs += run_pack_rows(preset, config, replay, priorities, results, options, log)
        del replay
    train = run_train_rows(options, device, log)
    return {
        "environment": environment(device),
        "options": asdict(options),
        "results": [asdict(result) for result in results],
        "timer_overhead": overhead,
        "train": [asdict(result) for result in train],
        "pack": [asdict(row) for row in packs],
    }
