"""`python -m trainer …` (`foxhunt-trainer`): train, resolve, check, report, finish, bench, sweep, hyperopt.

The job pipeline (contracts/pipeline.py) runs these commands; its arguments are built from the options here.

Bad input (config, dataset, missing file) prints one line `error: …` and exits 2.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
import yaml

from contracts.config import (
    MODELS,
    STEPS_PER_EPOCH,
    ConfigError,
    TrainConfig,
    apply_epochs,
    check_job_settings,
    check_model,
    dump_config,
    load_config,
)
from contracts.pipeline import CHECKPOINT_ENV
from contracts.plans import plan_names

app = typer.Typer(add_completion=False, no_args_is_help=True, help="foxhunt's distributional DQN trainer.")

EXIT_BAD_INPUT = 2


@app.callback()
def _commands() -> None:
    """Keeps `train` a subcommand even while it is the only one."""


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


ConfigOption = Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON TrainConfig.")]
OverrideOption = Annotated[
    list[str] | None, typer.Option("--override", "-o", help="Dotted override, e.g. -o optim.lr=3e-4 (repeatable).")
]
# Read here, once, and passed down: a job's pipeline sets it per step (contracts.pipeline.CHECKPOINT_ENV).
CheckpointOption = Annotated[
    str | None,
    typer.Option(
        envvar=CHECKPOINT_ENV,
        show_envvar=True,
        help="Checkpoint location (any fsspec URL), fixed per job so a retry resumes; default RUN_DIR/checkpoints.",
    ),
]


def warn_default_config_on_cpu(cfg: TrainConfig) -> None:
    """Say so when `train` without --config is about to run the default, GPU-sized market run on the CPU."""
    import torch

    on_cpu = cfg.run.device == "cpu" or not torch.cuda.is_available()
    if on_cpu and cfg.data.source == "market":
        typer.echo(
            f"warning: no --config: the default TrainConfig is a GPU-sized run ({cfg.run.steps} steps of batch "
            f"{cfg.run.batch_size} on the synthetic market), which takes hours on a CPU; for a short CPU run use "
            "--config examples/quickstart.yaml",
            err=True,
        )


@app.command()
def train(
    config: ConfigOption = None,
    override: OverrideOption = None,
    run_dir: Annotated[Path | None, typer.Option(help="Output folder (default runs/<time>).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the last complete checkpoint.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    checkpoint_url: CheckpointOption = None,
) -> None:
    """Train one agent and write config.json, progress.json, summary.json and checkpoints to the run dir."""
    from trainer.execution.data.offline import DatasetError
    from trainer.runtime.checkpoint import CheckpointError
    from trainer.runtime.progress import ProgressReporter
    from trainer.runtime.train import RunDirBusy, default_run_dir, run_training

    reporter = ProgressReporter.from_env()  # in a pod: reports also go to the controller
    try:
        cfg = load_config(config, override or [])
        if config is None:
            warn_default_config_on_cpu(cfg)
        on_report = reporter.update if reporter is not None else None
        run_training(
            cfg,
            run_dir or default_run_dir(),
            resume=resume,
            show_progress=progress,
            on_report=on_report,
            checkpoint_url=checkpoint_url,
        )
    except (ConfigError, DatasetError, CheckpointError, RunDirBusy) as error:
        raise fail(str(error)) from None
    except FileNotFoundError as error:
        raise fail(f"file not found: {error.filename or error}") from None
    finally:
        if reporter is not None:
            reporter.close()


def _pack_sizes(text: str) -> list[int]:
    """`--pack 1,4,16`: the sizes, or a one-line error."""
    try:
        return [int(k) for k in text.split(",") if k]
    except ValueError:
        raise fail(f"--pack takes comma-separated whole numbers, got {text!r}") from None


@app.command()
def bench(
    configs: Annotated[str, typer.Option(help="Comma-separated bench presets: core, full.")] = "core,full",
    methods: Annotated[
        str,
        typer.Option(
            help=f"Comma-separated plans: {plan_names()}, each with an optional precision "
            "suffix -fp32, -tf32 or -bf16 (compile-bf16: TF32 and bf16 autocast under torch.compile)."
        ),
    ] = "eager,compile,compile-bf16,graph,dual,fused,zerocopy,zerocopy-bf16",
    batch_size: Annotated[int, typer.Option(help="Transitions per step (B).")] = 1024,
    capacity: Annotated[int, typer.Option(help="Replay capacity, filled with random transitions.")] = 1_000_000,
    obs_dim: Annotated[int, typer.Option(help="Observation features F.")] = 64,
    steps: Annotated[int, typer.Option(help="Steps per timed window.")] = 100,
    repeats: Annotated[int, typer.Option(help="Timed windows per method (the median is reported).")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed steps first (capture, compilation).")] = 20,
    steps_per_replay: Annotated[int, typer.Option(help="K steps per graph replay (zerocopy).")] = 10,
    timer_overhead: Annotated[
        bool, typer.Option(help="Also time eager and zerocopy with StepTimer off (first preset).")
    ] = True,
    device: Annotated[str, typer.Option(help="cuda, cpu or auto.")] = "auto",
    out: Annotated[Path, typer.Option(help="Folder for bench.json, bench.png, bench.md.")] = Path("bench-out"),
    skip: Annotated[list[str] | None, typer.Option(help="preset:method not to run, e.g. full:compile.")] = None,
    override: OverrideOption = None,
    train: Annotated[
        str, typer.Option(help="Recipes for `train` rows (real training, collection included): cartpole, market.")
    ] = "",
    train_plans: Annotated[
        str, typer.Option(help=f"Comma-separated plans for the train rows: {plan_names()}.")
    ] = "eager,zerocopy",
    train_updates: Annotated[int, typer.Option(help="Updates per train row.")] = 4000,
    train_override: Annotated[
        list[str] | None,
        typer.Option(help="Dotted override for the train rows' recipes, e.g. run.collect_graph=true (repeatable)."),
    ] = None,
    isolate: Annotated[
        bool, typer.Option(help="Run each preset's each method in a fresh process (no train rows).")
    ] = False,
    ab: Annotated[
        str,
        typer.Option(
            help="A,B: bench two sources (git revisions, or folders holding trainer/; '.' is this tree) "
            "alternating A B A B, each method in a fresh process."
        ),
    ] = "",
    rounds: Annotated[int, typer.Option(min=1, help="A/B rounds (each runs A then B).")] = 2,
    pack: Annotated[
        str, typer.Option(help="Pack sizes K for `pack` rows, e.g. 1,4,16,64: K runs of each preset as one pack.")
    ] = "",
    pack_methods: Annotated[
        str,
        typer.Option(help="Comma-separated: how the packs run, eager, graph or fused with a precision suffix."),
    ] = "graph",
) -> None:
    """Time every plan beside eager and torch.compile on the pinned model; print the table, write JSON/PNG/MD."""
    import shlex

    import torch

    from trainer.tools.bench import BenchOptions, check_options, run_bench
    from trainer.tools.bench_report import format_table, write_outputs

    options = BenchOptions(
        configs=[c for c in configs.split(",") if c],
        methods=[m for m in methods.split(",") if m],
        batch_size=batch_size,
        capacity=capacity,
        obs_dim=obs_dim,
        steps=steps,
        repeats=repeats,
        warmup=warmup,
        steps_per_replay=steps_per_replay,
        timer_overhead=timer_overhead,
        overrides=override or [],
        skip=skip or [],
        train=[r for r in train.split(",") if r],
        train_plans=[p for p in train_plans.split(",") if p],
        train_updates=train_updates,
        train_overrides=train_override or [],
        pack=_pack_sizes(pack),
        pack_methods=[m for m in pack_methods.split(",") if m],
    )
    if device not in ("auto", "cpu", "cuda"):
        raise fail(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise fail("--device cuda but no CUDA GPU is available")
    target = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else device.replace("auto", "cpu"))
    try:
        check_options(options)
        for preset in options.configs:
            from trainer.tools.bench import preset_config

            preset_config(preset, options)
    except (ValueError, ConfigError) as error:
        raise fail(str(error)) from None
    sources = [s for s in ab.split(",") if s]
    if ab and len(sources) != 2:
        raise fail(f"--ab takes two sources, A,B; got {ab!r}")
    if (isolate or sources) and options.train:
        raise fail("--train rows run in the bench's own process: not with --isolate or --ab")
    if (isolate or sources) and options.pack:
        raise fail("--pack rows run in the bench's own process: not with --isolate or --ab")
    log = lambda line: typer.echo(line, err=True)  # noqa: E731
    if isolate or sources:
        from trainer.tools.bench_isolated import run_isolated

        try:
            document = run_isolated(options, target.type, log, sources or None, rounds if sources else 1)
        except ValueError as error:
            raise fail(str(error)) from None
    else:
        document = run_bench(options, target, log=log)
    write_outputs(document, out, "python -m trainer bench " + shlex.join(sys.argv[2:]))
    typer.echo(format_table(document))
    pushgateway = os.environ.get("FOXHUNT_PUSHGATEWAY_URL")
    if pushgateway:
        from trainer.runtime.metrics import push_bench

        push_bench(document, pushgateway, os.environ.get("FOXHUNT_JOB_ID") or "bench")


@app.command()
def resolve(
    out: Annotated[Path, typer.Option(help="Where to write the job's config, epochs applied: what later steps run.")],
    config: ConfigOption = None,
    override: OverrideOption = None,
    model: Annotated[str, typer.Option(help=f"The job's model: one of {', '.join(MODELS)}.")] = "dqn",
    train_epochs: Annotated[
        int,
        typer.Option(
            min=0,
            help=f"The job's length in epochs of {STEPS_PER_EPOCH} steps, written into run.steps of --out "
            "(refused if the config sets run.steps too); 0: the config's run.steps.",
        ),
    ] = 0,
    pool: Annotated[str | None, typer.Option(help="The job's GPU pool, checked against --pools-file.")] = None,
    pools_file: Annotated[
        Path | None, typer.Option(help="The controller's pools file (YAML, `pools: [{name: …}]`): --pool must be one.")
    ] = None,
) -> None:
    """The job's first step, on a CPU in a second: checks what the job asks (model, pool, epochs or run.steps,
    no field only the operator sets) and writes its resolved config, so a job that asks wrongly fails at once,
    before it waits for a GPU."""
    try:
        check_model(model)
        if pools_file is not None:
            check_pool(pool, pools_file)
        cfg = apply_epochs(load_config(config, override or []), train_epochs or None)
        check_job_settings(cfg)  # a job's config, unlike one run by hand: no run.pushgateway_url
    except ConfigError as error:
        raise fail(str(error)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out)
    typer.echo(f"resolved config: {out} (model {model}, {cfg.run.steps} steps, plan {cfg.run.plan})")


@app.command()
def check(
    config: ConfigOption = None,
    override: OverrideOption = None,
    out: Annotated[Path, typer.Option(help="Folder of the short run and check.json.")] = Path("runs/check"),
    steps: Annotated[int, typer.Option(min=1, help="Updates to run after the warm-up.")] = 20,
) -> None:
    """A few updates of the config's own plan on this machine (warm-up, capture, graphs); fails if the plan
    falls back, so a job whose plan cannot run here stops in minutes instead of hours into train."""
    import warnings

    from trainer.execution.data.offline import DatasetError
    from trainer.execution.plans import PlanFallbackWarning
    from trainer.runtime.train import run_check

    try:
        cfg = load_config(config, override or [])
        with warnings.catch_warnings(record=True, category=PlanFallbackWarning) as fallbacks:
            result = run_check(cfg, out, steps)
    except (ConfigError, DatasetError) as error:
        raise fail(str(error)) from None
    typer.echo(json.dumps(result))
    if cfg.run.device == "cuda" and not str(result["device"]).startswith("cuda"):
        typer.echo("error: run.device=cuda but this machine has no usable CUDA GPU", err=True)
        raise typer.Exit(1)
    if fallbacks:  # whatever run.device says: with `auto` on a machine without a usable GPU too
        typer.echo(f"error: plan {cfg.run.plan} cannot run here: {fallbacks[0].message}", err=True)
        raise typer.Exit(1)


def check_pool(pool: str | None, pools_file: Path) -> None:
    """`pool` must be named in the controller's pools file (service/pools.py reads the rest of it)."""
    if not pools_file.is_file():
        raise ConfigError(f"pools file not found: {pools_file}")
    try:
        document = yaml.safe_load(pools_file.read_text())
        names = [str(entry["name"]) for entry in document["pools"]]
    except (yaml.YAMLError, TypeError, KeyError) as error:
        raise ConfigError(f"pools file {pools_file} lists no pools (`pools: [{{name: …}}]`): {error}") from None
    if pool not in names:
        raise ConfigError(f"unknown pool {pool!r}; configured: {', '.join(names)}")


