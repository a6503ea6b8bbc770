"""Fixtures for the monitoring tests: the component's files, and a real Prometheus + Pushgateway.

Prometheus (Debian's `prometheus`) and the Pushgateway (`prometheus-pushgateway`) are installed if
missing and started on free ports with temporary storage. Everything they hold comes from real
`python -m trainer` processes on the CPU, tiny widths, market data:

- two scraped trainers of pool `test-pool`, alive until the session ends (SIGTERM: they checkpoint
  and exit 143): `job-full` (eager, every component on) and `job-epoch` (requests the `graph`
  plan, which falls back to eager on a CPU; C51 and the causal probe only, so it completes an
  epoch of 2000 steps within a minute);
- one short job of pool `push-pool` that trains exactly one epoch and pushes its final snapshot
  (FOXHUNT_PUSHGATEWAY_URL), as short jobs do;
- one `python -m trainer bench` run whose per-plan step times go to the Pushgateway through
  `trainer.runtime.metrics.export_bench` (only `eager` runs on a CPU: other plans would fall back to it).

Trainers run with one intra-op thread: at these widths, two threads on a shared 2-core machine make
each step 5x slower. Every wait polls an event with a deadline; nothing sleeps blindly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import stop_process
from tests.system_packages import ensure_debian_packages
from trainer.runtime.metrics import push_bench

if TYPE_CHECKING:
    from contracts.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "k8s" / "components" / "monitoring"
DASHBOARDS = sorted((COMPONENT / "dashboards").glob("*.json"))

SCRAPED_POOL = "test-pool"
FULL_JOB = "job-full"
EPOCH_JOB = "job-epoch"
SCRAPED_JOBS = (FULL_JOB, EPOCH_JOB)
PUSHED_POOL = "push-pool"
PUSHED_JOB = "push-epoch"
BENCH_JOB_ID = "bench-cpu"
BENCH_CONFIGS = ("core", "full")

UNTIL_TERMINATED = 1_000_000
"""`run.steps` of the scraped trainers: far more than a test lasts; the session terminates them."""
STARTUP_TIMEOUT = 180.0
"""Seconds for a trainer to import torch, fill its replay and serve, on a loaded 2-core machine."""
EPOCH_TIMEOUT = 300.0
"""Seconds for a lean trainer to complete its 2000-step epoch (about 40 s on a loaded 2-core machine)."""

SERVING = re.compile(r"serving metrics on :(\d+)/metrics")


SERVER_NOT_UP = (httpx.HTTPError, OSError)
"""What asking a server that is still starting raises: a wait goes on through these."""


def prometheus_rule_groups() -> list[dict[str, Any]]:
    """The rule groups of the component's PrometheusRule, as a Prometheus rule file's `groups`."""
    rule = yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text())
    return rule["spec"]["groups"]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[str]
    log: Path

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after `timeout` seconds; returns the exit status."""
        return stop_process(self.popen, timeout)

    def tail(self) -> str:
        return self.log.read_text()[-2000:] if self.log.exists() else ""

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            pytest.fail(f"{self.name} exited with {self.popen.returncode}: {self.tail()}")

    def wait_exit(self, timeout: float) -> int:
        """The exit status, once the process has ended by itself."""
        wait_until(lambda: self.popen.poll() is not None, timeout, 0.25, what=f"{self.name} to finish")
        return self.popen.returncode


def start(name: str, args: list[str], workdir: Path, env: dict[str, str] | None = None) -> Process:
    """Run `args` with its output in workdir/<name>.log; with `env`, a trainer, from the repository root."""
    log = workdir / f"{name}.log"
    cwd = ROOT if env is not None else workdir
    popen = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
    return Process(name, popen, log)


