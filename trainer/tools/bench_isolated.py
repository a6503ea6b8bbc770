"""`trainer bench --isolate` and `--ab A,B`: every timed method in a fresh process, and A/B comparisons.

Figures of one method moved by ~10% between device calls while each call was tight (issue 14), so
two versions are compared only within one call, and one method's figure must not depend on what ran
before it in the same process (allocator state, cuBLAS handles, Dynamo caches, clocks).

- `--isolate`: each (preset, method) is a child `python -m trainer bench` run with only that
  method; the parent collects the children's rows into one document and table.
- `--ab A,B`: the same children, for two sources, alternating A B A B … for `--rounds` rounds. A
  source is a folder holding a `trainer/` package (`.` is the working tree) or a git revision, which
  is exported with `git archive` where `.git` is at hand (on a machine without the repository's
  history, export it first: `git archive REV trainer | tar -x -C ab/REV`, and pass `ab/REV`). Each
  child runs the source's own bench CLI with options every version has had (`--configs`, methods, sizes,
  `-o`), so a revision from before this module still runs. The table gives each round's ms/step and
  the ratio of B's median to A's per preset and method.

Children inherit the environment (Inductor's and Triton's on-disk caches included, so a later child
compiles faster than the first); their stderr lines are forwarded.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.tools.bench import TIMED_WITH_TIMER_OFF, BenchOptions, Result, environment, split_method

REPO = Path(__file__).resolve().parents[2]
RESULT_FIELDS = frozenset(Result.__dataclass_fields__)


@dataclass(frozen=True)
class Source:
    label: str  # as given on the command line
    root: Path  # a folder holding the `trainer` package


def resolve_source(spec: str, scratch: Path, repo: Path = REPO) -> Source:
    """`spec` as a source tree: a folder holding trainer/, or a git revision exported under `scratch`."""
    folder = Path(spec)
    if (folder / "trainer" / "__main__.py").is_file():
        return Source(spec, folder.resolve())
    if shutil.which("git") is None or not (repo / ".git").exists():
        raise ValueError(
            f"--ab {spec!r}: no folder holding trainer/ there, and no git repository here to resolve a revision "
            f"(export one first: git archive REV trainer | tar -x -C DIR)"
        )
    found = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise ValueError(f"--ab {spec!r} is neither a folder holding trainer/ nor a git revision of {repo}")
    commit = found.stdout.strip()
    root = scratch / commit[:12]
    if not root.exists():
        git = ["git", "-C", str(repo), "archive", commit, "trainer"]
        archive = subprocess.run(git, capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(root, filter="data")
    return Source(spec, root)


def child_command(options: BenchOptions, preset: str, method: str, out: Path, device: str, timer: bool) -> list[str]:
    """`python -m trainer bench` for one method in one preset, with options every version knows."""
    command = [
        sys.executable,
        "-m",
        "trainer",
        "bench",
        "--configs",
        preset,
        "--methods",
        method,
        "--batch-size",
        str(options.batch_size),
        "--capacity",
        str(options.capacity),
        "--obs-dim",
        str(options.obs_dim),
        "--steps",
        str(options.steps),
        "--repeats",
        str(options.repeats),
        "--warmup",
        str(options.warmup),
        "--steps-per-replay",
        str(options.steps_per_replay),
        "--timer-overhead" if timer else "--no-timer-overhead",
        "--device",
        device,
        "--out",
        str(out),
    ]
    for override in options.overrides:
        command += ["-o", override]
    return command


def run_child(command: list[str], root: Path, log: Callable[[str], None]) -> tuple[dict[str, Any] | None, str]:
    """Run one child in `root` (its `trainer` first on the path); its document, or None and why not."""
    path = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = Path(command[command.index("--out") + 1])
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    for line in done.stderr.splitlines():
        if line.startswith("["):  # the bench's progress lines; warnings and tracebacks stay in `why`
            log(f"  {line}")
    if done.returncode != 0 or not (out / "bench.json").is_file():
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or ["no output"]
        return None, f"child exited {done.returncode}: {tail[0][:240]}"
    return json.loads((out / "bench.json").read_text()), ""


def run_isolated(
    options: BenchOptions,
    device: str,
    log: Callable[[str], None] = print,
    sources: list[str] | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """Every (preset, method) in its own process; with `sources`, each source in turn per round."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    results: list[dict[str, Any]] = []
    overhead: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="foxhunt-bench-") as tmp:
        scratch = Path(tmp)
        trees = [resolve_source(spec, scratch / "sources") for spec in sources] if sources else [Source(".", REPO)]
        jobs = itertools.product(range(rounds), trees, options.configs, options.methods)
        for n, (round_, source, preset, method) in enumerate(jobs):
            tag = {"source": source.label, "round": round_} if sources else {}
            if f"{preset}:{method}" in options.skip:
                results.append({**asdict(Result(preset, method, error="skipped (--skip)")), **tag})
                continue
            timer = (
                options.timer_overhead
                and sources is None
                and preset == options.configs[0]
                and split_method(method)[0] in TIMED_WITH_TIMER_OFF
            )
            log(f"[{preset}] {method} ({source.label}, round {round_ + 1}/{rounds}): fresh process")
            command = child_command(options, preset, method, scratch / f"run{n}", device, timer)
            document, why = run_child(command, source.root, log)
            if document is None:
                results.append({**asdict(Result(preset, method, error=why)), **tag})
                continue
            for row in document["results"]:
                kept = {key: value for key, value in row.items() if key in RESULT_FIELDS}
                results.append({**asdict(Result(preset, method)), **kept, **tag})
            overhead.extend(document.get("timer_overhead", []))
    _speedups(results)
    return {
        "environment": {**environment(torch.device(device)), "isolated": True},
        "options": asdict(options),
        "results": results,
        "timer_overhead": overhead,
        "train": [],
        "ab": {"sources": sources, "rounds": rounds} if sources else None,
    }