@app.command()
def report(
    run_dir: Annotated[Path, typer.Option(help="A finished run's folder (summary.json).")],
) -> None:
    """Print a finished run's step breakdown, then its summary as one JSON line (the pipeline's result)."""
    from trainer.runtime.timing import format_breakdown

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except FileNotFoundError:
        raise fail(f"{run_dir / 'summary.json'} not found: the run has not finished") from None
    if summary.get("breakdown_ms"):
        typer.echo(format_breakdown(summary.get("plan", "?"), summary["breakdown_ms"]))
    typer.echo(json.dumps(summary, separators=(",", ":")))


@app.command()
def finish(
    run: Annotated[Path, typer.Option(help="The job's output root; status.json is written there.")],
    status: Annotated[str, typer.Option(help="The pipeline's outcome: Succeeded, Failed or Error.")],
    duration: Annotated[str, typer.Option(help="Seconds the pipeline ran.")] = "0",
    failures: Annotated[str, typer.Option(help="The failed steps, as JSON (Argo's workflow.failures).")] = "null",
) -> None:
    """The exit handler: records the outcome beside the run, so it outlives the job's pods and objects."""
    from contracts.jsonfile import write_json_atomic

    try:
        failed: object = json.loads(failures or "null")
    except json.JSONDecodeError:
        failed = failures
    try:
        seconds = float(duration or 0)
    except ValueError:
        raise fail(f"--duration must be a number of seconds, got {duration!r}") from None
    record = {"status": status, "duration_seconds": seconds, "failures": failed}
    run.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run / "status.json", record)
    typer.echo(json.dumps(record))


