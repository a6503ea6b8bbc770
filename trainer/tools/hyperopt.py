"""Hyper-parameter search with Optuna: one study, trials by number, the best config out.

Two ways to run the same study:

* fan-out (the job pipeline, on Argo and locally): `suggest` asks N trials (parameters sampled there by
  the study's sampler and stored with the trial) and groups them into packs (`plan_packs`), one pod per
  pack runs `trial --trials a,b,c` (the trials trained as one pack, `trainer.runtime.pack_train`, or
  alone when the pack holds one) and tells the study each trial's objective, then `best` writes base
  config + best parameters for the full run;
* local: `run` does the whole search in one process (sequentially, so TPE learns from earlier
  trials), then trains the best config in full.

The objective is the summary's `eval_return_mean`, maximised. A trial whose training raises, or
whose objective is missing or not finite, is told FAIL; the others are unaffected and `best` only
looks at COMPLETE trials. A SIGTERM (exit 143, checkpoint written) leaves the trial RUNNING, so a
retried pod resumes it from its checkpoint and then tells the study.

Packs (issue 31): trials whose configs differ only in `PACKABLE` fields (the seed and numeric
hyper-parameters) train as one pack, up to `--pack-size` (DEFAULT_PACK) a pod. A searched field outside
`PACKABLE` changes what the step is (shapes, switches): trials then pack only with those that drew the
same values of it, which for a continuous one means one trial per pod, and suggest says so in the job's
log. In a pack, a run that diverges (its guard froze it) or ends without a usable objective is told
FAIL for its trial alone; the pod fails (exit 1) only when every trial of its pack failed. A retried pod
resumes its pack from the runs' last common checkpoint, as a lone trial resumes from its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from contracts.config import ConfigError, TrainConfig, check_search, dump_config, format_validation_error, with_values
from contracts.search import DEFAULT_SPACE, SearchDimension
from contracts.yamlfile import read_yaml

Log = Callable[[str], None]

OBJECTIVE = "eval_return_mean"
PACKED = ["run.collect_graph=false"]
"""A packed trial's overrides: each run of a pack collects through its own objects (trainer/runtime/pack_train.py),
so on-device collection, which gives the same transitions uncaptured (config: run.collect_graph), is off."""
DEFAULT_PACK = 16
"""Trials one pod trains as one pack at most (`trial --trials`); a pack holds up to 64 runs (MAX_PACK)."""


class HyperoptError(ValueError):
    """Bad input to the search (space, storage, study, trial number); the message is one line."""


class TrialFailed(RuntimeError):
    """A trial that crashed or produced no usable objective; it is recorded FAIL in the study."""


def distribution(dimension: SearchDimension) -> BaseDistribution:
    """A dimension of the space as the Optuna distribution trials are asked from."""
    if dimension.type == "categorical":
        return CategoricalDistribution(dimension.choices or [])
    low, high = dimension.corners()
    assert isinstance(low, int | float) and isinstance(high, int | float)
    if dimension.type == "int":
        return IntDistribution(int(low), int(high), log=dimension.log, step=int(dimension.step or 1))
    return FloatDistribution(low, high, log=dimension.log, step=dimension.step)


def parse_space(data: Any) -> dict[str, BaseDistribution]:
    """A mapping `dotted.name -> SearchDimension` as Optuna distributions, or HyperoptError."""
    if not isinstance(data, dict) or not data:
        raise HyperoptError("space: expected a non-empty mapping of dotted config names to specs")
    space: dict[str, BaseDistribution] = {}
    for name, raw in data.items():
        try:
            space[str(name)] = distribution(SearchDimension.model_validate(raw))
        except ValidationError as error:
            raise HyperoptError(f"space {name}: {format_validation_error(error)}") from None
        except ValueError as error:  # Optuna's own checks: low > high, log with low <= 0, bad step
            raise HyperoptError(f"space {name}: {error}") from None
    return space


def load_space(path: Path | None, base: TrainConfig) -> dict[str, BaseDistribution]:
    """The --space YAML file; else the config's `search.space`; else DEFAULT_SPACE."""
    if path is not None:
        return parse_space(read_yaml(path, "space file", HyperoptError))
    if base.search.space is not None:
        return parse_space({name: dimension.model_dump() for name, dimension in base.search.space.items()})
    return parse_space(DEFAULT_SPACE)


def trial_config(base: TrainConfig, params: dict[str, Any], extra: list[str] | None = None) -> TrainConfig:
    """Base config plus the trial's parameters (and `extra` overrides), validated; ConfigError if not."""
    return with_values(base, params, extra)


def _corners(distribution: BaseDistribution) -> list[Any]:
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    assert isinstance(distribution, FloatDistribution | IntDistribution)
    return [distribution.low, distribution.high]


def check_space(space: dict[str, BaseDistribution], base: TrainConfig) -> None:
    """Every bound and choice must make a valid config, so no trial fails on validation alone."""
    try:
        check_search(base, 1, {name: _corners(distribution) for name, distribution in space.items()})
    except ConfigError as error:
        raise HyperoptError(str(error)) from None


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


