"""One behaviour suite for every backend: `local` (real subprocesses) and `argo` (fake API server).

Each job's config carries what its trainer does (`lines` to print, `hold` seconds to run, `exit`
code). For `local` a tiny script, the trainer program of every pipeline step, does exactly that in
its `train` step (resolve copies the config to where later steps read it, the other steps succeed at
once); for `argo` a stand-in for Argo's workflow controller moves the Workflow through its phases,
creates its pod and writes the pod's log.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.backends.argo import ArgoBackend
from service.backends.base import Backend, BackendNotFound
from service.backends.local import LocalBackend
from service.domain import BackendStatus, JobSpec, JobState
from tests.polling import wait_until
from tests.service.backends.conftest import argo_backend
from tests.service.factories import job_spec
from tests.service.fake_kube import FakeKube

TRAINER = """
import json, os, shutil, sys, time
def arg(name):
    return sys.argv[sys.argv.index(name) + 1]
if sys.argv[1] == "resolve":  # resolve writes the config every later step reads
    os.makedirs(os.path.dirname(arg("--out")), exist_ok=True)
    shutil.copyfile(arg("--config"), arg("--out"))
if sys.argv[1] != "train":
    sys.exit(0)
job = json.load(open(sys.argv[sys.argv.index("--config") + 1]))["job"]
for line in job.get("lines", []):
    print(line, flush=True)
