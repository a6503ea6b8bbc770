"""Hyper-parameter search with Optuna: one study, trials by number, the best config out.

Two ways to run the same study:

* fan-out (Argo): `suggest` asks N trials (parameters sampled there by the study's sampler and
  stored with the trial), one pod per trial runs `trial --trial n` and tells the study its
  objective, then `best` writes base config + best parameters for the full run;
* local: `run` does the whole search in one process (sequentially, so TPE learns from earlier
  trials), then trains the best config in full.

The objective is the summary's `eval_return_mean`, maximised. A trial whose training raises, or
whose objective is missing or not finite, is told FAIL; the others are unaffected and `best` only
looks at COMPLETE trials. A SIGTERM (exit 143, checkpoint written) leaves the trial RUNNING, so a
retried pod resumes it from its checkpoint and then tells the study.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from sqlalchemy.exc import SQLAlchemyError

from contracts.config import ConfigError, TrainConfig, build_config, dump_config, format_validation_error
from contracts.yamlfile import read_yaml

Log = Callable[[str], None]
Choice = None | bool | int | float | str

OBJECTIVE = "eval_return_mean"

# The default search space: dotted TrainConfig field -> spec (the same format as a --space file).
DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "optim.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
    "loss.cql_alpha": {"type": "float", "low": 0.0, "high": 1.0},
    "optim.target_tau": {"type": "float", "low": 1e-3, "high": 5e-2, "log": True},
    "replay.alpha": {"type": "float", "low": 0.3, "high": 0.9},
}


class HyperoptError(ValueError):
    """Bad input to the search (space, storage, study, trial number); the message is one line."""


class TrialFailed(RuntimeError):
    """A trial that crashed or produced no usable objective; it is recorded FAIL in the study."""


class SearchDimension(BaseModel):
    """One dimension of the space; `log` samples uniformly in log space, `step` discretises."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[Choice] | None = None

    @model_validator(mode="after")
    def _shape(self) -> SearchDimension:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("categorical needs a non-empty 'choices' list")
            if self.low is not None or self.high is not None or self.log or self.step is not None:
                raise ValueError("categorical takes only 'choices'")
            return self
        if self.choices is not None:
            raise ValueError(f"{self.type} takes low/high, not 'choices'")
        if self.low is None or self.high is None:
            raise ValueError(f"{self.type} needs 'low' and 'high'")
        if self.type == "int" and not (self.low.is_integer() and self.high.is_integer()):
            raise ValueError(f"int needs whole low/high, got {self.low}..{self.high}")
        return self

    def distribution(self) -> BaseDistribution:
        if self.type == "categorical":
            return CategoricalDistribution(self.choices or [])
        assert self.low is not None and self.high is not None
        if self.type == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)


def parse_space(data: Any) -> dict[str, BaseDistribution]:
    """A mapping `dotted.name -> SearchDimension` as Optuna distributions, or HyperoptError."""
    if not isinstance(data, dict) or not data:
        raise HyperoptError("space: expected a non-empty mapping of dotted config names to specs")
    space: dict[str, BaseDistribution] = {}
    for name, raw in data.items():
        try:
            space[str(name)] = SearchDimension.model_validate(raw).distribution()
        except ValidationError as error:
            raise HyperoptError(f"space {name}: {format_validation_error(error)}") from None
        except ValueError as error:  # Optuna's own checks: low > high, log with low <= 0, bad step
            raise HyperoptError(f"space {name}: {error}") from None
    return space


def load_space(path: Path | None) -> dict[str, BaseDistribution]:
    """The --space YAML file, or DEFAULT_SPACE when none is given."""
    if path is None:
        return parse_space(DEFAULT_SPACE)
    return parse_space(read_yaml(path, "space file", HyperoptError))


