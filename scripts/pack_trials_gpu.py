"""GPU check of a search's packed trials (issue 31): four trials of the default space, every one of its fields
(optim.lr, loss.cql_alpha, optim.target_tau, replay.alpha) differing between the runs, trained as one pack the
way `trainer hyperopt trial --trials 0,1,2,3` trains them (run.collect_graph=false), on each plan named.

    python3 scripts/pack_trials_gpu.py graph eager     # on a GPU machine; prints each run's summary figures

Optuna is not needed (the device image lacks it): the trials' parameters are written out here.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contracts.config import build_config
from trainer.runtime.pack_train import run_pack_training

PACKED = ["run.collect_graph=false"]  # trainer.tools.hyperopt.PACKED, which imports optuna
TRIALS = [
    {"optim.lr": 1e-4, "loss.cql_alpha": 0.1, "optim.target_tau": 0.005, "replay.alpha": 0.4},
    {"optim.lr": 3e-4, "loss.cql_alpha": 0.5, "optim.target_tau": 0.02, "replay.alpha": 0.6},
    {"optim.lr": 9e-4, "loss.cql_alpha": 0.9, "optim.target_tau": 0.04, "replay.alpha": 0.8},
    {"optim.lr": 5e-5, "loss.cql_alpha": 0.0, "optim.target_tau": 0.001, "replay.alpha": 0.3},
]


def tiny(plan: str, steps: int = 200) -> dict[str, Any]:
    """The market with narrow networks (tests/service/factories.tiny_train_config) on the GPU."""
    model = {"hidden": 16, "head_hidden": 8, "atoms": 11, "iqn_embed": 8, "iqn_hidden": 8, "iqn_taus": 4}
    model |= {"iqn_target_taus": 4, "iql_hidden": 8, "attn_window": 4, "attn_dim": 8, "attn_heads": 2, "attn_ffn": 16}
    data = {"source": "market", "learning_starts": 32, "market_features": 16, "market_horizon": 16}
    run = {"steps": steps, "batch_size": 16, "eval_episodes": 1, "device": "cuda", "plan": plan, "log_every": 100}
    return {"model": model, "replay": {"capacity": 256}, "data": data, "run": {**run, "checkpoint_every": steps}}


def main(plans: list[str]) -> None:
    for plan in plans:
        configs = [build_config(tiny(plan), [f"{k}={v}" for k, v in t.items()] + PACKED) for t in TRIALS]
        root = Path(tempfile.mkdtemp())
        reports: list[dict[str, Any]] = []
        started = time.perf_counter()
        dirs = [root / f"trial-{i}" for i in range(len(TRIALS))]
        summaries = run_pack_training(configs, dirs, lambda line: None, trials=list(range(4)), on_report=reports.append)
        figures = [(s["step"], s["diverged_at_step"], round(s["eval_return_mean"], 3), s["plan"]) for s in summaries]
        print(plan, f"{time.perf_counter() - started:.1f} s", figures)
        print(plan, "last report", json.dumps({k: reports[-1][k] for k in ("step", "plan", "runs")}))


if __name__ == "__main__":
    main(sys.argv[1:])
