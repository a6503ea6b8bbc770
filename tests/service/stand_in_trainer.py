"""A real, tiny program with the trainer's command-line and exit-code contract, for backend tests.

`python stand_in_trainer.py --config C --run-dir D [--sleep S] [--exit N] [--ignore-term] [--resume]`:
prints the breakdown line, writes progress.json, sleeps, exits N; SIGTERM exits 143 like the trainer
(unless --ignore-term, which models a job that does not stop gracefully).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_dir = Path(args.run_dir)
    config = json.loads(Path(args.config).read_text())
    steps = int(config.get("run", {}).get("steps", 1))
    print(f"stand-in: steps={steps} resume={args.resume}", flush=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    (run_dir / "checkpoints" / "last.txt").write_text(str(steps))
    progress = {
        "step": steps,
        "steps": steps,
        "plan": "eager",
        "step_ms": 1.5,
        "epoch_seconds": 3.0,
        "breakdown_ms": {"sample": 0.25, "fused": 1.0, "guard": 0.25},
        "losses": {"c51": 0.5},
        "guard_skips": 0,
    }
    (run_dir / "progress.json.tmp").write_text(json.dumps(progress))
    (run_dir / "progress.json.tmp").replace(run_dir / "progress.json")
    print("Training step breakdown: sample=0.250ms fused=1.000ms guard=0.250ms", flush=True)
    deadline = time.monotonic() + args.sleep
    while time.monotonic() < deadline:
        time.sleep(0.02)
    print(f"stand-in: done, exit {args.exit}", flush=True)
    if args.exit == 2:
        print("error: bad input for the stand-in", file=sys.stderr, flush=True)
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
