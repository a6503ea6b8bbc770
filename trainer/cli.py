"""`python -m trainer …` (console script `foxhunt-trainer`): train, bench, hyperopt.

Bad input (config, dataset, missing file) prints one line `error: …` and exits 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from trainer.config import ConfigError, load_config

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


@app.command()
def train(
    config: ConfigOption = None,
    override: OverrideOption = None,
    run_dir: Annotated[Path | None, typer.Option(help="Output folder (default runs/<time>).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the last complete checkpoint.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train one agent and write config.json, progress.json, summary.json and checkpoints to the run dir."""
    from trainer.data.offline import DatasetError
    from trainer.train import default_run_dir, run_training

    try:
        cfg = load_config(config, override or [])
        run_training(cfg, run_dir or default_run_dir(), resume=resume, show_progress=progress)
    except (ConfigError, DatasetError) as error:
        raise fail(str(error)) from None
    except FileNotFoundError as error:
        raise fail(f"file not found: {error.filename or error}") from None


@app.command()
def bench(
    configs: Annotated[str, typer.Option(help="Comma-separated configurations: core, full.")] = "core,full",
    methods: Annotated[
        str, typer.Option(help="Comma-separated: eager, compile, graph, dual, fused, zerocopy.")
    ] = "eager,compile,graph,dual,fused,zerocopy",
    batch_size: Annotated[int, typer.Option(help="Transitions per step (B).")] = 1024,
    capacity: Annotated[int, typer.Option(help="Replay capacity, filled with random transitions.")] = 1_000_000,
    obs_dim: Annotated[int, typer.Option(help="Observation features F.")] = 64,
    steps: Annotated[int, typer.Option(help="Steps per timed window.")] = 100,
    repeats: Annotated[int, typer.Option(help="Timed windows per method (the median is reported).")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed steps first (capture, compilation).")] = 20,
    steps_per_replay: Annotated[int, typer.Option(help="K steps per graph replay (zerocopy).")] = 10,
    timer_overhead: Annotated[bool, typer.Option(help="Also time eager and zerocopy with StepTimer off.")] = True,
    device: Annotated[str, typer.Option(help="cuda, cpu or auto.")] = "auto",
    out: Annotated[Path, typer.Option(help="Folder for bench.json, bench.png, bench.md.")] = Path("bench-out"),
    override: OverrideOption = None,
) -> None:
    """Time every plan beside eager and torch.compile on the pinned model; print the table, write JSON/PNG/MD."""
    import shlex

    import torch

    from trainer.bench import BenchOptions, check_options, format_table, run_bench, write_outputs

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
    )
    if device not in ("auto", "cpu", "cuda"):
        raise fail(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise fail("--device cuda but no CUDA GPU is available")
    target = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else device.replace("auto", "cpu"))
    try:
        check_options(options)
        for name in options.configs:
            from trainer.bench import bench_config

            bench_config(name, options)
    except (ValueError, ConfigError) as error:
        raise fail(str(error)) from None
    document = run_bench(options, target, log=lambda line: typer.echo(line, err=True))
    write_outputs(document, out, "python -m trainer bench " + shlex.join(sys.argv[2:]))
    typer.echo(format_table(document))


def main() -> None:
    app(prog_name="foxhunt-trainer")


if __name__ == "__main__":
    sys.exit(main())
