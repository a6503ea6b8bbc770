"""Submission throughput and latency of the controller (a benchmark, not a test).

Starts `python -m service serve` (local backend, auth on, reconciler running unless `--no-reconciler`)
in a temporary directory, on SQLite there (or `--database-url postgresql://…`), with one pool whose
GPU quota is large enough never to refuse but is checked on every submission (`--no-quota`: none).
Two modes:

- closed loop (default): C concurrent clients each POST /v1/jobs N times with fresh Idempotency-Keys,
  each sending its next request when the last one is answered: throughput at saturation.
- open loop (`--rate R --duration S`): submissions are due at fixed times (R per second for S seconds)
  and each is sent at its time whatever the earlier ones do; latency runs from the time it was due, so
  time spent queueing in the client (the server not keeping up) counts. `--settle` seconds after the
  last answer the store's QUEUED jobs (not yet handed to the backend: the backlog) are counted.

- drain (`--drain N --duration S`): N jobs are QUEUED in the store before the controller starts; every
  second for S seconds the store is read: how long until the reconciler has handed all N to the backend
  (none QUEUED) and how many ended per second, which with a one-slot local backend is the backend's
  pace (one supervisor at a time); compare `--drain 20`.

The first W requests warm up and are not counted. Prints p50/p90/p99/max and throughput, the load
average before and after, and with `--write FILE` appends a Markdown row with machine, date, commit and
command.

    .venv/bin/python scripts/bench_submit.py --clients 100 --requests 10 --write docs/benchmarks/submit-latency.md
    .venv/bin/python scripts/bench_submit.py --rate 100 --duration 60 --write docs/benchmarks/submit-latency.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.auth import create_token  # noqa: E402
from service.domain import JobState  # noqa: E402
from service.store import Store  # noqa: E402

BODY = {"config": {"run": {"steps": 1, "device": "cpu"}}}
BODY_BYTES = json.dumps(BODY).encode()
TIMEOUT_SECONDS = 120.0
"""A submission not answered by then counts as failed (status 0)."""
QUOTA_GPUS = 10_000_000
"""The bench pool's quota: never reached, but the admission lock and GPU-use query run as in production."""