def _speedups(results: list[dict[str, Any]]) -> None:
    """Speed-up over eager within the same source, round and preset."""
    eager = {
        (r.get("source"), r.get("round"), r["config"]): r["ms_median"]
        for r in results
        if r["method"] == "eager" and r["ms_median"]
    }
    for r in results:
        base = eager.get((r.get("source"), r.get("round"), r["config"]))
        r["speedup"] = base / r["ms_median"] if base and r["ms_median"] else None


def format_ab_table(document: dict[str, Any]) -> str:
    """Each preset and method: every round's ms/step per source, their medians, and B / A."""
    ab = document.get("ab")
    if not ab:
        return ""
    first, second = ab["sources"]
    lines = [f"{'preset':<6} {'method':<14} {'source':<20} {'ms/step per round':<32} {'median':>8} {'B/A':>7}"]
    for preset, method in dict.fromkeys((r["config"], r["method"]) for r in document["results"]):
        medians: dict[str, float] = {}
        for source in (first, second):
            key = (preset, method, source)
            rows = [r for r in document["results"] if (r["config"], r["method"], r["source"]) == key]
            figures = [r["ms_median"] for r in sorted(rows, key=lambda r: r["round"]) if r["ms_median"]]
            head = f"{preset:<6} {method:<14} {source:<20}"
            if not figures:
                errors = sorted({r["error"] for r in rows if r["error"]})
                lines.append(f"{head} failed: {'; '.join(errors)}")
                continue
            medians[source] = statistics.median(figures)
            ratio = f"{medians[second] / medians[first]:.3f}" if source == second and first in medians else ""
            per_round = " ".join(f"{ms:.3f}" for ms in figures)
            lines.append(f"{head} {per_round:<32} {medians[source]:>8.3f} {ratio:>7}")
    return "\n".join(lines)