@app.command()
def sweep(
    seeds: Annotated[str, typer.Option(help="Seeds to train, e.g. 4,5,6,7,8 or 4-8.")],
    out: Annotated[Path, typer.Option(help="Folder: seed-<n>/ per run, sweep.json and sweep.md.")],
    config: ConfigOption = None,
    override: OverrideOption = None,
    jobs: Annotated[int, typer.Option(min=1, help="Trainings at a time (one process each).")] = 1,
    threshold: Annotated[
        float | None, typer.Option(help="Every seed's final greedy mean return must reach this, e.g. 475.")
    ] = None,
    poll: Annotated[float, typer.Option(min=0.1, help="Seconds between progress lines.")] = 10.0,
    pack: Annotated[
        int, typer.Option(min=1, max=64, help="Seeds per process, trained as one pack (trainer train-pack).")
    ] = 1,
) -> None:
    """Train the config once per seed in parallel processes (run.cpu_threads=1 unless overridden) and write
    a table of each seed's final greedy return, best-policy step, training return, wall time and command.

    Exit code: 0 when every seed finished (and reached --threshold if given), 1 when a seed's process
    failed, 3 when every seed finished but one is below the threshold, 2 on bad input."""
    from trainer.tools.sweep import (
        SweepOptions,
        exit_code,
        format_markdown,
        install_stop_signals,
        parse_seeds,
        run_sweep,
    )

    try:
        if config is None:
            raise ConfigError("--config is required: the recipe to train on every seed")
        options = SweepOptions(
            config=config, seeds=parse_seeds(seeds), out=out, jobs=jobs, overrides=override or [],
            threshold=threshold, poll_seconds=poll, pack=pack,
        )  # fmt: skip
        document = run_sweep(options, lambda line: typer.echo(line, err=True), install_stop_signals())
    except ConfigError as error:
        raise fail(str(error)) from None
    typer.echo(format_markdown(document), nl=False)
    code = exit_code(document)
    if code:
        typer.echo(f"error: {document['verdict']['text']}", err=True)
        raise typer.Exit(code)


