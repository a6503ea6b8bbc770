"""A job's pipeline, written once: its steps, their order, and each step's trainer command.

Both backends run exactly this (Metaflow's "same flow locally and on the cluster"):
- the local backend (`service/backends/local_pipeline.py`) binds the placeholders to paths in the
  job directory and runs the steps as processes;
- `argo/render.py` renders WorkflowTemplates from it with Hera, binding the placeholders to Argo
  expressions and the shared volume, and the YAML under `argo/` is its committed output.

A step's arguments are built from the trainer CLI's own option names (read from the Typer app), so
a renamed option changes every backend's command at once, and `tests/test_pipeline.py` parses each
command back with the CLI. Placeholders are `str.format` fields:

=============  ===============================================================================
placeholder    meaning
=============  ===============================================================================
{config}       the job's TrainConfig (JSON file) as submitted: read by the resolve step alone
{model}        the job's model (`contracts.config.MODELS`); resolve refuses any other
{train_epochs} the job's length in epochs, which resolve turns into run.steps; 0: the config's run.steps
{pool}         the job's GPU pool, which resolve checks against {pools}
{pools}        the controller's pools file (YAML, `pools: [{name: …}]`)
{run}          the job's output root (config.json, check/, hyperopt/, train/ below it), fixed per job
{checkpoints}  the job's checkpoint root, fixed per job (never per pod or retry): retries resume
{storage}      the Optuna storage URL of the job's study
{study}        the Optuna study name (one per job)
{trials}       hyper-parameter trials to run (the pipeline has the search only when > 0)
{trial}        one trial's number, an item of the suggest step's JSON output
{status}       the pipeline's outcome, for the exit handler (Succeeded, Failed, Error)
{duration}     seconds the pipeline ran, for the exit handler
{failures}     the failed steps as JSON, for the exit handler
=============  ===============================================================================

The resolve step, first and on a CPU, checks what the job asks and writes its resolved config to
RESOLVED_CONFIG (`{run}/config.json`: model and pool checked, epochs turned into run.steps, the one
place that happens), and every later step reads that file, so the config is the one carrier of plan,
steps and seeds. It needs no GPU, so a job that asks for a pool nobody has fails at once instead of
waiting for a node of that pool; compile, the first GPU step, then runs the resolved config's plan.

Torch-free: the controller imports it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

import typer.main

Resources = Literal["gpu", "cpu", "tiny"]
Retry = Literal["infrastructure", "on-error"]

SUGGEST, TRIAL, BEST = "hyperopt-suggest", "hyperopt-trial", "hyperopt-best"
RESOLVE, CHECK, TRAIN, REPORT, EXIT = "resolve", "compile", "train", "report", "on-exit"

RESOLVED_CONFIG = "{run}/config.json"
BEST_CONFIG = "{run}/hyperopt/best-config.json"
TRAIN_RUN_DIR = "{run}/train"


class PipelineError(ValueError):
    """The pipeline names a trainer command or option that the CLI does not have."""


@dataclass(frozen=True)
class Step:
    """One step: a trainer command and what it needs from the machine that runs it."""

    name: str
    argv: tuple[str, ...]  # trainer CLI arguments, with {placeholders}
    resources: Resources
    deadline_seconds: int
    # infrastructure: node loss, preemption and SIGTERM (exit 143) are retried, the trainer's own
    # failures (exit 1, 2) are not; on-error: only Argo's Error phase (the pod never ran to an exit).
    retry: Retry
    checkpoint_url: str | None = None
    optuna: bool = False
    description: str = ""

    def command(self, values: dict[str, str]) -> list[str]:
        """The argument list with every placeholder bound (KeyError names a missing one)."""
        return [part.format(**values) for part in self.argv]


@functools.cache
def _cli() -> Any:
    """The trainer's CLI as Typer builds it (Click objects; Typer vendors its own Click, so duck-typed)."""
    from trainer.cli import app

    return typer.main.get_command(app)


def trainer_args(command: str, /, **options: str | int | bool) -> tuple[str, ...]:
    """`command` ("train", "hyperopt trial") and its options, spelled as the trainer CLI spells them.

    Options are keyed by the Python parameter names of the CLI functions; a boolean selects a flag's
    on or off form (`resume=True` -> `--resume`, `progress=False` -> `--no-progress`).
    """
    node = _cli()
    for part in command.split():
        if part not in getattr(node, "commands", {}):
            raise PipelineError(f"the trainer CLI has no command {command!r}")
        node = node.commands[part]
    params = {param.name: param for param in node.params if param.param_type_name == "option"}
    argv = command.split()
    for name, value in options.items():
        option = params.get(name)
        if option is None:
            raise PipelineError(f"`trainer {command}` has no option for {name!r}; it has {sorted(params)}")
        long = [flag for flag in option.opts if flag.startswith("--")]
        if isinstance(value, bool):
            if not option.is_flag:
                raise PipelineError(f"`trainer {command} {long[0]}` takes a value, not a flag")
            argv.append(long[0] if value else option.secondary_opts[0])
        else:
            argv += [long[0], str(value)]
    return tuple(argv)