def plan_packs(
    study: optuna.Study,
    numbers: list[int],
    space: dict[str, BaseDistribution],
    base: TrainConfig,
    pack_size: int,
    log: Log,
) -> list[list[int]]:
    """The trials `numbers` grouped into packs of at most `pack_size`, in order of their first trial. Trials pack
    together when their configs differ only in PACKABLE fields (`check_packable`): a searched field outside it
    (a shape, a switch) puts trials that drew different values of it into different packs, and `log` says how
    many trials that leaves alone. A chunk that `check_packable` still refuses runs one trial per pack."""
    from contracts.packs import MAX_PACK, PackError, check_packable, unpackable

    size = max(1, min(pack_size, MAX_PACK))
    fixed = unpackable(space)
    params = {t.number: t.params for t in study.get_trials(deepcopy=False) if t.number in numbers}
    by_shape: dict[tuple[tuple[str, Any], ...], list[int]] = {}
    for number in numbers:  # trials that drew the same values of every unpackable field
        by_shape.setdefault(tuple((name, params[number].get(name)) for name in fixed), []).append(number)
    packs: list[list[int]] = []
    for same in by_shape.values():
        for chunk in (same[i : i + size] for i in range(0, len(same), size)):
            try:
                check_packable([trial_config(base, params[number]) for number in chunk])
            except (PackError, ConfigError):  # an invalid config fails its own trial, alone
                packs.extend([number] for number in chunk)
            else:
                packs.append(chunk)
    packs.sort(key=lambda pack: pack[0])
    if fixed and size > 1:
        alone = sum(len(pack) == 1 for pack in packs)
        log(
            f"packs: the space searches {', '.join(fixed)}, which a pack's runs cannot vary (it changes the model's "
            f"shapes or the step): trials pack only with those that drew the same values; {alone} of "
            f"{len(numbers)} trials run one per pod"
        )
    log(f"packs: {len(numbers)} trials in {len(packs)} pod(s): {' '.join(format_pack(p) for p in packs)}")
    return packs


def format_pack(pack: list[int]) -> str:
    """A pack as `trial --trials` takes it and the fan-out passes it: "0,1,2"."""
    return ",".join(str(number) for number in pack)


def parse_pack(text: str) -> list[int]:
    """`--trials 0,1,2`: the trial numbers, distinct and at least one, or HyperoptError."""
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        raise HyperoptError(f"--trials takes comma-separated trial numbers, e.g. 0,1,2; got {text!r}") from None
    if any(n < 0 for n in numbers) or len(set(numbers)) != len(numbers):
        raise HyperoptError(f"--trials takes distinct trial numbers >= 0, got {text!r}")
    return numbers


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


def trial_url(checkpoint_url: str | None, number: int) -> str | None:
    """Trial `number`'s checkpoint location under the search's (`<url>/trial-<n>`), or None (its run folder)."""
    return f"{checkpoint_url}/trial-{number}" if checkpoint_url else None