@app.command("train-pack")
def train_pack(
    seeds: Annotated[str, typer.Option(help="Seeds to train as one pack, e.g. 4,5,6,7 or 4-7 (at most 64).")],
    out: Annotated[Path, typer.Option(help="Folder: seed-<n>/ per run, as `trainer sweep` lays it out.")],
    config: ConfigOption = None,
    override: OverrideOption = None,
    resume: Annotated[bool, typer.Option(help="Continue every seed from the pack's last common checkpoint.")] = False,
) -> None:
    """Train the config once per seed as ONE pack (issue 31): one process, each update one batched step of every
    seed. Each seed-<n>/ holds what `trainer train` writes; a seed whose guard skips is frozen and reported.
    SIGTERM writes every seed's checkpoint and exits 143; `--resume` goes on from there. Gymnasium envs with a slow
    step (Box2D's): `-o data.vector_env=process` steps each seed's envs in a worker process of its own."""
    from contracts.packs import PackError
    from trainer.runtime.pack_train import run_pack_training
    from trainer.runtime.progress import ProgressReporter
    from trainer.runtime.train import RunDirBusy
    from trainer.tools.sweep import SEED_DIR, parse_seeds

    reporter = ProgressReporter.from_env()  # in a pod: the pack's reports, each run's progress, to the controller
    try:
        if config is None:
            raise ConfigError("--config is required: the recipe to train on every seed")
        chosen = parse_seeds(seeds)
        configs = [load_config(config, [*(override or []), f"run.seed={seed}"]) for seed in chosen]
        dirs = [out / SEED_DIR.format(seed=seed) for seed in chosen]
        on_report = reporter.update if reporter is not None else None
        run_pack_training(
            configs, dirs, out=lambda line: typer.echo(line, err=True), on_report=on_report, resume=resume
        )
    except (ConfigError, PackError, RunDirBusy) as error:
        raise fail(str(error)) from None
    finally:
        if reporter is not None:
            reporter.close()