def parse_trainer_args(argv: list[str]) -> dict[str, Any]:
    """Parse `argv` with the trainer CLI itself, running nothing: the leaf command's parameters.

    Raises the CLI's own usage error (an unknown option, a missing value) as a `PipelineError`.
    """
    node, rest = _cli(), list(argv)
    while rest and rest[0] in getattr(node, "commands", {}):
        node = node.commands[rest.pop(0)]
    if hasattr(node, "commands"):
        raise PipelineError(f"{' '.join(argv)!r} names no trainer command")
    try:
        context = node.make_context(node.name, rest)
    except Exception as error:  # Typer's vendored click raises its own UsageError/BadParameter
        raise PipelineError(f"the trainer CLI rejects {' '.join(argv)!r}: {error}") from error
    return dict(context.params)


def resolve_step() -> Step:
    return Step(
        name=RESOLVE,
        argv=trainer_args(
            "resolve",
            config="{config}",
            model="{model}",
            train_epochs="{train_epochs}",
            pool="{pool}",
            pools_file="{pools}",
            out=RESOLVED_CONFIG,
        ),
        resources="tiny",
        deadline_seconds=300,
        retry="on-error",
        description=(
            "Checks what the job asks (the model, the pool, epochs or run.steps but not both) and writes its "
            "resolved config, which every later step reads. It needs no GPU: a job that asks wrongly, or for a "
            "pool the controller does not know, fails here at once with the reason, instead of waiting for a node."
        ),
    )


def check_step() -> Step:
    return Step(
        name=CHECK,
        argv=trainer_args("check", config=RESOLVED_CONFIG, out="{run}/check"),
        resources="gpu",
        deadline_seconds=3600,
        retry="infrastructure",
        description=(
            "A few updates of the resolved config's plan on this machine's device: warm-up, capture, graphs. A plan "
            "that cannot run fails here in minutes instead of hours into train; on a cluster it also warms the "
            "kernel caches that trials and train reuse."
        ),
    )


def suggest_step() -> Step:
    return Step(
        name=SUGGEST,
        argv=trainer_args(
            "hyperopt suggest", config=RESOLVED_CONFIG, trials="{trials}", storage="{storage}", study="{study}"
        ),
        resources="cpu",
        deadline_seconds=600,
        retry="on-error",
        optuna=True,
        description="Creates the study and prints the trial numbers to train as a JSON list on stdout.",
    )


def trial_step() -> Step:
    return Step(
        name=TRIAL,
        argv=trainer_args(
            "hyperopt trial",
            trial="{trial}",
            storage="{storage}",
            study="{study}",
            config=RESOLVED_CONFIG,
            run_dir="{run}/hyperopt/trial-{trial}",
        ),
        resources="gpu",
        deadline_seconds=21600,
        retry="infrastructure",
        checkpoint_url="{checkpoints}/trial-{trial}",
        optuna=True,
        description="Trains one trial with its stored parameters and tells the study its objective.",
    )


def best_step() -> Step:
    return Step(
        name=BEST,
        argv=trainer_args(
            "hyperopt best", storage="{storage}", study="{study}", config=RESOLVED_CONFIG, out=BEST_CONFIG
        ),
        resources="cpu",
        deadline_seconds=600,
        retry="on-error",
        optuna=True,
        description="Writes the base config with the best completed trial's parameters, for train.",
    )


def train_step(config: str) -> Step:
    """The full run from `config` (the job's resolved config, or the search's best). `--resume` continues from the job's
    checkpoint, so a retry after node loss or preemption picks up where the last checkpoint left off."""
    return Step(
        name=TRAIN,
        argv=trainer_args("train", config=config, run_dir=TRAIN_RUN_DIR, resume=True, progress=False),
        resources="gpu",
        deadline_seconds=172800,
        retry="infrastructure",
        checkpoint_url="{checkpoints}/train",
        description="The full training run.",
    )


def report_step() -> Step:
    return Step(
        name=REPORT,
        argv=trainer_args("report", run_dir=TRAIN_RUN_DIR),
        resources="tiny",
        deadline_seconds=300,
        retry="on-error",
        description="Prints the run's breakdown, then its summary as one JSON line: the step's result.",
    )


def exit_step() -> Step:
    return Step(
        name=EXIT,
        argv=trainer_args("finish", run="{run}", status="{status}", duration="{duration}", failures="{failures}"),
        resources="tiny",
        deadline_seconds=300,
        retry="on-error",
        description="Runs on success, failure and stop: writes status.json beside the run, outliving the job.",
    )


@dataclass(frozen=True)
class Pipeline:
    """The steps of one job, in order: resolve, check, then the search (when trials > 0), train, report;
    `on_exit` always."""

    resolve: Step = field(default_factory=resolve_step)
    check: Step = field(default_factory=check_step)
    suggest: Step = field(default_factory=suggest_step)
    trial: Step = field(default_factory=trial_step)
    best: Step = field(default_factory=best_step)
    train: Step = field(default_factory=lambda: train_step(RESOLVED_CONFIG))
    train_best: Step = field(default_factory=lambda: train_step(BEST_CONFIG))
    report: Step = field(default_factory=report_step)
    on_exit: Step = field(default_factory=exit_step)

    def steps(self) -> list[Step]:
        """Every distinct step (train and train_best share one template on Argo)."""
        return [self.resolve, self.check, self.suggest, self.trial, self.best, self.train, self.report, self.on_exit]


PIPELINE = Pipeline()