@dataclass
class Results:
    latencies: list[float] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Http:
    """The load generator's HTTP/1.1 client: keep-alive connections on raw asyncio streams, one request at a
    time each. httpx cost about 10 ms of CPU per request here, twice the server's, on the cores the server
    shares: the benchmark then measured its own client. This costs a few hundredths of that."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.head = (
            f"POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY_BYTES)}\r\n"
        ).encode()
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self) -> int:
        """One submission with a fresh Idempotency-Key on an idle connection (or a new one): its status code.

        An idle connection the server has closed meanwhile (uvicorn's keep-alive timeout, 5 s) answers with
        end-of-stream before any byte: the request is sent again on a new connection, as httpx does."""
        key = uuid.uuid4().hex
        while self.idle:
            try:
                return await self._post(self.idle.pop(), key)
            except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as error:
                if getattr(error, "partial", b""):
                    raise
        return await self._post(await asyncio.open_connection(self.host, self.port), key)

    async def _post(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], key: str) -> int:
        reader, writer = conn
        try:
            async with asyncio.timeout(TIMEOUT_SECONDS):
                writer.write(self.head + f"Idempotency-Key: {key}\r\n\r\n".encode() + BODY_BYTES)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                lower = head.lower()
                at = lower.find(b"content-length:")
                length = int(lower[at + 15 : lower.index(b"\r\n", at)]) if at >= 0 else 0
                await reader.readexactly(length)
        except BaseException:
            writer.close()
            raise
        if b"connection: close" in lower:
            writer.close()
        else:
            self.idle.append(conn)
        return status

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def submit(http: Http, results: Results, since: float) -> None:
    """One submission; its latency is counted from `since` (when it was sent, or when it was due)."""
    try:
        status = await http.post()
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as error:  # no answer: status 0
        status = 0
        results.failures.append(type(error).__name__)
    results.latencies.append(time.perf_counter() - since)
    if status != 201:
        results.errors.append(status)


async def closed_loop(port: int, token: str, clients: int, requests: int, warmup: int) -> tuple[Results, float]:
    http = Http("127.0.0.1", port, token)
    for _ in range(warmup):
        await submit(http, Results(), time.perf_counter())
    results = Results()

    async def client() -> None:
        for _ in range(requests):
            await submit(http, results, time.perf_counter())

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    http.close()
    return results, elapsed


async def open_loop(port: int, token: str, rate: float, duration: float, warmup: int) -> tuple[Results, float]:
    """Submission i is due at start + i / rate; its latency is measured from then."""
    http = Http("127.0.0.1", port, token)
    for _ in range(warmup):
        await submit(http, Results(), time.perf_counter())
    results = Results()
    tasks: list[asyncio.Task[None]] = []
    started = time.perf_counter()
    for i in range(int(rate * duration)):
        due = started + i / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(submit(http, results, due)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    http.close()
    return results, elapsed


def run_async(coroutine: Any) -> Any:
    """On uvloop when installed (the server's loop too): the client's own overhead, smaller."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def preload(store: Store, count: int) -> None:
    """`count` QUEUED jobs, as the API would store them (tenant bench, pool local)."""
    from service.store import NewJob

    for i in range(count):
        job_id = f"job-drain-{i:06d}"
        fields: dict[str, Any] = {"tenant": "bench", "submitter": "bench", "name": None, "pool": "local", "gpus": 1}
        fields |= {"model": "dqn", "plan": "eager", "commit_sha": "HEAD", "epochs": 1, "hyperopt_trials": 0}
        fields |= {"priority": 0, "deadline": None, "labels": {}, "config": BODY["config"]}
        store.insert_job(NewJob.model_validate({"id": job_id, "idempotency_key": job_id, "request_hash": "", **fields}))


def drain(store: Store, count: int, duration: float) -> tuple[float | None, int, int, float]:
    """(seconds until no job is QUEUED, or None; jobs still QUEUED at the end; jobs ended; seconds run)."""
    started = time.perf_counter()
    handed: float | None = None
    counts = store.counts_by_state()
    while time.perf_counter() - started < duration:
        time.sleep(1.0)
        counts = store.counts_by_state()
        if handed is None and counts[JobState.QUEUED] == 0:
            handed = time.perf_counter() - started
        if sum(n for state, n in counts.items() if state.terminal) == count:
            break
    ended = sum(n for state, n in counts.items() if state.terminal)
    return handed, counts[JobState.QUEUED], ended, time.perf_counter() - started


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


def load_average() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc), to compare runs on a loaded machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds(pid: int) -> float:
    """The server's CPU time: its process and, with --workers, its worker processes (multiprocessing's spawned
    children); not the jobs' supervisors, which are the backend's work."""
    total = cpu_seconds(pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and b"multiprocessing" in Path(f"/proc/{entry}/cmdline").read_bytes():
                total += cpu_seconds(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return total


def wait_ready(url: str, server: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            return False
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100, help="Closed loop: concurrent clients.")
    parser.add_argument("--requests", type=int, default=10, help="Closed loop: submissions per client.")
    parser.add_argument("--rate", type=float, default=None, help="Open loop: submissions due per second.")
    parser.add_argument("--duration", type=float, default=60.0, help="Open loop, drain: seconds of the run.")
    parser.add_argument("--drain", type=int, default=None, help="Drain: jobs QUEUED before the controller starts.")
    parser.add_argument("--settle", type=float, default=5.0, help="Seconds after the load before the backlog count.")
    parser.add_argument("--warmup", type=int, default=20, help="Submissions before the clock starts.")
    parser.add_argument("--database-url", default=None, help="Store URL (default: SQLite in the temp dir).")
    parser.add_argument("--no-quota", action="store_true", help="A pool without a GPU quota (no admission check).")
    parser.add_argument(
        "--no-reconciler", action="store_true", help="API and store only: jobs stay QUEUED, nothing is launched."
    )
    parser.add_argument("--workers", type=int, default=1, help="Server processes (foxhunt serve --workers).")
    parser.add_argument("--write", type=Path, default=None, help="Append the result to this Markdown file.")
    args = parser.parse_args()

    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="foxhunt-bench-") as tmp:
        database_url = args.database_url or f"sqlite:///{tmp}/bench.db"
        store = Store(database_url)
        store.migrate()
        token, _ = create_token(store, name="bench", tenant="bench")
        if args.drain is not None:
            preload(store, args.drain)
        pools = {"name": "local", "gpu_type": "cpu", "gpus_per_node": 1}
        if not args.no_quota:
            pools["default_quota_gpus"] = QUOTA_GPUS
        Path(tmp, "pools.json").write_text(json.dumps({"pools": [pools]}))  # YAML is a superset of JSON
        port = free_port()
        env = {
            **os.environ,
            "FOXHUNT_DATABASE_URL": database_url,
            "FOXHUNT_JOBS_DIR": f"{tmp}/jobs",
            "FOXHUNT_LOCAL_COMMAND": '["true"]',
            "FOXHUNT_LOCAL_GPUS": "0",
            "FOXHUNT_POOLS_FILE": f"{tmp}/pools.json",
            "FOXHUNT_PORT": str(port),
            "FOXHUNT_RUN_RECONCILER": "0" if args.no_reconciler else "1",
            "FOXHUNT_WORKERS": str(args.workers),
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "service", "serve"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        backlog: int | None = None
        try:
            if not wait_ready(url, server):
                print("error: the controller did not start", file=sys.stderr)
                return 1
            cpu_before = server_cpu_seconds(server.pid)
            client_before = cpu_seconds(os.getpid())
            if args.drain is not None:
                handed, queued, ended, seconds = drain(store, args.drain, args.duration)
                used = server_cpu_seconds(server.pid) - cpu_before
                print(
                    f"{args.drain} queued jobs: all handed to the backend after "
                    f"{'-' if handed is None else f'{handed:.0f}'} s ({queued} still QUEUED at the end); {ended} ended "
                    f"in {seconds:.0f} s, {ended / seconds:.2f} per second; "
                    f"server CPU {used:.1f} s; load average {load_before} before, "
                    f"{load_average()} after"
                )
                return 0
            if args.rate is not None:
                results, wall = run_async(open_loop(port, token, args.rate, args.duration, args.warmup))
                server_cpu = server_cpu_seconds(server.pid) - cpu_before
                client_cpu = cpu_seconds(os.getpid()) - client_before
                time.sleep(args.settle)
                backlog = store.counts_by_state()[JobState.QUEUED] if not args.no_reconciler else None
            else:
                results, wall = run_async(closed_loop(port, token, args.clients, args.requests, args.warmup))
                server_cpu = server_cpu_seconds(server.pid) - cpu_before
                client_cpu = cpu_seconds(os.getpid()) - client_before
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            store.dispose()
    load_after = load_average()

    ms = [x * 1000 for x in results.latencies]
    p50, p90, p99 = (percentile(ms, q) for q in (0.5, 0.9, 0.99))
    mode = f"open {args.rate:g}/s x {args.duration:g} s" if args.rate is not None else f"closed, {args.clients} clients"
    mode += f", {args.workers} workers" if args.workers > 1 else ""
    kinds = sorted({str(status) for status in results.errors if status} | set(results.failures))
    after = "" if backlog is None else f", {backlog} QUEUED {args.settle:g} s after"
    summary = (
        f"{len(ms)} submissions, {mode}: p50 {p50:.1f} ms, p90 {p90:.1f} ms, p99 {p99:.1f} ms, max {max(ms):.1f} ms, "
        f"{len(ms) / wall:.0f} submissions/s, {len(results.errors)} errors {kinds}{after}; "
        f"server CPU {1000 * server_cpu / len(ms):.2f} ms per submission (client {1000 * client_cpu / len(ms):.2f}); "
        f"load average {load_before} before, {load_after} after"
    )
    print(summary)
    if args.write is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "service"], cwd=ROOT, capture_output=True, text=True)
        version = (commit.stdout.strip() or "uncommitted") + ("-dirty" if dirty.stdout.strip() else "")
        cells = [
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            version,
            machine(),
            database_url.split(":", 1)[0].split("+", 1)[0],
            "off" if args.no_reconciler else "on",
            mode,
            str(len(ms)),
            *(f"{x:.1f}" for x in (p50, p90, p99, max(ms))),
            f"{len(ms) / wall:.0f}",
            str(len(results.errors)),
            "" if backlog is None else str(backlog),
            f"{1000 * server_cpu / len(ms):.1f}",
            f"{load_before} / {load_after}",
            f"`{shlex.join(['python', *sys.argv])}`",
        ]
        with open(args.write, "a") as out:
            out.write("| " + " | ".join(cells) + " |\n")
    return 0 if not results.errors else 1


if __name__ == "__main__":
    sys.exit(main())
