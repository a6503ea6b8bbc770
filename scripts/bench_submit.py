"""Submission latency of the controller under concurrent clients (a benchmark, not a test).

Starts `python -m service serve` (local backend, file SQLite, auth on, reconciler running) in a
temporary directory, then C concurrent clients each POST /v1/jobs N times with fresh Idempotency-Keys.
The first W requests warm up and are not counted. Prints p50/p90/p99/max and throughput, and with
`--write FILE` appends a Markdown row with machine, date, commit and command.

    .venv/bin/python scripts/bench_submit.py --clients 100 --requests 10 --write docs/benchmarks/submit-latency.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.auth import create_token  # noqa: E402
from service.store import Store  # noqa: E402

BODY = {"config": {"run": {"steps": 1, "device": "cpu"}}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def client(url: str, token: str, count: int, latencies: list[float], errors: list[int]) -> None:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        for _ in range(count):
            started = time.perf_counter()
            response = await http.post("/v1/jobs", json=BODY, headers={"Idempotency-Key": uuid.uuid4().hex})
            latencies.append(time.perf_counter() - started)
            if response.status_code != 201:
                errors.append(response.status_code)


async def run(url: str, token: str, clients: int, requests: int, warmup: int) -> tuple[list[float], list[int], float]:
    await client(url, token, warmup, [], [])
    latencies: list[float] = []
    errors: list[int] = []
    started = time.perf_counter()
    await asyncio.gather(*(client(url, token, requests, latencies, errors) for _ in range(clients)))
    return latencies, errors, time.perf_counter() - started


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        cpu = model
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPUs visible, Python {platform.python_version()}, {platform.system()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100, help="Concurrent clients.")
    parser.add_argument("--requests", type=int, default=10, help="Submissions per client.")
    parser.add_argument("--warmup", type=int, default=20, help="Submissions before the clock starts.")
    parser.add_argument("--database-url", default=None, help="Store URL (default: SQLite in the temp dir).")
    parser.add_argument(
        "--no-reconciler", action="store_true", help="API and store only: jobs stay QUEUED, nothing is launched."
    )
    parser.add_argument("--write", type=Path, default=None, help="Append the result to this Markdown file.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="foxhunt-bench-") as tmp:
        database_url = args.database_url or f"sqlite:///{tmp}/bench.db"
        store = Store(database_url)
        store.migrate()
        token, _ = create_token(store, name="bench", tenant="bench")
        store.dispose()
        port = free_port()
        env = {
            **os.environ,
            "FOXHUNT_DATABASE_URL": database_url,
            "FOXHUNT_JOBS_DIR": f"{tmp}/jobs",
            "FOXHUNT_LOCAL_COMMAND": '["true"]',
            "FOXHUNT_LOCAL_GPUS": "0",
            "FOXHUNT_PORT": str(port),
            "FOXHUNT_RUN_RECONCILER": "0" if args.no_reconciler else "1",
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "service", "serve"], cwd=ROOT, env=env, stderr=subprocess.DEVNULL
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    print("error: the controller did not start", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            latencies, errors, wall = asyncio.run(run(url, token, args.clients, args.requests, args.warmup))
        finally:
            server.terminate()
            server.wait(timeout=30)

    ms = [x * 1000 for x in latencies]
    p50, p90, p99 = (percentile(ms, q) for q in (0.5, 0.9, 0.99))
    summary = (
        f"{len(ms)} submissions, {args.clients} clients: p50 {p50:.1f} ms, p90 {p90:.1f} ms, "
        f"p99 {p99:.1f} ms, max {max(ms):.1f} ms, {len(ms) / wall:.0f} submissions/s, {len(errors)} errors"
    )
    print(summary)
    if args.write is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "service"], cwd=ROOT, capture_output=True, text=True)
        version = (commit.stdout.strip() or "uncommitted") + ("-dirty" if dirty.stdout.strip() else "")
        reconciler = "off" if args.no_reconciler else "on"
        cells = [
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            version,
            machine(),
            database_url.split(":", 1)[0],
            reconciler,
            str(args.clients),
            str(len(ms)),
            *(f"{x:.1f}" for x in (p50, p90, p99, max(ms))),
            f"{len(ms) / wall:.0f}",
            str(len(errors)),
            f"`{shlex.join(['python', *sys.argv])}`",
        ]
        row = "| " + " | ".join(cells) + " |\n"
        with open(args.write, "a") as out:
            out.write(row)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