def trainer_env(**foxhunt: str) -> dict[str, str]:
    """The environment of a trainer process: the caller's FOXHUNT_* variables only, one torch thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOXHUNT_")}
    return {**env, **foxhunt, "FOXHUNT_COMMIT": "test", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def full_config() -> TrainConfig:
    """Every component on at tiny widths, so the breakdown, losses and causal panels get every series."""
    from tests.factories import tiny_config

    return tiny_config(
        run={"steps": UNTIL_TERMINATED, "log_every": 20, "checkpoint_every": UNTIL_TERMINATED, "eval_episodes": 0}
    )


def epoch_config(steps: int) -> TrainConfig:
    """C51 and the causal probe only: 2000 steps (one epoch) fit in under a minute on a shared CPU."""
    from tests.factories import tiny_config

    return tiny_config(
        model={"ensemble_heads": 0},
        loss={"cql": False, "iqn": False, "iql": False, "attention": False, "vaccine": False},
        optim={"spectral_norm": False},
        replay={"her": False},
        run={"steps": steps, "log_every": 100, "checkpoint_every": UNTIL_TERMINATED, "eval_episodes": 0},
    )


def start_trainer(
    job_id: str, config: TrainConfig, workdir: Path, env: dict[str, str], overrides: tuple[str, ...] = ()
) -> Process:
    """`python -m trainer train` on `config` (written to a file, as a workflow passes it)."""
    from contracts.config import dump_config

    path = workdir / f"{job_id}.json"
    dump_config(config, path)
    args = [sys.executable, "-m", "trainer", "train", "--config", str(path), "--run-dir", str(workdir / job_id)]
    args += ["--no-progress", *(arg for override in overrides for arg in ("-o", override))]
    return start(job_id, args, workdir, env)


def metrics_port(trainer: Process) -> int:
    """The port a trainer reports once it serves /metrics (`serving metrics on :PORT/metrics`)."""

    def served() -> re.Match[str] | None:
        trainer.check_alive()
        return SERVING.search(trainer.log.read_text())

    return int(wait_until(served, STARTUP_TIMEOUT, 0.25, what=f"{trainer.name} to serve /metrics")[1])


def bench_args(out: Path) -> list[str]:
    """A real benchmark at tiny widths on the CPU: eager in both configurations (the only plan a CPU runs)."""
    from tests.factories import TINY_MODEL

    sizes = ["--batch-size", "16", "--capacity", "400", "--obs-dim", "16", "--steps", "10", "--repeats", "3"]
    args = [sys.executable, "-m", "trainer", "bench", "--device", "cpu", "--configs", ",".join(BENCH_CONFIGS)]
    args += ["--methods", "eager", *sizes, "--warmup", "2", "--no-timer-overhead", "--out", str(out)]
    return args + [arg for key, value in TINY_MODEL.items() for arg in ("-o", f"model.{key}={value}")]


@dataclass
class PromStack:
    """A running Prometheus, the Pushgateway it scrapes, and the trainers behind both."""

    url: str
    pushgateway_url: str
    workdir: Path
    trainers: dict[str, Process] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)

    def query(self, expr: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query failed ({response.status_code}): {body.get('error')}\n{expr}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        params = {"query": expr, "start": start, "end": end, "step": step}
        response = httpx.get(f"{self.url}/api/v1/query_range", params=params, timeout=10)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"range query failed ({response.status_code}): {body.get('error')}\n{expr}")
        return body["data"]

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its evaluation state (`health`, `lastError`), from /api/v1/rules."""
        body = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()
        assert body.get("status") == "success", body
        return [rule for group in body["data"]["groups"] for rule in group["rules"]]

    def label_values(self, label: str, match: str) -> list[str]:
        response = httpx.get(f"{self.url}/api/v1/label/{label}/values", params={"match[]": match}, timeout=10)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"label values failed ({response.status_code}): {body.get('error')}\n{match}")
        return list(body["data"])


def install_prometheus() -> dict[str, str]:
    """The paths of prometheus, the Pushgateway and promtool, installed with apt-get if missing."""
    return {
        "prometheus": ensure_debian_packages("prometheus", "prometheus"),
        "pushgateway": ensure_debian_packages("prometheus-pushgateway", "prometheus-pushgateway"),
        "promtool": ensure_debian_packages("promtool", "prometheus"),
    }


@pytest.fixture(scope="session")
def prometheus_binaries() -> dict[str, str]:
    return install_prometheus()