def with_params(document: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config document with each dotted parameter set to its exact sampled value."""
    tree = copy.deepcopy(document)
    for name, value in params.items():
        *sections, field = name.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {section} is not a section")
        node[field] = value
    return tree


def trial_config(base: TrainConfig, params: dict[str, Any], extra: list[str] | None = None) -> TrainConfig:
    """Base config plus the trial's parameters (and `extra` overrides), validated; ConfigError if not."""
    return build_config(with_params(base.model_dump(mode="json"), params), extra)


def _corners(distribution: BaseDistribution) -> list[Any]:
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    assert isinstance(distribution, FloatDistribution | IntDistribution)
    return [distribution.low, distribution.high]


def check_space(space: dict[str, BaseDistribution], base: TrainConfig) -> None:
    """Every bound and choice must make a valid config, so no trial fails on validation alone."""
    if base.run.eval_episodes < 1:
        raise HyperoptError(f"run.eval_episodes is {base.run.eval_episodes}: the search needs >= 1 for its objective")
    for name, distribution in space.items():
        for value in _corners(distribution):
            try:
                trial_config(base, {name: value})
            except ConfigError as error:
                raise HyperoptError(f"space {name}: {value!r} does not make a valid config: {error}") from None


def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_study(storage: str, name: str, create: bool, seed: int = 0) -> optuna.Study:
    """Create (idempotently) or load a maximising study; a missing study or bad URL is HyperoptError."""
    _quiet_optuna()
    sampler = optuna.samplers.TPESampler(seed=seed)
    try:
        if create:
            return optuna.create_study(
                storage=storage, study_name=name, direction="maximize", sampler=sampler, load_if_exists=True
            )
        return optuna.load_study(storage=storage, study_name=name, sampler=sampler)
    except KeyError:
        raise HyperoptError(f"study {name!r} not found in {_redact(storage)}") from None
    except (ImportError, ValueError, SQLAlchemyError) as error:  # bad URL or driver, unreachable, unwritable
        raise HyperoptError(f"storage {_redact(storage)}: {str(error).splitlines()[0]}") from None


def _redact(url: str) -> str:
    """The storage URL without its password, for messages (it comes from a Secret)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        credentials, host = rest.rsplit("@", 1)
        return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"
    return url


def suggest(study: optuna.Study, space: dict[str, BaseDistribution], trials: int, log: Log) -> list[int]:
    """Ask trials until the study holds `trials`; return the unfinished ones (idempotent on a retry)."""
    while len(study.get_trials(deepcopy=False)) < trials:
        trial = study.ask(space)
        log(f"trial {trial.number}: {_describe(trial.params)}")
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))][:trials]


def _describe(params: dict[str, Any]) -> str:
    return " ".join(
        f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in sorted(params.items())
    )


def objective_of(summary: dict[str, Any]) -> float:
    """The summary's eval_return_mean as a finite float, or TrialFailed."""
    value = summary.get(OBJECTIVE)
    if value is None:
        raise TrialFailed(f"the run reported no {OBJECTIVE} (no evaluation episodes)")
    value = float(value)
    if not math.isfinite(value):
        raise TrialFailed(f"{OBJECTIVE} is {value}")
    return value


def find_trial(study: optuna.Study, number: int) -> FrozenTrial:
    for trial in study.get_trials(deepcopy=False):
        if trial.number == number:
            return trial
    raise HyperoptError(f"study {study.study_name!r} has no trial {number} (suggest creates them)")


def run_trial(
    study: optuna.Study,
    number: int,
    base: TrainConfig,
    run_dir: Path,
    log: Log,
    extra: list[str] | None = None,
    checkpoint_url: str | None = None,
) -> float:
    """Train trial `number` with its stored parameters and tell the study; TrialFailed after a crash.
    It checkpoints at `checkpoint_url` (the job's location for this trial), else in `run_dir`.

    A trial already COMPLETE returns its value without training again (a re-run step is a no-op).
    """
    trial = find_trial(study, number)
    if trial.state == TrialState.COMPLETE:
        assert trial.value is not None
        log(f"trial {number}: already complete, {OBJECTIVE}={trial.value:.4g}")
        return trial.value
    if trial.state != TrialState.RUNNING:
        raise HyperoptError(f"trial {number} is {trial.state.name}, not RUNNING: it cannot be trained again")
    try:
        config = trial_config(base, trial.params, extra)
    except ConfigError as error:
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        raise TrialFailed(f"trial {number}: its config is invalid: {error}") from None
    from trainer.runtime.train import run_training  # torch: only where a trial actually trains

    log(f"trial {number}: training {_describe(trial.params)} -> {run_dir}")
    try:
        summary = run_training(
            config, run_dir, resume=True, show_progress=False, out=log, checkpoint_url=checkpoint_url
        )
        value = objective_of(summary)
    except Exception as error:  # the trial's failure, recorded; SystemExit (SIGTERM: 143) is not caught
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        message = str(error).splitlines()[0] if str(error) else ""
        raise TrialFailed(f"trial {number} failed: {type(error).__name__}: {message}") from error
    study.tell(number, value, skip_if_finished=True)
    log(f"trial {number}: {OBJECTIVE}={value:.4g}")
    return value


def best_trial(study: optuna.Study) -> FrozenTrial:
    """The COMPLETE trial with the highest objective; failed and unfinished trials are ignored."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not done:
        failed = len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
        raise TrialFailed(f"study {study.study_name!r} has no completed trial ({failed} failed)")
    return study.best_trial


def write_best_config(study: optuna.Study, base: TrainConfig, out: Path, log: Log) -> tuple[FrozenTrial, TrainConfig]:
    """Write base config + best parameters as a TrainConfig JSON document for the full run."""
    trial = best_trial(study)
    config = trial_config(base, trial.params)
    out.parent.mkdir(parents=True, exist_ok=True)
    dump_config(config, out)
    assert trial.value is not None
    log(f"best: trial {trial.number}, {OBJECTIVE}={trial.value:.4g}, {_describe(trial.params)} -> {out}")
    return trial, config


def search(
    base: TrainConfig,
    space: dict[str, BaseDistribution],
    trials: int,
    storage: str,
    study_name: str,
    run_dir: Path,
    log: Log,
    trial_steps: int | None = None,
    checkpoint_url: str | None = None,
) -> dict[str, Any]:
    """The whole search in one process, then the best config trained in full; returns best.json.

    Re-running it continues the same study: unfinished trials resume from their checkpoints and
    only the missing trials are asked. Trials checkpoint in their own run directory (or under
    `<checkpoint_url>/trial-<n>` when given); the final run in its run directory (or at `checkpoint_url`).
    """
    check_space(space, base)
    study = open_study(storage, study_name, create=True, seed=base.run.seed)
    extra = [f"run.steps={trial_steps}"] if trial_steps is not None else []
    pending = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    while pending or len(study.get_trials(deepcopy=False)) < trials:
        number = pending.pop(0) if pending else study.ask(space).number
        log(f"trial {number + 1}/{trials}")
        trial_url = f"{checkpoint_url}/trial-{number}" if checkpoint_url else None
        try:
            run_trial(study, number, base, run_dir / f"trial-{number}", log, extra, checkpoint_url=trial_url)
        except TrialFailed as error:
            log(f"error: {error} (recorded as FAIL; the search goes on)")
    trial, config = write_best_config(study, base, run_dir / "best-config.json", log)
    log(f"training the best config (trial {trial.number}) in full -> {run_dir / 'final'}")
    summary = run_final(config, run_dir / "final", log, checkpoint_url)
    best = {
        "study": study_name,
        "trial": trial.number,
        "value": trial.value,
        "params": trial.params,
        "config": config.model_dump(mode="json"),
        "final_run_dir": str(run_dir / "final"),
        OBJECTIVE: summary.get(OBJECTIVE),
        "trials": {state.name: len(study.get_trials(deepcopy=False, states=(state,))) for state in TrialState},
    }
    (run_dir / "best.json").write_text(json.dumps(best, indent=2) + "\n")
    return best


def run_final(config: TrainConfig, run_dir: Path, log: Log, checkpoint_url: str | None = None) -> dict[str, Any]:
    from trainer.runtime.train import run_training

    return run_training(config, run_dir, resume=True, show_progress=False, out=log, checkpoint_url=checkpoint_url)