time.sleep(job.get("hold", 0))
sys.exit(job.get("exit", 0))
"""


def fake_argo_controller(fake: FakeKube, stop: threading.Event) -> None:
    """What Argo does with our Workflows, enough for the contract: run, log, end, honour shutdown."""
    started: dict[str, float] = {}
    while not stop.wait(0.05):
        for workflow in fake.workflows():
            name, status = workflow["metadata"]["name"], workflow.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed", "Error"):
                continue
            params = {p["name"]: p["value"] for p in workflow["spec"]["arguments"]["parameters"]}
            job = json.loads(params["config"])["job"]
            shutdown = workflow["spec"].get("shutdown")
            if shutdown:
                fake.finish_pod(f"{name}-train")
                fake.set_phase(name, "Failed", f"Stopped with strategy '{shutdown}'")
            elif not status.get("phase"):
                started[name] = time.monotonic()
                fake.add_pod(name, f"{name}-train", tuple(job.get("lines", [])))
                fake.set_phase(name, "Running")
            elif time.monotonic() - started[name] >= job.get("hold", 0):
                fake.finish_pod(f"{name}-train")
                code = job.get("exit", 0)
                fake.set_phase(name, "Succeeded" if code == 0 else "Failed", f"exit code {code}" if code else None)


@dataclass
class Harness:
    backend: Backend
    fresh: Callable[[], Backend]  # another instance over the same jobs: a restarted controller


@pytest.fixture(params=["local", "argo"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "local":
        script = tmp_path / "trainer.py"
        script.write_text(TRAINER)

        def local() -> LocalBackend:
            command = [sys.executable, str(script)]
            return LocalBackend(tmp_path / "jobs", command=command, gpus=0, grace_seconds=5, poll_seconds=0.05)

        yield Harness(local(), local)
        return
    stop = threading.Event()
    with FakeKube() as fake:
        controller = threading.Thread(target=fake_argo_controller, args=(fake, stop), daemon=True)
        controller.start()

        def argo() -> ArgoBackend:
            return argo_backend(fake)

        yield Harness(argo(), argo)
        stop.set()
        controller.join()


def spec(job_id: str = "job-1", attempt: int = 0, **job: Any) -> JobSpec:
    return job_spec(job_id, attempt=attempt, config={"job": job})


def wait_for(
    backend: Backend, job_id: str, done: Callable[[BackendStatus], bool], timeout: float = 15
) -> BackendStatus:
    def status_if_done() -> BackendStatus | None:
        status = backend.status(job_id)
        return status if done(status) else None

    return wait_until(status_if_done, timeout, 0.05, what=f"{job_id} to reach the awaited status")


def test_submit_is_idempotent(harness: Harness) -> None:
    first = harness.backend.submit(spec(hold=5))
    again = harness.backend.submit(spec(hold=5))
    assert first.job_id == again.job_id == "job-1" and not again.state.terminal
    assert [s.job_id for s in harness.backend.list_statuses()] == ["job-1"]
    harness.backend.cancel("job-1", force=True)


def test_a_job_runs_to_success_and_keeps_its_log(harness: Harness) -> None:
    harness.backend.submit(spec(lines=["hello", "world"]))
    status = wait_for(harness.backend, "job-1", lambda s: s.state.terminal)
    assert (status.state, status.attempt, status.finished_at is not None) == (JobState.SUCCEEDED, 0, True)
    lines = list(harness.backend.logs("job-1"))
    assert all(line.endswith("\n") for line in lines)
    assert [line for line in lines if line in ("hello\n", "world\n")] == ["hello\n", "world\n"]


def test_a_failing_job_is_failed_with_a_reason(harness: Harness) -> None:
    harness.backend.submit(spec(exit=3))
    status = wait_for(harness.backend, "job-1", lambda s: s.state.terminal)
    assert status.state is JobState.FAILED and status.reason
    assert "3" in (status.message or "")


def test_cancel_stops_a_running_job(harness: Harness) -> None:
    harness.backend.submit(spec(hold=30))
    assert wait_for(harness.backend, "job-1", lambda s: s.state is JobState.RUNNING).state is JobState.RUNNING
    harness.backend.cancel("job-1")
    assert wait_for(harness.backend, "job-1", lambda s: s.state.terminal).state is JobState.CANCELLED


def test_unknown_jobs_are_not_found(harness: Harness) -> None:
    with pytest.raises(BackendNotFound):
        harness.backend.status("missing")
    with pytest.raises(BackendNotFound):
        harness.backend.cancel("missing")
    with pytest.raises(BackendNotFound):
        list(harness.backend.logs("missing"))


def test_following_logs_ends_with_the_job(harness: Harness) -> None:
    harness.backend.submit(spec(lines=["one", "two"], hold=0.5))
    lines = list(harness.backend.logs("job-1", follow=True))
    assert [line for line in lines if line in ("one\n", "two\n")] == ["one\n", "two\n"]
    assert harness.backend.status("job-1").state is JobState.SUCCEEDED


def test_watch_reports_the_end_of_a_job(harness: Harness) -> None:
    harness.backend.submit(spec(hold=1.0))
    ended = None
    for status in harness.backend.watch(timeout_seconds=10):
        if status.job_id == "job-1" and status.state.terminal:
            ended = status.state
            break
    assert ended is JobState.SUCCEEDED


def test_retry_runs_the_next_attempt(harness: Harness) -> None:
    harness.backend.submit(spec(exit=1))
    assert wait_for(harness.backend, "job-1", lambda s: s.state.terminal).state is JobState.FAILED
    harness.backend.submit(spec(attempt=1))
    status = wait_for(harness.backend, "job-1", lambda s: s.state.terminal and s.attempt == 1)
    assert (status.state, status.attempt) == (JobState.SUCCEEDED, 1)
    assert [(s.job_id, s.attempt) for s in harness.backend.list_statuses()] == [("job-1", 1)]


def test_a_restarted_controller_finds_every_job(harness: Harness) -> None:
    harness.backend.submit(spec("job-a"))
    harness.backend.submit(spec("job-b", hold=30))
    wait_for(harness.backend, "job-a", lambda s: s.state.terminal)
    restarted = harness.fresh()
    states = {s.job_id: s.state for s in restarted.list_statuses()}
    assert states["job-a"] is JobState.SUCCEEDED and not states["job-b"].terminal and set(states) == {"job-a", "job-b"}
    assert restarted.submit(spec("job-b", hold=30)).job_id == "job-b"
    assert len(restarted.list_statuses()) == 2
    restarted.cancel("job-b", force=True)


def test_ping(harness: Harness) -> None:
    harness.backend.ping()
