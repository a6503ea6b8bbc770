"""Seed sweeps: one `trainer train` process per seed, run in parallel, and a table of how each seed ended.

`python -m trainer sweep --config C --seeds 4,5,6,7,8 --jobs N --out DIR [-o key=value ...] [--threshold T]`
trains config C once per seed, at most N processes at a time, each in DIR/seed-<n>/ (its log in
train.log there) with `run.cpu_threads=1` unless an override says otherwise. While they run, one
line every few seconds shows each seed's step and training return (from its progress.json). At
the end DIR/sweep.json and DIR/sweep.md hold one row per seed: the final greedy return over the
config's `run.eval_episodes` (mean and lowest), the best-policy step of `run.eval_every`, the
training return of the last 20 episodes, the wall time, and the exact command that reproduces it.

A seed whose process fails (non-zero exit, or no summary.json) is a row marked failed; the sweep
goes on with the others and then exits EXIT_SEED_FAILED. With a threshold, every seed that ran
must reach it (mean over the final episodes >= threshold), or the sweep exits EXIT_BELOW_THRESHOLD.
With `--pack K` (issue 31) the seeds are trained K at a time in one process each, as one pack (`trainer
train-pack`: one batched step for all K, each seed's folder as `trainer train` writes it); `--jobs` then counts
packs. A seed whose guard skips is frozen by its pack (its summary's `diverged_at_step`) and its row says so.
Imports no torch: the trainers are child processes.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

from contracts.config import ConfigError, load_config

Log = Callable[[str], None]

EXIT_SEED_FAILED = 1
EXIT_BELOW_THRESHOLD = 3
SEED_DIR = "seed-{seed}"
LOG_NAME = "train.log"
LOG_TAIL_LINES = 5
STOP_GRACE_SECONDS = 30.0


def parse_seeds(text: str) -> list[int]:
    """`"4,5,6"` or `"4-8"` (inclusive) or a mix -> distinct seeds in the order given."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            span = range(int(low), int(high) + 1) if dash else range(int(part), int(part) + 1)
        except ValueError:
            raise ConfigError(f"--seeds: {part!r} is not a seed or a range like 4-8") from None
        if not span or span.start < 0:
            raise ConfigError(f"--seeds: {part!r} is empty or negative")
        seeds.extend(span)
    if not seeds:
        raise ConfigError("--seeds: no seeds given, e.g. --seeds 4,5,6,7,8")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: a seed appears twice in {text!r}")
    return seeds


@dataclass(frozen=True)
class SweepOptions:
    config: Path
    seeds: list[int]
    out: Path
    jobs: int = 1
    overrides: list[str] = field(default_factory=list)
    threshold: float | None = None
    poll_seconds: float = 10.0
    python: str = sys.executable
    pack: int = 1
    """Seeds per process, trained as one pack (`trainer train-pack`); 1: one `trainer train` process per seed."""


def seed_overrides(seed: int, overrides: Sequence[str]) -> list[str]:
    """The overrides of one seed's run: its seed, one CPU thread, then the user's (which may change the thread)."""
    if any(item.split("=", 1)[0].strip() == "run.seed" for item in overrides):
        raise ConfigError("override run.seed: the sweep sets each run's seed; use --seeds")
    return [f"run.seed={seed}", "run.cpu_threads=1", *overrides]


def seed_argv(options: SweepOptions, seed: int) -> list[str]:
    """The `trainer train` command line of one seed (the program is `options.python`)."""
    argv = [options.python, "-m", "trainer", "train", "--config", str(options.config)]
    argv += ["--run-dir", str(options.out / SEED_DIR.format(seed=seed)), "--no-progress"]
    for item in seed_overrides(seed, options.overrides):
        argv += ["-o", item]
    return argv


def group_argv(options: SweepOptions, seeds: Sequence[int]) -> list[str]:
    """The command line of one process: `seed_argv` for a lone seed, `trainer train-pack` for a pack of seeds."""
    if options.pack == 1:
        return seed_argv(options, seeds[0])
    argv = [options.python, "-m", "trainer", "train-pack", "--config", str(options.config)]
    argv += ["--seeds", ",".join(str(seed) for seed in seeds), "--out", str(options.out)]
    for item in options.overrides:
        argv += ["-o", item]
    return argv


