"""A recipe trained as one pack of K seeds beside its solo run(s) (issue 31's real-training target), one command:

    python3 scripts/pack_recipes.py --out /tmp/foxhunt-out            # on a GPU machine, from the repo root

trains examples/cartpole.yaml (batch 128, one env, one env step per update, `--steps` updates: the recipe's
30,000 by default) as ONE pack of `--pack` seeds (16: seeds 1..16) on cuda, then the solo run of each
`--solo-seeds` seed (1) on cuda with the same plan (`--plan`, graph: the pack runs the packed graph), then the
recipe's own CPU solo run (its eager plan, one thread, `--cpu-steps` updates, 2,000: for its rate only, not its
return; 0 skips it). Every run evaluates as the recipe says (10 selection episodes every 2,000 updates, 20 final
greedy episodes from the best policy); run.stop_at_return is off for all, so each makes all its updates and the
rates compare equal work. Each row's training loop stops at `--max-seconds` (220) if it has not finished: such a
row says "time limit" beside the updates it made, its rate stands, its returns are a shortened run's.

Printed, and written to OUT/pack_recipes.json after each row (with device, torch, commit and command): per row the
aggregate updates/s (every run's updates over the training loop's wall time, which counts collection, updates and
periodic evaluation, not the build, warm-up fill or graph capture), the speed-up over the mean rate of the cuda
solo rows (`--solo-seeds 1,2`: two solo runs, a steadier denominator than one),
each seed's final greedy mean return over the recipe's 20 evaluation episodes, and how many reached `--threshold`
(475), or with `--margin M` each seed's margin over the heuristic (the market's bar, 1.0) and how many reached M.
The pack row runs with run.collect_graph off: the pack captures its runs' collection itself
(`trainer.execution.pack_collect`). Each row's runs (config, progress, summary) stay in OUT/runs/<row>/, and each
row prints its breakdown (ms per update; a pack's per pack update).

`--vary optim.lr=6.3e-4,3e-4` tunes in the same pack: seeds 1..K for each value of a packable field
(`contracts/packs.PACKABLE`), K x values runs in one process, one row per value (the rows share the loop's wall
time; each counts its own runs' updates).

`--inductor combo_kernels=true` holds an Inductor setting for every row: a probe of how the compiled pack builds
under settings its plan does not choose (`-o run.combo_kernels=true` is the plan's own choice of them:
`trainer.execution.pack.PACK_COMBO_OPTIONS`; docs/benchmarks/README.md, packs rounds 7 and 10). The JSON records
the settings.

Time, measured on an H100 (2026-12-06, `bash scripts/gpu_check.sh packtrain`, docs/benchmarks/pack5/): CartPole's
pack of 16 trained its 30,000 updates a run in 107 s (fused) or was cut at 150 s (graph), its solo run 47-74 s;
the market (`--config examples/market.yaml --margin 1.0 --cpu-steps 0`) 11-23 s and 4-10 s. A call of two rows
with the GPU tests took 3-10 minutes. On a CPU, tiny settings run it in seconds (`tests/scripts/test_pack_recipes.py`).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch._inductor import config as inductor_config

from contracts.config import TrainConfig, load_config
from contracts.jsonfile import write_json_atomic
from trainer.runtime.pack_train import run_pack_training
from trainer.runtime.train import run_training

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "cartpole.yaml"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder for pack_recipes.json and runs/.")
    parser.add_argument("--config", type=Path, default=RECIPE, help="The recipe (default examples/cartpole.yaml).")
    parser.add_argument("--pack", type=int, default=16, help="K: seeds 1..K trained as one pack.")
    parser.add_argument("--solo-seeds", default="1", help="Seeds trained solo on --device, comma-separated.")
    parser.add_argument("--steps", type=int, default=None, help="Updates of every row (default: the recipe's).")
    parser.add_argument("--cpu-steps", type=int, default=2000, help="The CPU solo run's updates (0: none).")
    parser.add_argument("--device", default="cuda", help="Where the pack and the solo runs train.")
    parser.add_argument("--plan", default="graph", help="The solo runs' plan; the pack runs the pack plan nearest it.")
    parser.add_argument("--threshold", type=float, default=475.0, help="Final greedy mean return a seed must reach.")
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        help="Score by the margin over the heuristic instead (the market: 1.0), which a seed must reach.",
    )
    parser.add_argument(
        "--max-seconds", type=float, default=220.0, help="run.max_seconds of each row's training loop (0: none)."
    )
    parser.add_argument("-o", "--override", action="append", default=[], help="Dotted override for every row.")
    parser.add_argument(
        "--vary",
        default=None,
        metavar="FIELD=V1,V2,...",
        help="Tune in one pack: seeds 1..K for each value of this packable field (contracts/packs.py), K x values "
        "runs; the pack's rows are then its values, each with its own seeds' returns and its share of the updates.",
    )
    parser.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="An Inductor setting (torch._inductor.config) held for every row, e.g. combo_kernels=true: a probe of "
        "how the compiled pack builds under settings its plan does not choose.",
    )
    args = parser.parse_args(argv)
    try:
        args.inductor = dict(inductor_setting(item) for item in args.inductor)
    except ValueError as error:
        parser.error(str(error))
    if args.vary is not None:
        field, _, values = args.vary.partition("=")
        if not field or not values:
            parser.error(f"--vary wants FIELD=V1,V2,... (got {args.vary!r})")
        args.vary = (field, values.split(","))
    return args


def inductor_setting(item: str) -> tuple[str, Any]:
    """Parse "combo_kernels=true" as ("combo_kernels", True): the value as the setting's own type."""
    name, _, text = item.partition("=")
    if not text or not hasattr(inductor_config, name):
        raise ValueError(f"--inductor wants SETTING=VALUE with one of torch._inductor.config's settings (got {item!r})")
    current = getattr(inductor_config, name)
    if isinstance(current, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--inductor {name} is true or false (got {text!r})")
        return name, text.lower() in ("true", "1")
    return name, type(current)(text) if isinstance(current, (int, float)) else text


def recipe(
    args: argparse.Namespace,
    seed: int,
    device: str,
    plan: str | None,
    steps: int | None,
    pack: bool = False,
    extra: Sequence[str] = (),
) -> TrainConfig:
    """The recipe for `seed` on `device` with `plan` (None: the recipe's), every update made (no early stop),
    `extra` overrides last."""
    overrides = [f"run.seed={seed}", f"run.device={device}", "run.stop_at_return=null"]
    overrides += ["run.collect_graph=false"] if pack else []
    overrides += [f"run.plan={plan}"] if plan is not None else []
    overrides += [f"run.steps={steps}"] if steps is not None else []
    overrides += [f"run.max_seconds={args.max_seconds:g}"] if args.max_seconds > 0 else []
    return load_config(args.config, [*overrides, *args.override, *extra])


def bar(args: argparse.Namespace) -> tuple[str, float]:
    """What a seed is scored by (a summary's key) and the value it must reach."""
    if args.margin is not None:
        return "margin_over_heuristic", args.margin
    return "eval_return_mean", args.threshold


def row(
    name: str, summaries: list[dict[str, Any]], setup_s: float, args: argparse.Namespace, scored: bool
) -> dict[str, Any]:
    """One table row from its runs' summaries: wall is the training loop's (every run of a pack shares it)."""
    wall = max(s["wall_seconds"] for s in summaries)
    updates = sum(s["step"] for s in summaries)
    returns = [s["eval_return_mean"] for s in summaries] if scored else []
    key, threshold = bar(args)
    scores = [s.get(key) for s in summaries] if scored else []
    return {
        "row": name,
        "runs": len(summaries),
        "seeds": [s["seed"] for s in summaries],
        "updates": updates,
        "loop_seconds": wall,
        "eval_seconds": max(s["eval_seconds"] for s in summaries),  # of the loop's: periodic evaluation
        "total_seconds": setup_s,
        "updates_per_s": updates / wall,
        "plan": summaries[0].get("plan"),
        "device": summaries[0].get("device"),
        "eval_return_mean": returns,
        "scores": scores,
        "reached": sum(1 for r in scores if r is not None and r >= threshold) if scored else None,
        "diverged": [s["seed"] for s in summaries if s.get("diverged_at_step") is not None],
        "time_limit": any(s.get("stopped_by_time_limit") for s in summaries),
        "breakdown_ms": summaries[0].get("breakdown_ms"),  # per update of the last report window (a pack's: shared)
    }


def quiet(prefix: str) -> Callable[[str], None]:
    """Progress lines on stderr: evaluations and final results only (the rest goes to each run's files)."""

    def out(line: str) -> None:
        if "evaluation" in line or "diverged" in line or "collect one by one" in line:
            print(f"{prefix} {line}", file=sys.stderr, flush=True)

    return out


def train_pack(args: argparse.Namespace, runs: Path) -> list[dict[str, Any]]:
    """The pack's row, or with `--vary` one row per value (seeds 1..K each, all trained as one pack)."""
    seeds = list(range(1, args.pack + 1))
    field, values = args.vary or (None, [None])
    # A pack collects through its runs' own objects: the torch market's captured collection is the solo runs' only.
    configs, folders = [], []
    for value in values:
        extra, folder = ([], runs) if field is None else ([f"{field}={value}"], runs / f"{field}={value}")
        configs += [recipe(args, seed, args.device, args.plan, args.steps, True, extra) for seed in seeds]
        folders += [folder / f"seed-{seed}" for seed in seeds]
    started = time.perf_counter()
    summaries = run_pack_training(configs, folders, out=quiet(f"[pack K={len(configs)}]"))
    setup_s = time.perf_counter() - started
    for index, summary in enumerate(summaries):
        summary["seed"] = seeds[index % len(seeds)]
    name = f"pack K={len(configs)} {args.device}"
    if field is None:
        return [row(name, summaries, setup_s, args, True)]
    chunks = [summaries[i : i + len(seeds)] for i in range(0, len(summaries), len(seeds))]
    return [row(f"{name} {field}={v}", chunk, setup_s, args, True) for v, chunk in zip(values, chunks, strict=True)]


def train_solo(
    args: argparse.Namespace, seed: int, device: str, plan: str | None, steps: int | None, runs: Path
) -> dict[str, Any]:
    """One solo run as `trainer train` runs it; scored unless shortened (the CPU row: its rate only)."""
    config = recipe(args, seed, device, plan, steps)
    started = time.perf_counter()
    summary = run_training(config, runs / f"seed-{seed}", show_progress=False, out=quiet(f"[solo {device} {seed}]"))
    summary["seed"] = seed
    scored = steps == args.steps
    return row(f"solo {device} seed {seed}", [summary], time.perf_counter() - started, args, scored)


def table(rows: list[dict[str, Any]], goal: str) -> str:
    """The rows as Markdown: the loop's seconds and those of its periodic evaluations, updates/s, speed-up over
    the mean rate of the solo runs on the pack's device (the `baseline` rows: one solo run's rate moved by up to a
    fifth between calls, packs round 12), returns (and the scores, where a seed is scored by something else);
    `goal` names what a seed must reach."""
    baselines = [r["updates_per_s"] for r in rows if r.get("baseline")]
    base = statistics.fmean(baselines) if baselines else None
    by_return = all(r.get("scores", r["eval_return_mean"]) == r["eval_return_mean"] for r in rows)
    scores = "" if by_return else " scores |"
    lines = [
        f"| row | plan | updates | loop s | of it evaluating | updates/s | speed-up | reached {goal} "
        f"| final greedy mean returns |{scores}",
        "|---|---|---|---|---|---|---|---|---|" + ("" if by_return else "---|"),
    ]
    for r in rows:
        speedup = f"{r['updates_per_s'] / base:.2f}x" if base is not None else "-"
        reached = "-" if r["reached"] is None else f"{r['reached']}/{r['runs']}"
        returns = " ".join("-" if v is None else f"{v:.1f}" for v in r["eval_return_mean"]) or "(rate only)"
        updates = f"{r['updates']}" + (" (time limit)" if r["time_limit"] else "")
        line = (
            f"| {r['row']} | {r['plan']} | {updates} | {r['loop_seconds']:.1f} | {r['eval_seconds']:.1f} "
            f"| {r['updates_per_s']:.1f} "
            f"| {speedup} | {reached} | {returns} |"
        )
        if not by_return:
            line += " " + (" ".join("-" if v is None else f"{v:+.2f}" for v in r.get("scores", [])) or "-") + " |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def commit() -> str | None:
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return found.stdout.strip()


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Train the rows, print the table, write OUT/pack_recipes.json (after each row, so a cut-off run keeps some)."""
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.device(args.device).type == "cuda"
    document: dict[str, Any] = {
        "recipe": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
        "command": " ".join(["python3", "scripts/pack_recipes.py", *argv]),
        "device": torch.cuda.get_device_name() if cuda and torch.cuda.is_available() else platform.processor(),
        "torch": torch.__version__,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "threshold": args.threshold,
        "margin": args.margin,
        "rows": [],
    }
    path = args.out / "pack_recipes.json"
    runs = args.out / "runs"

    def done(result: dict[str, Any]) -> None:
        document["rows"].append(result)
        write_json_atomic(path, document, indent=2)
        rate = f"{result['updates_per_s']:.1f} updates/s over {result['loop_seconds']:.1f} s"
        parts = " ".join(f"{name} {ms:.3f}" for name, ms in (result["breakdown_ms"] or {}).items())
        print(f"{result['row']}: {rate}; ms per update (a pack's: per pack update): {parts}", flush=True)

    document["inductor"] = args.inductor
    with warnings.catch_warnings(), inductor_config.patch(args.inductor):
        warnings.filterwarnings("ignore", message=".*batching rule.*")
        for result in train_pack(args, runs / "pack"):
            done(result)
        for seed in (int(s) for s in args.solo_seeds.split(",") if s):
            solo = train_solo(args, seed, args.device, args.plan, args.steps, runs / f"solo-{args.device}")
            done({**solo, "baseline": True})  # the speed-up's denominator
        if args.cpu_steps:
            done(train_solo(args, 1, "cpu", None, args.cpu_steps, runs / "solo-cpu"))
    goal = f"margin {args.margin:g}" if args.margin is not None else f"{args.threshold:g}"
    document["table"] = table(document["rows"], goal)
    write_json_atomic(path, document, indent=2)
    print(document["table"], end="")
    return document


if __name__ == "__main__":
    main(sys.argv[1:])