hyperopt_app = typer.Typer(no_args_is_help=True, help="Optuna hyper-parameter search (docs/hyperopt.md).")
app.add_typer(hyperopt_app, name="hyperopt")

StorageOption = Annotated[str, typer.Option(help="Optuna storage URL, e.g. sqlite:///runs/optuna.db or postgresql://…")]
StudyOption = Annotated[str, typer.Option(help="Study name (one per job).")]
SpaceOption = Annotated[
    Path | None,
    typer.Option(
        help="YAML search space: dotted.name -> {type, low, high, log, step, choices}; default: the config's "
        "search.space, else the default space."
    ),
]


def _hyperopt_call(body: Callable[[], None]) -> None:
    """Bad input exits 2; a crashed trial (recorded FAIL) or a study with no completed trial exits 1."""
    from trainer.tools.hyperopt import HyperoptError, TrialFailed

    try:
        body()
    except (ConfigError, HyperoptError) as error:
        raise fail(str(error)) from None
    except TrialFailed as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None


@hyperopt_app.command("run")
def hyperopt_run(
    config: ConfigOption = None,
    trials: Annotated[int, typer.Option(min=1, help="Trials the study should hold in total.")] = 20,
    storage: Annotated[str | None, typer.Option(help="Storage URL (default sqlite:///RUN_DIR/optuna.db).")] = None,
    study: Annotated[str, typer.Option(help="Study name.")] = "foxhunt",
    run_dir: Annotated[Path, typer.Option(help="Trials in trial-<n>/, the full run in final/, best.json.")] = Path(
        "runs/hyperopt"
    ),
    space: SpaceOption = None,
    trial_steps: Annotated[
        int | None, typer.Option(min=1, help="Shorter run.steps for trials; the final run keeps the config's.")
    ] = None,
    checkpoint_url: CheckpointOption = None,
    pack_size: Annotated[
        int, typer.Option(min=1, max=64, help="Trials asked and trained at a time as one pack (1: one by one).")
    ] = 1,
) -> None:
    """The whole search locally: trials one after another (or `--pack-size` at a time, as packs), then the best
    config trained in full."""
    from trainer.tools.hyperopt import load_space, search

    def body() -> None:
        base = load_config(config)
        run_dir.mkdir(parents=True, exist_ok=True)
        url = storage or f"sqlite:///{run_dir.resolve() / 'optuna.db'}"
        best = search(
            base,
            load_space(space, base),
            trials,
            url,
            study,
            run_dir,
            typer.echo,
            trial_steps,
            checkpoint_url,
            pack_size,
        )
        typer.echo(json.dumps({k: best[k] for k in ("trial", "value", "params", "eval_return_mean")}))

    _hyperopt_call(body)