def groups(options: SweepOptions) -> list[list[int]]:
    """The seeds of each process, in order: one each, or packs of `options.pack`."""
    return [options.seeds[i : i + options.pack] for i in range(0, len(options.seeds), options.pack)]


def display_command(argv: Sequence[str]) -> str:
    """The command as a user types it: `python -m trainer …` (the interpreter's path is in the JSON header)."""
    return shlex.join(["python", *argv[1:]])


@dataclass
class Row:
    """How one seed's run ended."""

    seed: int
    status: Literal["ok", "failed"]
    command: str
    exit_code: int | None = None
    wall_seconds: float = 0.0
    train_seconds: float | None = None
    steps: int | None = None
    eval_return_mean: float | None = None
    eval_return_min: float | None = None
    eval_episodes: int = 0
    best_eval_step: int | None = None
    best_eval_return: float | None = None
    train_return_mean: float | None = None
    reached: bool | None = None
    stopped: Literal["return reached", "time limit"] | None = None  # why a run ended before run.steps
    error: str | None = None
    diverged_at_step: int | None = None
    """In a pack: the step by which the guard had skipped this seed's update, which froze it (None: it did not)."""


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def read_row(
    seed: int, command: str, run_dir: Path, exit_code: int, wall_seconds: float, log: Path | None = None
) -> Row:
    """The row of a finished process: its summary.json if it exited 0 and wrote one, else a failed row
    (`log`: the process's log, where it is not run_dir's own: a pack's)."""
    row = Row(seed, "failed", command, exit_code=exit_code, wall_seconds=wall_seconds)
    if exit_code != 0:
        row.error = f"exit code {exit_code}: {log_tail(log or run_dir / LOG_NAME)}"
        return row
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        row.error = f"exited 0 without a readable summary.json ({error})"
        return row
    returns = [float(r) for r in summary.get("eval_returns") or []]
    row.status = "ok"
    row.train_seconds = _finite(summary.get("wall_seconds"))
    row.steps = summary.get("step")
    row.eval_return_mean = _finite(summary.get("eval_return_mean"))
    row.eval_return_min = min(returns) if returns else None
    row.eval_episodes = len(returns)
    row.best_eval_step = summary.get("best_eval_step")
    row.best_eval_return = _finite(summary.get("best_eval_return"))
    row.train_return_mean = _finite(summary.get("train_return_mean"))
    row.diverged_at_step = summary.get("diverged_at_step")
    if row.diverged_at_step is not None:
        row.status, row.error = "failed", f"diverged: frozen by its pack at step {row.diverged_at_step}"
    if summary.get("stopped_at_return"):
        row.stopped = "return reached"
    elif summary.get("stopped_by_time_limit"):
        row.stopped = "time limit"
    return row


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) if kept else "(empty log)"


@dataclass
class _Running:
    seeds: list[int]
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    started: float
    stop_sent: float | None = None


def _status_line(
    elapsed: float, out: Path, seeds: list[int], running: dict[int, _Running], rows: dict[int, Row]
) -> str:
    parts = []
    for seed in seeds:
        run_dir = out / SEED_DIR.format(seed=seed)
        if seed in rows:
            row = rows[seed]
            parts.append(f"{seed}: done" if row.status == "ok" else f"{seed}: FAILED")
        elif any(seed in item.seeds for item in running.values()):
            parts.append(f"{seed}: {_progress(run_dir)}")
        else:
            parts.append(f"{seed}: queued")
    return f"[{elapsed:6.0f} s] " + ", ".join(parts)