def _prometheus_config(workdir: Path, targets: list[str], pushgateway: str) -> Path:
    # The PrometheusRule's groups, evaluated every second here so the test need not wait 30 s.
    groups = [{**group, "interval": "1s"} for group in prometheus_rule_groups()]
    (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            # The job name the PodMonitor gives trainer pods (jobLabel app.kubernetes.io/name).
            {"job_name": "foxhunt-trainer", "static_configs": [{"targets": targets}]},
            {"job_name": "pushgateway", "honor_labels": True, "static_configs": [{"targets": [pushgateway]}]},
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def running_stack(binaries: dict[str, str], workdir: Path) -> Iterator[PromStack]:
    """Start the Pushgateway, the trainers, a benchmark and Prometheus in `workdir`; stop them all after.

    Every port comes from tests/ports.py and every file lives in `workdir`, so pytest-xdist workers
    can each run a stack of their own.
    """
    from contracts.config import STEPS_PER_EPOCH
    from trainer.runtime.train import EXIT_TERMINATED  # what a trainer exits with after SIGTERM (it checkpoints first)

    processes: list[Process] = []
    stack: PromStack | None = None
    try:
        pgw_port = free_port()
        pushgateway = start(
            "pushgateway",
            [
                binaries["pushgateway"],
                f"--web.listen-address=127.0.0.1:{pgw_port}",
                # Debian's build persists to /var/lib/prometheus/pushgateway.data by default: every
                # session would load the groups earlier sessions pushed. Keep this one in memory.
                "--persistence.file=",
            ],
            workdir,
        )
        processes.append(pushgateway)
        pushgateway_url = f"http://127.0.0.1:{pgw_port}"

        # The epoch-length runs are the slowest part: start them first.
        pushed = start_trainer(
            PUSHED_JOB, epoch_config(STEPS_PER_EPOCH), workdir,
            trainer_env(FOXHUNT_JOB_ID=PUSHED_JOB, FOXHUNT_POOL=PUSHED_POOL, FOXHUNT_PUSHGATEWAY_URL=pushgateway_url),
        )  # fmt: skip
        serve = ("run.metrics_port=0",)
        epoch = start_trainer(
            EPOCH_JOB, epoch_config(UNTIL_TERMINATED), workdir,
            trainer_env(FOXHUNT_JOB_ID=EPOCH_JOB, FOXHUNT_POOL=SCRAPED_POOL), (*serve, "run.plan=graph"),
        )  # fmt: skip
        full = start_trainer(
            FULL_JOB, full_config(), workdir, trainer_env(FOXHUNT_JOB_ID=FULL_JOB, FOXHUNT_POOL=SCRAPED_POOL), serve
        )
        bench = start("bench", bench_args(workdir / "bench"), workdir, trainer_env())
        processes += [pushed, epoch, full, bench]

        targets = [f"127.0.0.1:{metrics_port(trainer)}" for trainer in (full, epoch)]
        config = _prometheus_config(workdir, targets, f"127.0.0.1:{pgw_port}")
        prom_port = free_port()
        prometheus = start(
            "prometheus",
            [
                binaries["prometheus"],
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            workdir,
        )
        processes.append(prometheus)
        trainers = {PUSHED_JOB: pushed, EPOCH_JOB: epoch, FULL_JOB: full}
        stack = PromStack(f"http://127.0.0.1:{prom_port}", pushgateway_url, workdir, trainers)

        def ready(server: Process, url: str) -> bool:
            server.check_alive()  # one that could not bind its port exits: say so now, not after the timeout
            return httpx.get(f"{url}/-/ready").is_success

        wait_until(
            lambda: ready(pushgateway, pushgateway_url),
            60,
            0.25,
            what="the Pushgateway to be ready",
            ignore=SERVER_NOT_UP,
        )
        wait_until(lambda: ready(prometheus, stack.url), 60, 0.25, what="Prometheus to be ready", ignore=SERVER_NOT_UP)

        assert bench.wait_exit(STARTUP_TIMEOUT) == 0, f"the benchmark failed: {bench.tail()}"
        stack.bench = json.loads((workdir / "bench" / "bench.json").read_text())
        push_bench(stack.bench, pushgateway_url, BENCH_JOB_ID)

        def scraped_enough() -> bool:
            full.check_alive()
            epoch.check_alive()
            # rate() over the test's 20 s windows needs a few samples of every target.
            result = stack.query("min(count_over_time(up[1m])) >= 4 and min(up) == 1 and count(up) == 3")
            return bool(result["result"])

        wait_until(scraped_enough, 60, 0.25, what="every target to be up and scraped 4 times", ignore=SERVER_NOT_UP)
        yield stack
    finally:
        statuses = {process.name: process.stop() for process in reversed(processes)}
    crashed = {name: statuses[name] for name in (FULL_JOB, EPOCH_JOB) if statuses.get(name) != EXIT_TERMINATED}
    if stack is not None and crashed:
        pytest.fail(f"scraped trainers did not checkpoint and exit {EXIT_TERMINATED} on SIGTERM: {crashed}")


@pytest.fixture(scope="module")  # its trainers run until teardown: stop them when the module ends
def prom_stack(prometheus_binaries: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromStack]:
    with running_stack(prometheus_binaries, tmp_path_factory.mktemp("prometheus")) as stack:
        yield stack


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in DASHBOARDS}
