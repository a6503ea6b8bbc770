"""Builders for service tests: settings, configs, pools files, tokens, jobs, a live uvicorn server."""

from __future__ import annotations

import errno
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from service.domain import JobSpec, Placement
from service.settings import Settings
from tests.polling import wait_until
from tests.ports import free_port

STAND_IN = Path(__file__).with_name("stand_in_trainer.py")


def stand_in_command(*knobs: str) -> list[str]:
    """The local backend's trainer program: a real tiny program instead of the trainer (knobs: its docstring)."""
    return [sys.executable, str(STAND_IN), *knobs]


def faulting_popen(errnos: list[int]) -> tuple[list[list[str]], Callable[..., subprocess.Popen[Any]]]:
    """A `subprocess.Popen` that raises OSError with each of `errnos` in turn, then starts the process; and its
    calls' argv (patch it in for `subprocess.Popen`)."""
    real, calls = subprocess.Popen, []

    def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        calls.append(list(argv))
        if len(calls) <= len(errnos):
            code = errnos[len(calls) - 1]
            raise OSError(code, f"{errno.errorcode[code]} (injected)")
        return real(argv, **kwargs)

    return calls, popen


def tiny_train_config(steps: int = 3) -> dict[str, Any]:
    """A TrainConfig small enough to train on a CPU in seconds (market data, narrow networks)."""
    return {
        "model": {
            "hidden": 16,
            "head_hidden": 8,
            "atoms": 11,
            "iqn_embed": 8,
            "iqn_hidden": 8,
            "iqn_taus": 4,
            "iqn_target_taus": 4,
            "iql_hidden": 8,
            "attn_window": 4,
            "attn_dim": 8,
            "attn_heads": 2,
            "attn_ffn": 16,
        },
        "replay": {"capacity": 256},
        "data": {"source": "market", "learning_starts": 32, "market_features": 16, "market_horizon": 16},
        "run": {
            "steps": steps,
            "batch_size": 16,
            "device": "cpu",
            "log_every": 1,
            "checkpoint_every": steps,
            "eval_episodes": 1,
        },
    }


POOLS_YAML = """\
pools:
  - name: cpu
    gpu_type: cpu
    gpus_per_node: 1
    default_quota_gpus: 100
  - name: h200
    gpu_type: H200
    gpus_per_node: 8
    node_selector: {foxhunt.io/pool: h200}
    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
    queue_name: foxhunt-h200
    quota_gpus: {team-a: 8}
    default_quota_gpus: 0
"""


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings for one test: its own SQLite file, jobs dir and pools file; nothing from the environment."""
    pools = tmp_path / "pools.yaml"
    if not pools.exists():
        pools.write_text(POOLS_YAML)
    fields: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp_path / 'foxhunt.db'}",
        "jobs_dir": tmp_path / "jobs",
        "pools_file": pools,
        "local_command": stand_in_command(),
        "local_gpus": 0,
        "reconcile_interval_seconds": 0.2,
        "cancel_grace_seconds": 2.0,
        "auth_disabled": False,
    }
    fields.update(overrides)
    return Settings(_env_file=None, **fields)  # type: ignore[call-arg]


@contextmanager
def live_server(app: FastAPI, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` with uvicorn on a free port of `host` in a thread; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        if not thread.is_alive():
            raise RuntimeError("uvicorn exited before it started serving")
        return bool(server.started)

    wait_until(started, timeout=30, interval=0.02, what="uvicorn to start")
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


H100_PLACEMENT = Placement(
    node_selector={"foxhunt.io/pool": "h100"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    gpus=8,
)


def job_spec(job_id: str = "job-1", **overrides: object) -> JobSpec:
    """A valid job as the API builds it."""
    fields: dict[str, object] = {
        "job_id": job_id,
        "tenant": "acme",
        "pool": "h100",
        "queue_name": "h100-acme",
        "placement": H100_PLACEMENT,
        "plan": "graph",
        "model": "c51",
        "commit_sha": "0123abcd",
        "epochs": 3,
        "hyperopt_trials": 0,
        "config": {"run": {"steps": 100}, "lr": 0.001},
    }
    return JobSpec.model_validate({**fields, **overrides})