def run_pack(
    study: optuna.Study,
    numbers: list[int],
    base: TrainConfig,
    run_dir: Path,
    log: Log,
    extra: list[str] | None = None,
    checkpoint_url: str | None = None,
    on_report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[int, float]:
    """Train the trials `numbers` (trial n in `run_dir/trial-<n>`) and tell the study each one's objective;
    the objectives of those that completed. One trial left trains exactly as `run_trial`; several as one pack,
    or one by one if they turn out not to pack here. TrialFailed when every trial failed.

    Each pack report (`trainer.runtime.pack_train.pack_report`) goes to `run_dir/progress.json`, which the
    local backend reads for the job, and to `on_report` (the controller, from a pod)."""
    todo = _trainable(study, numbers, log)
    finished = [find_trial(study, n) for n in numbers if n not in todo]
    done = {t.number: t.value for t in finished if t.state == TrialState.COMPLETE and t.value is not None}
    if len(todo) == 1:
        number = todo[0]
        url = trial_url(checkpoint_url, number)
        return {**done, number: run_trial(study, number, base, run_dir / f"trial-{number}", log, extra, url)}
    configs: dict[int, TrainConfig] = {}
    for number in todo:
        try:
            configs[number] = trial_config(base, find_trial(study, number).params, [*(extra or []), *PACKED])
        except ConfigError as error:
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
            log(f"error: trial {number}: its config is invalid: {error} (recorded as FAIL)")
    values = {**done, **_train_pack(study, base, configs, run_dir, log, extra, checkpoint_url, on_report)}
    if numbers and not values:
        raise TrialFailed(f"every trial of the pack {format_pack(numbers)} failed")
    return values


def _trainable(study: optuna.Study, numbers: list[int], log: Log) -> list[int]:
    """The trials of `numbers` still to train (RUNNING); a finished one is said and skipped, not trained again."""
    todo: list[int] = []
    for number in numbers:
        trial = find_trial(study, number)
        if trial.state == TrialState.RUNNING:
            todo.append(number)
        elif len(numbers) == 1:
            todo.append(number)  # run_trial's own answer: the value of a complete trial, an error for a failed one
        else:
            log(f"trial {number}: already {trial.state.name}, not trained again")
    return todo


def _train_pack(
    study: optuna.Study,
    base: TrainConfig,
    configs: dict[int, TrainConfig],
    run_dir: Path,
    log: Log,
    extra: list[str] | None,
    checkpoint_url: str | None,
    on_report: Callable[[dict[str, Any]], None] | None,
) -> dict[int, float]:
    """`configs` (trial -> config) as one pack; each trial told its objective, or FAIL (diverged, no objective)."""
    from contracts.jsonfile import write_json_atomic
    from contracts.packs import PackError
    from trainer.runtime.pack_train import run_pack_training

    if not configs:
        return {}
    numbers = list(configs)

    def report(progress: dict[str, Any]) -> None:
        write_json_atomic(run_dir / "progress.json", progress, indent=2)
        if on_report is not None:
            on_report(progress)

    for number in numbers:
        log(f"trial {number}: training {_describe(find_trial(study, number).params)} -> {run_dir / f'trial-{number}'}")
    dirs = [run_dir / f"trial-{number}" for number in numbers]
    try:
        urls = [trial_url(checkpoint_url, number) for number in numbers]
        summaries = run_pack_training(
            list(configs.values()), dirs, log, trials=numbers, on_report=report, checkpoint_urls=urls, resume=True
        )
    except PackError as error:  # not packable on this machine (e.g. on-device collection): one after another
        log(f"packs: trials {format_pack(numbers)} cannot train as one pack here ({error}); one after another")
        return _one_by_one(study, numbers, base, run_dir, log, extra, checkpoint_url)
    except Exception as error:  # the pack's failure is each of its trials'; SystemExit (SIGTERM: 143) is not caught
        for number in numbers:
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        message = str(error).splitlines()[0] if str(error) else ""
        raise TrialFailed(f"the pack {format_pack(numbers)} failed: {type(error).__name__}: {message}") from error
    told = {n: _tell(study, n, summary, log) for n, summary in zip(numbers, summaries, strict=True)}
    return {n: value for n, value in told.items() if value is not None}


def _tell(study: optuna.Study, number: int, summary: dict[str, Any], log: Log) -> float | None:
    """Tell the study trial `number`'s objective from its packed run's summary, or FAIL: its value or None."""
    diverged = summary.get("diverged_at_step")
    try:
        if diverged is not None:
            raise TrialFailed(f"its run diverged (non-finite updates) and was frozen at step {diverged}")
        value = objective_of(summary)
    except TrialFailed as error:
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        log(f"error: trial {number} failed: {error} (recorded as FAIL; the pack's other trials are unaffected)")
        return None
    study.tell(number, value, skip_if_finished=True)
    log(f"trial {number}: {OBJECTIVE}={value:.4g}")
    return value


def _one_by_one(
    study: optuna.Study,
    numbers: list[int],
    base: TrainConfig,
    run_dir: Path,
    log: Log,
    extra: list[str] | None,
    checkpoint_url: str | None,
) -> dict[int, float]:
    """The trials of a pack that cannot train as one, each as `run_trial` trains it; the completed ones' values."""
    values: dict[int, float] = {}
    for number in numbers:
        url = trial_url(checkpoint_url, number)
        try:
            values[number] = run_trial(study, number, base, run_dir / f"trial-{number}", log, extra, url)
        except TrialFailed as error:
            log(f"error: {error} (recorded as FAIL)")
    return values


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
    pack_size: int = 1,
) -> dict[str, Any]:
    """The whole search in one process, then the best config trained in full; returns best.json.

    Re-running it continues the same study: unfinished trials resume from their checkpoints and
    only the missing trials are asked. Trials checkpoint in their own run directory (or under
    `<checkpoint_url>/trial-<n>` when given); the final run in its run directory (or at `checkpoint_url`).
    `pack_size` > 1 asks that many trials at a time (Optuna's ask/tell, K at a time: the sampler then
    learns from each batch, not each trial) and trains those that pack as one pack (`plan_packs`, `run_pack`).
    """
    check_space(space, base)
    study = open_study(storage, study_name, create=True, seed=base.run.seed)
    extra = [f"run.steps={trial_steps}"] if trial_steps is not None else []
    pending = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    while pending or len(study.get_trials(deepcopy=False)) < trials:
        if pending:  # unfinished trials first, a pack of them at a time
            numbers, pending = pending[:pack_size], pending[pack_size:]
        else:
            missing = trials - len(study.get_trials(deepcopy=False))
            numbers = [study.ask(space).number for _ in range(min(pack_size, missing))]
        packs = plan_packs(study, numbers, space, base, pack_size, log) if len(numbers) > 1 else [numbers]
        for pack in packs:
            log(f"trial {format_pack([n + 1 for n in pack])}/{trials}")
            try:
                run_pack(study, pack, base, run_dir, log, extra, checkpoint_url)
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