def _progress(run_dir: Path) -> str:
    try:
        progress = json.loads((run_dir / "progress.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "starting"
    text = f"{progress.get('step', '?')}/{progress.get('steps', '?')}"
    if progress.get("train_return_mean") is not None:
        text += f" (return {progress['train_return_mean']:.1f})"
    return text


def _child_env(threads: int | None) -> dict[str, str]:
    """Each child's BLAS/OpenMP pools sized like its torch pool, so N children do not oversubscribe the cores."""
    env = dict(os.environ)
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env.setdefault(name, str(threads))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _finished_line(row: Row) -> str:
    if row.status == "failed":
        return f"seed {row.seed} FAILED after {row.wall_seconds:.0f} s: {row.error}"
    mean = "n/a" if row.eval_return_mean is None else f"{row.eval_return_mean:.1f}"
    lowest = "n/a" if row.eval_return_min is None else f"{row.eval_return_min:.1f}"
    return f"seed {row.seed} finished in {row.wall_seconds:.0f} s: greedy return {mean} (lowest {lowest})"


def run_sweep(options: SweepOptions, log: Log, should_stop: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """Run every seed (at most options.jobs at a time), write sweep.json and sweep.md, return the document.

    `should_stop` is polled; once it is true, running seeds get SIGTERM (the trainer writes a
    checkpoint and exits 143), queued seeds never start, and both are failed rows.
    """
    if options.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {options.jobs}")
    configs = {seed: load_config(options.config, seed_overrides(seed, options.overrides)) for seed in options.seeds}
    options.out.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC)
    started = time.monotonic()
    if not 1 <= options.pack <= 64:
        raise ConfigError(f"--pack must be 1 to 64 seeds per process, got {options.pack}")
    queue = groups(options)
    running: dict[int, _Running] = {}  # by the first seed of each process's group
    rows: dict[int, Row] = {}
    last_status = started
    stopping = False
    while queue or running:
        if not stopping and should_stop():
            stopping = True
            waiting = [seed for group in queue for seed in group]
            stopped = sorted(seed for item in running.values() for seed in item.seeds)
            log(f"stopping: SIGTERM to seeds {stopped}, seeds {waiting} not started")
            for item in running.values():
                item.process.terminate()
                item.stop_sent = time.monotonic()
            for group in queue:
                for seed in group:
                    rows[seed] = Row(seed, "failed", display_command(group_argv(options, group)), error="not started")
            queue.clear()
        while queue and len(running) < options.jobs:
            group = queue.pop(0)
            argv = group_argv(options, group)
            for seed in group:
                (options.out / SEED_DIR.format(seed=seed)).mkdir(parents=True, exist_ok=True)
            log_path = options.out / SEED_DIR.format(seed=group[0]) / LOG_NAME
            if len(group) > 1 or options.pack > 1:
                log_path = options.out / f"pack-{group[0]}-{group[-1]}.log"
            handle = log_path.open("wb")
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=_child_env(configs[group[0]].run.cpu_threads),
            )
            running[group[0]] = _Running(group, argv, log_path, child, handle, time.monotonic())
            log(f"seed{'s' if len(group) > 1 else ''} {','.join(map(str, group))} started: {display_command(argv)}")
        for first, item in list(running.items()):
            code = item.process.poll()
            if code is None and item.stop_sent is not None and time.monotonic() - item.stop_sent > STOP_GRACE_SECONDS:
                item.process.kill()
                code = item.process.wait()
            if code is None:
                continue
            item.log.close()
            del running[first]
            wall = time.monotonic() - item.started
            for seed in item.seeds:
                run_dir = options.out / SEED_DIR.format(seed=seed)
                rows[seed] = read_row(seed, display_command(item.argv), run_dir, code, wall, item.log_path)
                log(_finished_line(rows[seed]))
        now = time.monotonic()
        if running and now - last_status >= options.poll_seconds:
            log(_status_line(now - started, options.out, options.seeds, running, rows))
            last_status = now
        if running:
            time.sleep(min(0.2, options.poll_seconds))
    document = build_document(options, [rows[seed] for seed in options.seeds], started_at, time.monotonic() - started)
    write_outputs(document, options.out)
    return document


def _commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def verdict(rows: list[Row], threshold: float | None) -> dict[str, Any]:
    """Per row `reached` (mean >= threshold) and the sweep's outcome: passed, below_threshold or failed."""
    failed = [row.seed for row in rows if row.status == "failed"]
    below: list[int] = []
    if threshold is not None:
        for row in rows:
            if row.status == "ok":
                row.reached = row.eval_return_mean is not None and row.eval_return_mean >= threshold
                if not row.reached:
                    below.append(row.seed)
    if failed:
        outcome, text = "failed", f"failed: seeds {failed} did not finish"
    elif below:
        outcome, text = "below_threshold", f"below threshold: seeds {below} under {threshold:g}"
    elif threshold is not None:
        outcome, text = "passed", f"passed: all {len(rows)} seeds reached {threshold:g}"
    else:
        outcome, text = "ran", f"all {len(rows)} seeds finished (no threshold)"
    if failed and below:
        text += f"; below threshold: seeds {below} under {threshold:g}"
    return {"outcome": outcome, "text": text, "failed_seeds": failed, "below_threshold_seeds": below}


def exit_code(document: dict[str, Any]) -> int:
    outcome = document["verdict"]["outcome"]
    return {"failed": EXIT_SEED_FAILED, "below_threshold": EXIT_BELOW_THRESHOLD}.get(outcome, 0)


def build_document(options: SweepOptions, rows: list[Row], started_at: datetime, seconds: float) -> dict[str, Any]:
    config = load_config(options.config, options.overrides)
    outcome = verdict(rows, options.threshold)
    return {
        "config": str(options.config),
        "env_id": config.data.env_id if config.data.source == "gym" else config.data.source,
        "overrides": list(options.overrides),
        "seeds": list(options.seeds),
        "jobs": options.jobs,
        "threshold": options.threshold,
        "steps": config.run.steps,
        "eval_episodes": config.run.eval_episodes,
        "eval_select_episodes": config.run.eval_select_episodes,
        "eval_every": config.run.eval_every,
        "started": started_at.isoformat(timespec="seconds"),
        "wall_seconds": seconds,
        "host": {
            "node": platform.node(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": options.python,
            "commit": _commit(),
        },
        "rows": [asdict(row) for row in rows],
        "verdict": outcome,
    }


def _number(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def format_markdown(document: dict[str, Any]) -> str:
    """The sweep's table: one row per seed, with the command that reproduces it, then the verdict."""
    episodes, select = document["eval_episodes"], document["eval_select_episodes"]
    host = document["host"]
    lines = [
        f"Sweep of `{document['config']}` ({document['env_id']}, {document['steps']:,} updates"
        + (f", overrides {' '.join(document['overrides'])}" if document["overrides"] else "")
        + f"), seeds {', '.join(map(str, document['seeds']))}, {document['jobs']} at a time; "
        f"started {document['started']} on {host['node']} ({host['cpus']} CPUs), commit {host['commit'] or 'unknown'}; "
        f"{document['wall_seconds']:.0f} s in all.",
        "",
        f"| seed | final greedy return, {episodes} episodes (mean, lowest) | best policy: step ({select}-episode mean) "
        "| updates | training return, last 20 episodes | wall time | command |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in document["rows"]:
        if row["status"] == "failed":
            result = f"**failed** ({row['error']})"
            best = train = updates = "n/a"
        else:
            updates = "n/a" if row["steps"] is None else f"{row['steps']:,}"
            if row.get("stopped"):
                updates += f" ({row['stopped']})"
            mark = {True: " ✓", False: " ✗", None: ""}[row["reached"]]
            result = f"{_number(row['eval_return_mean'])} (lowest {_number(row['eval_return_min'])}){mark}"
            best = (
                "off (last policy)"
                if row["best_eval_step"] is None
                else f"{row['best_eval_step']:,} ({_number(row['best_eval_return'])})"
            )
            train = _number(row["train_return_mean"])
        cells = [str(row["seed"]), result, best, updates, train, f"{row['wall_seconds']:.0f} s", f"`{row['command']}`"]
        lines.append(f"| {' | '.join(cells)} |")
    lines += ["", f"Verdict: {document['verdict']['text']}."]
    return "\n".join(lines) + "\n"


def write_outputs(document: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "sweep.md").write_text(format_markdown(document))


def install_stop_signals() -> Callable[[], bool]:
    """SIGTERM and SIGINT set a flag (read by run_sweep) instead of killing the sweep with its children astray."""
    requested: list[int] = []

    def handler(signum: int, frame: object) -> None:
        requested.append(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return lambda: bool(requested)
