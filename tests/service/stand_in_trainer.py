"""A real, tiny program with the trainer CLI's commands, options and exit codes, for backend tests.

`python stand_in_trainer.py [KNOBS] COMMAND [OPTIONS]`, where COMMAND and OPTIONS are those the job
pipeline (contracts/pipeline.py) gives the real trainer: `resolve`, `check`, `train`, `report`, `finish`,
`hyperopt suggest|trial|best`. Every command prints `stand-in: <command> env …` (the FOXHUNT_* and
CUDA_VISIBLE_DEVICES it got), then does the least the pipeline needs: resolve copies the config to
--out as it is (the real `trainer resolve` applies the model, pool and epochs checks, which
tests/trainer/test_cli.py and the real-trainer backend tests cover), check reads that config and
writes check.json, train writes progress.json, summary.json and a checkpoint (in
FOXHUNT_CHECKPOINT_URL) and prints the breakdown line; suggest prints a JSON list of packs of trials
("0,1"); a trial (`--trials` one pack) writes each trial's objective; best writes the best trial's config.

Knobs (before COMMAND): `--sleep S` (train sleeps), `--exit N` with `--exit-in CMD` (default train:
that command exits N), `--fail-trial N` (repeatable: that trial fails; its pack exits 1 when all of its
trials failed, as the trainer's), `--pack K` (suggest packs K trials a pod; default 1), `--trials-together K` (a trial
waits until K trials have started, and fails if they never do: proves they run at once),
`--ignore-term` (SIGTERM ignored: a job that does not stop gracefully). SIGTERM otherwise exits 143
like the trainer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

BREAKDOWN = {"sample": 0.25, "fused": 1.0, "guard": 0.25}
TRIALS_TOGETHER_TIMEOUT = 30.0


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--exit-in", default="train")
    parser.add_argument("--fail-trial", type=int, action="append", default=[])
    parser.add_argument("--trials-together", type=int, default=0)
    parser.add_argument("--pack", type=int, default=1)
    parser.add_argument("--ignore-term", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)
    resolve = commands.add_parser("resolve")
    resolve.add_argument("--config", required=True)
    resolve.add_argument("--out", required=True)
    resolve.add_argument("--model", default="dqn")
    resolve.add_argument("--train-epochs", type=int, default=0)
    resolve.add_argument("--pool")
    resolve.add_argument("--pools-file")
    check = commands.add_parser("check")
    check.add_argument("--config", required=True)
    check.add_argument("--out", required=True)
    check.add_argument("--steps", type=int, default=20)
    train = commands.add_parser("train")
    train.add_argument("--config", required=True)
    train.add_argument("--run-dir", required=True)
    train.add_argument("--resume", action=argparse.BooleanOptionalAction, default=False)
    train.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    report = commands.add_parser("report")
    report.add_argument("--run-dir", required=True)
    finish = commands.add_parser("finish")
    finish.add_argument("--run", required=True)
    finish.add_argument("--status", required=True)
    finish.add_argument("--duration", default="0")
    finish.add_argument("--failures", default="null")
    hyperopt = commands.add_parser("hyperopt").add_subparsers(dest="hyperopt", required=True)
    suggest = hyperopt.add_parser("suggest")
    suggest.add_argument("--storage", required=True)
    suggest.add_argument("--study", required=True)
    suggest.add_argument("--trials", type=int, required=True)
    suggest.add_argument("--config")
    trial = hyperopt.add_parser("trial")
    trial.add_argument("--trials", required=True)
    trial.add_argument("--storage", required=True)
    trial.add_argument("--study", required=True)
    trial.add_argument("--config")
    trial.add_argument("--run-dir", required=True)
    best = hyperopt.add_parser("best")
    best.add_argument("--storage", required=True)
    best.add_argument("--study", required=True)
    best.add_argument("--out", required=True)
    best.add_argument("--config")
    return parser


def _sleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)


def _train(args: argparse.Namespace) -> None:
    run_dir = Path(args.run_dir)
    config = json.loads(Path(args.config).read_text())
    steps = int(config.get("run", {}).get("steps", 1))
    checkpoints = Path(os.environ.get("FOXHUNT_CHECKPOINT_URL") or run_dir / "checkpoints")
    resumed = args.resume and (checkpoints / "last.txt").is_file()  # as the trainer: --resume with none starts
    print(f"stand-in: steps={steps} resume={resumed} config={Path(args.config).name}", flush=True)
    checkpoints.mkdir(parents=True, exist_ok=True)
    (checkpoints / "last.txt").write_text(str(steps))
    progress = {
        "step": steps,
        "steps": steps,
        "plan": "eager",
        "step_ms": 1.5,
        "epoch_seconds": 3.0,
        "breakdown_ms": BREAKDOWN,
        "losses": {"c51": 0.5},
        "guard_skips": 0,
    }
    _write(run_dir / "progress.json", progress)
    print("Training step breakdown: sample=0.250ms fused=1.000ms guard=0.250ms", flush=True)
    _sleep(args.sleep)
    _write(run_dir / "summary.json", {**progress, "trial": config.get("stand_in_best_trial")})


def _trial(args: argparse.Namespace) -> int:
    numbers = [int(n) for n in args.trials.split(",")]
    folder = Path(args.run_dir)
    for number in numbers:
        (folder / f"trial-{number}").mkdir(parents=True, exist_ok=True)
        (folder / f"trial-{number}" / "started").touch()
    if args.trials_together:
        deadline = time.monotonic() + TRIALS_TOGETHER_TIMEOUT
        while len(list(folder.glob("trial-*/started"))) < args.trials_together:
            if time.monotonic() > deadline:
                print(f"stand-in: trials {args.trials} never saw {args.trials_together} trials at once", flush=True)
                return 1
            time.sleep(0.02)
    failed = 0
    for number in numbers:
        if number in args.fail_trial:
            print(f"stand-in: trial {number} failed", flush=True)
            failed += 1
            continue
        _write(folder / f"trial-{number}" / "summary.json", {"trial": number, "value": float(number)})
        print(f"stand-in: trial {number} value={number}", flush=True)
    return 1 if failed == len(numbers) else 0


def _best(args: argparse.Namespace) -> int:
    out = Path(args.out)
    done = [json.loads(p.read_text()) for p in sorted(out.parent.glob("trial-*/summary.json"))]
    if not done:
        print("error: the study has no completed trial", file=sys.stderr, flush=True)
        return 1
    best = max(done, key=lambda summary: float(summary["value"]))
    config = json.loads(Path(args.config).read_text()) if args.config else {}
    _write(out, {**config, "stand_in_best_trial": best["trial"]})
    print(f"stand-in: best trial {best['trial']}", flush=True)
    return 0


def main() -> int:
    args = _parser().parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    command = args.command if args.command != "hyperopt" else args.hyperopt
    env = " ".join(
        f"{key}={os.environ.get(var, '-')}"
        for key, var in (
            ("job", "FOXHUNT_JOB_ID"),
            ("pool", "FOXHUNT_POOL"),
            ("commit", "FOXHUNT_COMMIT"),
            ("attempt", "FOXHUNT_ATTEMPT"),
            ("checkpoint", "FOXHUNT_CHECKPOINT_URL"),
            ("cuda", "CUDA_VISIBLE_DEVICES"),
        )
    )
    print(f"stand-in: {command} env {env}", flush=True)
    code = 0
    if command == "resolve":
        _write(Path(args.out), json.loads(Path(args.config).read_text()))
    elif command == "check":
        json.loads(Path(args.config).read_text())  # the resolved config: resolve must have written it
        _write(Path(args.out) / "check.json", {"ok": True})
    elif command == "train":
        _train(args)
    elif command == "report":
        summary = json.loads((Path(args.run_dir) / "summary.json").read_text())
        print("Training step breakdown: sample=0.250ms fused=1.000ms guard=0.250ms", flush=True)
        print(json.dumps(summary), flush=True)
    elif command == "finish":
        record = {
            "status": args.status,
            "duration_seconds": float(args.duration),
            "failures": json.loads(args.failures),
        }
        _write(Path(args.run) / "status.json", record)
        print(json.dumps(record), flush=True)
    elif command == "suggest":
        numbers = [str(n) for n in range(args.trials)]
        print(json.dumps([",".join(numbers[i : i + args.pack]) for i in range(0, len(numbers), args.pack)]), flush=True)
    elif command == "trial":
        code = _trial(args)
    elif command == "best":
        code = _best(args)
    if args.exit_in == command:
        print(f"stand-in: done, exit {args.exit}", flush=True)
        if args.exit == 2:
            print("error: bad input for the stand-in", file=sys.stderr, flush=True)
        return args.exit
    return code


if __name__ == "__main__":
    sys.exit(main())