@hyperopt_app.command("suggest")
def hyperopt_suggest(
    storage: StorageOption,
    study: StudyOption,
    trials: Annotated[int, typer.Option(min=1, help="Trials the study should hold in total.")],
    config: ConfigOption = None,
    space: SpaceOption = None,
    pack_size: Annotated[
        int, typer.Option(min=1, max=64, help="Trials one pod trains as one pack at most (1: one trial per pod).")
    ] = 16,
) -> None:
    """Create the study if needed, ask the missing trials, group the unfinished ones into packs and print the
    packs as a JSON list of comma-separated trial numbers (["0,1,2", "3"]), one `trial --trials` each."""
    from trainer.tools.hyperopt import check_space, format_pack, load_space, open_study, plan_packs, suggest

    def body() -> None:
        base = load_config(config)
        parsed = load_space(space, base)
        check_space(parsed, base)
        opened = open_study(storage, study, create=True, seed=base.run.seed)
        say = functools.partial(typer.echo, err=True)
        numbers = suggest(opened, parsed, trials, say)
        packs = plan_packs(opened, numbers, parsed, base, pack_size, say) if numbers else []
        typer.echo(json.dumps([format_pack(pack) for pack in packs]))

    _hyperopt_call(body)


@hyperopt_app.command("trial")
def hyperopt_trial(
    trials: Annotated[str, typer.Option(help="Trial numbers, one pack as suggest printed it: 3 or 0,1,2.")],
    storage: StorageOption,
    study: StudyOption,
    config: ConfigOption = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Folder of the trials: trial-<n>/ each, progress.json (default runs/<study>).")
    ] = None,
    trial_steps: Annotated[int | None, typer.Option(min=1, help="run.steps of the trial (default: config's).")] = None,
    checkpoint_url: CheckpointOption = None,
) -> None:
    """Train the trials with their stored parameters, several as one pack, and tell the study each objective (or
    FAIL). One trial trains alone, checkpointing at CHECKPOINT_URL/trial-<n>; a pack in its trials' folders."""
    from trainer.runtime.progress import ProgressReporter
    from trainer.tools.hyperopt import open_study, parse_pack, run_pack

    def body() -> None:
        numbers = parse_pack(trials)
        base = load_config(config)
        opened = open_study(storage, study, create=False)
        extra = [f"run.steps={trial_steps}"] if trial_steps is not None else []
        folder = run_dir or Path("runs") / study
        reporter = ProgressReporter.from_env()  # in a pod: a pack's reports also go to the controller
        try:
            on_report = reporter.update if reporter is not None else None
            run_pack(opened, numbers, base, folder, typer.echo, extra, checkpoint_url, on_report)
        finally:
            if reporter is not None:
                reporter.close()

    _hyperopt_call(body)


@hyperopt_app.command("best")
def hyperopt_best(
    storage: StorageOption,
    study: StudyOption,
    out: Annotated[Path, typer.Option(help="Where to write the best TrainConfig (JSON).")],
    config: ConfigOption = None,
) -> None:
    """Write base config + the best completed trial's parameters, for the full training run."""
    from trainer.tools.hyperopt import open_study, write_best_config

    def body() -> None:
        base = load_config(config)
        write_best_config(open_study(storage, study, create=False), base, out, typer.echo)

    _hyperopt_call(body)


def main() -> None:
    app(prog_name="foxhunt-trainer")


if __name__ == "__main__":
    main()
