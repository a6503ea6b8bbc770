"""Fixtures for the monitoring tests: the component's files, and a real Prometheus + Pushgateway.

Prometheus (Debian's `prometheus`) and the Pushgateway (`prometheus-pushgateway`) are installed if
missing and started on free ports with temporary storage. Prometheus scrapes two toy trainers (one
eager, one graph job of pool `test-pool`) and the Pushgateway, which holds the final snapshots of two
more jobs (pool `push-pool`) and a benchmark's per-plan step times. Every wait polls an event with a
deadline; nothing sleeps blindly.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.system_packages import ensure_debian_packages

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "k8s" / "components" / "monitoring"
DASHBOARDS = sorted((COMPONENT / "dashboards").glob("*.json"))
SCHEMAS = ROOT.parent / "shared" / "schemas"
TOY_TRAINER = Path(__file__).with_name("toy_trainer.py")

SCRAPED_POOL = "test-pool"
SCRAPED_JOBS = {"eager": "job-eager", "graph": "job-graph"}
PUSHED_POOL = "push-pool"
PUSHED_JOBS = {"eager": "push-eager", "graph": "push-graph"}
PUSHED_STEPS = 60
BENCH_JOB_ID = "bench-toy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, every: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, OSError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def prometheus_rule_groups() -> list[dict[str, Any]]:
    """The rule groups of the component's PrometheusRule, as a Prometheus rule file's `groups`."""
    rule = yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text())
    return rule["spec"]["groups"]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[str]
    log: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            pytest.fail(f"{self.name} exited with {self.popen.returncode}: {tail}")


def start(name: str, args: list[str], workdir: Path) -> Process:
    log = workdir / f"{name}.log"
    popen = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, cwd=workdir)
    return Process(name, popen, log)


def start_toy_trainer(plan: str, job_id: str, pool: str, workdir: Path) -> tuple[Process, int]:
    """Start tests/k8s/toy_trainer.py and return it with the port it reports once it serves."""
    log = workdir / f"{job_id}.log"
    popen = subprocess.Popen(
        [sys.executable, str(TOY_TRAINER), "--plan", plan, "--job-id", job_id, "--pool", pool, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    process = Process(job_id, popen, log)
    selector = selectors.DefaultSelector()
    assert popen.stdout is not None
    selector.register(popen.stdout, selectors.EVENT_READ)
    if not selector.select(timeout=90):
        process.stop()
        pytest.fail(f"{job_id}: toy trainer did not report its port within 90 s: {log.read_text()[-2000:]}")
    line = popen.stdout.readline()
    if not line.startswith("PORT "):
        process.stop()
        pytest.fail(f"{job_id}: unexpected first line {line!r}: {log.read_text()[-2000:]}")
    return process, int(line.split()[1])


@dataclass
class PromStack:
    """A running Prometheus, the Pushgateway it scrapes, and the toy trainers it scrapes."""

    url: str
    pushgateway_url: str
    workdir: Path

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

    def label_values(self, label: str, match: str) -> list[str]:
        response = httpx.get(f"{self.url}/api/v1/label/{label}/values", params={"match[]": match}, timeout=10)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"label values failed ({response.status_code}): {body.get('error')}\n{match}")
        return list(body["data"])


def _push_snapshots(pushgateway_url: str) -> None:
    """Final snapshots of two short jobs, and a benchmark's per-plan step times, like short jobs push them."""
    import torch
    from prometheus_client import CollectorRegistry

    from tests.k8s.toy_trainer import build, run_steps
    from trainer.metrics import BenchResult, export_bench, push

    torch.set_num_threads(1)  # the toy's tiny matmuls only lose from threads on a shared CPU
    bench: list[BenchResult] = []
    for plan, job_id in PUSHED_JOBS.items():
        registry, trainer = build(plan, job_id, PUSHED_POOL)
        run_steps(trainer, PUSHED_STEPS, epoch_steps=20)
        means = trainer.timer.means_ms()
        bench.append(BenchResult(plan=plan, config="toy", step_seconds=means["step"] / 1e3))
        push(registry, pushgateway_url, job_id)
    bench_registry = CollectorRegistry()
    export_bench(bench_registry, bench)
    push(bench_registry, pushgateway_url, BENCH_JOB_ID, job="foxhunt-bench")


@pytest.fixture(scope="session")
def prometheus_binaries() -> dict[str, str]:
    return {
        "prometheus": ensure_debian_packages("prometheus", "prometheus"),
        "pushgateway": ensure_debian_packages("prometheus-pushgateway", "prometheus-pushgateway"),
        "promtool": ensure_debian_packages("promtool", "prometheus"),
    }


@pytest.fixture(scope="session")
def prom_stack(prometheus_binaries: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromStack]:
    workdir = tmp_path_factory.mktemp("prometheus")
    processes: list[Process] = []
    try:
        targets = []
        for plan, job_id in SCRAPED_JOBS.items():
            process, port = start_toy_trainer(plan, job_id, SCRAPED_POOL, workdir)
            processes.append(process)
            targets.append(f"127.0.0.1:{port}")

        pgw_port = free_port()
        pushgateway = start(
            "pushgateway",
            [prometheus_binaries["pushgateway"], f"--web.listen-address=127.0.0.1:{pgw_port}"],
            workdir,
        )
        processes.append(pushgateway)
        pushgateway_url = f"http://127.0.0.1:{pgw_port}"
        wait_for("the Pushgateway to be ready", lambda: httpx.get(f"{pushgateway_url}/-/ready").is_success)
        _push_snapshots(pushgateway_url)

        # The PrometheusRule's groups, evaluated every second here so the test need not wait 30 s.
        groups = [{**group, "interval": "1s"} for group in prometheus_rule_groups()]
        (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [
                # The job name the PodMonitor gives trainer pods (jobLabel app.kubernetes.io/name).
                {"job_name": "foxhunt-trainer", "static_configs": [{"targets": targets}]},
                {
                    "job_name": "pushgateway",
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{pgw_port}"]}],
                },
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_port = free_port()
        prometheus = start(
            "prometheus",
            [
                prometheus_binaries["prometheus"],
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            workdir,
        )
        processes.append(prometheus)
        stack = PromStack(f"http://127.0.0.1:{prom_port}", pushgateway_url, workdir)
        wait_for("Prometheus to be ready", lambda: httpx.get(f"{stack.url}/-/ready").is_success)

        def scraped_enough() -> bool:
            for process in processes:
                process.check_alive()
            # rate() over the test's 20 s windows needs a few samples of every target.
            result = stack.query("min(count_over_time(up[1m])) >= 4 and min(up) == 1 and count(up) == 3")
            return bool(result["result"])

        wait_for("every target to be up and scraped 4 times", scraped_enough)
        yield stack
    finally:
        for process in reversed(processes):
            process.stop()


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in DASHBOARDS}
