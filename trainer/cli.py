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
    from trainer.data.errors import DataError
    from trainer.train import default_run_dir, run_training

    try:
        cfg = load_config(config, override or [])
        run_training(cfg, run_dir or default_run_dir(), resume=resume, show_progress=progress)
    except (ConfigError, DataError) as error:
        raise fail(str(error)) from None
    except FileNotFoundError as error:
        raise fail(f"file not found: {error.filename or error}") from None


def main() -> None:
    app(prog_name="foxhunt-trainer")


if __name__ == "__main__":
    sys.exit(main())
