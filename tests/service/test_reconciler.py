"""Reconciliation: restarts lose and duplicate nothing; an unreachable backend fails no job."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry

from service.app import create_app
from service.backends.base import BackendError, BackendUnavailable
from service.backends.local import LocalBackend
from service.domain import BackendStatus, JobSpec, JobState
from service.metrics import ControllerMetrics
from service.pools import Pools
from service.reconciler import FAILING_PASSES, Reconciler
from service.settings import Settings
from service.store import Store
from tests.polling import wait_until
from tests.service.backends.test_local import job_processes
from tests.service.conftest import Controller
from tests.service.factories import POOLS_YAML, make_settings, stand_in_command


class Unreachable:
    """A real LocalBackend behind a switch that makes every call fail, by default as an outage would."""

    def __init__(self, inner: LocalBackend, error: BackendError | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.gpus = inner.gpus
        self.down = True
        self.error = error or BackendUnavailable("connection refused")

    def _check(self) -> None:
        if self.down:
            raise self.error

    def submit(self, spec: JobSpec) -> BackendStatus:
        self._check()
        return self.inner.submit(spec)

    def status(self, job_id: str) -> BackendStatus:
        self._check()
        return self.inner.status(job_id)

    def list_statuses(self) -> list[BackendStatus]:
        self._check()
        return self.inner.list_statuses()

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        self._check()
        self.inner.cancel(job_id, force=force)

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[str]:
        self._check()
        return self.inner.logs(job_id, follow=follow)

    def watch(self, *, timeout_seconds: float | None = None) -> Iterator[BackendStatus]:
        self._check()
        return self.inner.watch(timeout_seconds=timeout_seconds)

    def ping(self) -> None:
        self._check()


def _submit(c: Controller, key: str) -> str:
    body = {"config": {"run": {"steps": 2}}, "pool": "cpu"}
    response = c.request("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert response.status_code in (200, 201), response.text
    job_id: str = response.json()["id"]
    return job_id


def _starts(settings: Settings, job_id: str) -> int:
    return (settings.jobs_dir / job_id / "log.txt").read_text().count("--- foxhunt: attempt ")  # one line per launch


def test_jobs_queued_by_a_dead_controller_run_once_after_restart(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    settings = make_settings(tmp_path, run_reconciler=False)
    first = controller_factory(settings)
    queued = _submit(first, "queued")
    handed_over = _submit(first, "handed-over")
    # the first controller died right after the backend accepted this job, before the store heard back
    from service.reconciler import spec_for

    first.services.backend.submit(spec_for(first.services.store.get_job(handed_over), first.services.pools))
    first.close()
    second = controller_factory(settings.model_copy(update={"run_reconciler": True}))
    for job_id in (queued, handed_over):
        assert second.wait_for(job_id)["state"] == "SUCCEEDED"
        assert _starts(settings, job_id) == 1
    assert _submit(second, "queued") == queued  # the key still names the same job
    assert len(second.services.store.list_jobs(limit=100)[0]) == 2


def test_the_backend_gets_the_epochs_only_of_a_job_given_in_epochs(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """Epochs reach the pipeline (JobSpec.train_epochs) only when the stored config leaves run.steps out."""
    from service.reconciler import spec_for

    c = controller_factory(make_settings(tmp_path, run_reconciler=False))
    asked = {
        "epochs": {"config": {"run": {"seed": 1}}, "epochs": 3},
        "steps": {"config": {"run": {"steps": 4000}}},
        "neither": {},
    }
    specs = {}
    for name, body in asked.items():
        job_id = c.request("POST", "/v1/jobs", json={**body, "pool": "cpu"}).json()["id"]
        specs[name] = spec_for(c.services.store.get_job(job_id), c.services.pools)
    assert (specs["epochs"].train_epochs, specs["epochs"].epochs) == (3, 3)
    assert "steps" not in specs["epochs"].config["run"]
    steps = specs["steps"]
    assert (steps.train_epochs, steps.epochs, steps.config["run"]["steps"]) == (None, 2, 4000)
    assert (specs["neither"].train_epochs, specs["neither"].config["run"]["steps"]) == (None, 2000)


def test_a_job_running_across_a_restart_is_followed_to_its_end(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    settings = make_settings(tmp_path, local_command=stand_in_command("--sleep", "2"))
    first = controller_factory(settings)
    job_id = _submit(first, "k")
    first.wait_for(job_id, {"RUNNING"})
    first.close()  # the job's process lives on
    second = controller_factory(settings)
    assert second.request("GET", f"/v1/jobs/{job_id}").json()["state"] == "RUNNING"
    job = second.wait_for(job_id)
    assert job["state"] == "SUCCEEDED" and _starts(settings, job_id) == 1
    assert [h["state"] for h in job["history"]] == ["QUEUED", "RUNNING", "SUCCEEDED"]


def test_a_killed_supervisor_leaves_no_trainer_behind_through_retry_and_cancel(
    tmp_path: Path, database_url: str, controller_factory: Callable[[Settings], Controller]
) -> None:
    """kill -9 of a job's supervisor (not of its group): the job reads ERROR only once its trainer is
    stopped, a retry runs one trainer, and a cancel after another such kill leaves no trainer either
    (the cancel itself, without a status read between, is test_local.py's)."""
    settings = make_settings(tmp_path, database_url=database_url, local_command=stand_in_command("--sleep", "60"))
    c = controller_factory(settings)
    job_id = _submit(c, "k")
    job_dir = settings.jobs_dir / job_id

    def kill_supervisor(attempt: int) -> int:
        train = f"stand-in: train env job={job_id} pool=cpu commit=HEAD attempt={attempt}"
        log = job_dir / "log.txt"
        wait_until(lambda: train in log.read_text(), 30, 0.05, what="the train step", ignore=(FileNotFoundError,))
        pid = int((job_dir / f"pid-{attempt}").read_text())
        os.kill(pid, signal.SIGKILL)
        assert job_processes(pid)  # its trainer is still there, an orphan
        return pid

    first = kill_supervisor(0)
    job = c.wait_for(job_id)
    assert (job["state"], job["reason"]) == ("ERROR", "ProcessLost")
    assert job_processes(first) == []  # stopped before the job was reported lost
    assert c.request("POST", f"/v1/jobs/{job_id}/retry").status_code == 202
    second = kill_supervisor(1)
    assert job_processes(first) == []  # one trainer in the run folder
    # the reconciler may find the supervisor gone before the cancel comes: stopped either way
    assert c.request("DELETE", f"/v1/jobs/{job_id}").status_code in (202, 409)
    assert c.wait_for(job_id)["state"] in ("CANCELLED", "ERROR")
    assert job_processes(second) == []


def test_an_unreachable_backend_never_fails_a_job(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    backend = Unreachable(LocalBackend.from_settings(settings))
    registry = CollectorRegistry()
    c = Controller(create_app(settings, backend=backend, registry=registry))
    try:
        job_id = _submit(c, "k")
        labels = {"operation": "submit", "cause": "unavailable"}
        wait_until(  # several passes
            lambda: (registry.get_sample_value("foxhunt_backend_errors_total", labels) or 0) >= 3,
            30,
            0.05,
            what="three failed submits",
        )
        job = c.request("GET", f"/v1/jobs/{job_id}").json()
        assert job["state"] == "QUEUED" and job["reason"] is None
        assert c.request("GET", "/readyz").status_code == 503
        assert registry.get_sample_value("foxhunt_reconcile_recoveries_total", {"cause": "watch_restarted"})
        backend.down = False
        assert c.wait_for(job_id)["state"] == "SUCCEEDED"
        assert c.request("GET", "/readyz").status_code == 200
    finally:
        c.close()
        c.kill_jobs()


def test_a_job_the_backend_lost_is_an_error_not_a_failure(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    import shutil

    settings = make_settings(tmp_path, local_command=stand_in_command("--sleep", "30"), run_reconciler=False)
    c = controller_factory(settings)
    job_id = _submit(c, "k")
    reconciler = c.services.reconciler
    reconciler.reconcile_once()
    backend = c.services.backend
    assert isinstance(backend, LocalBackend)
    backend.cancel(job_id, force=True)
    # Its supervisor has stopped writing to the dir.
    wait_until(lambda: backend.status(job_id).state.terminal, 30, 0.05, what=f"{job_id} to end")
    shutil.rmtree(settings.jobs_dir / job_id)  # e.g. the jobs dir was wiped
    assert reconciler.reconcile_once()
    job = c.request("GET", f"/v1/jobs/{job_id}").json()
    assert (job["state"], job["reason"]) == ("ERROR", "Lost")


def test_cancel_escalates_to_a_forced_stop_after_the_grace_period(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    command = stand_in_command("--sleep", "60", "--ignore-term")
    c = controller_factory(make_settings(tmp_path, local_command=command, cancel_grace_seconds=0.5))
    c.services.backend.grace_seconds = 60  # type: ignore[attr-defined]  # only the reconciler may force it
    job_id = _submit(c, "k")
    wait_until(
        lambda: "stand-in: steps=" in c.request("GET", f"/v1/jobs/{job_id}/logs").text, 30, what="the job's first steps"
    )
    c.request("DELETE", f"/v1/jobs/{job_id}")
    job = c.wait_for(job_id, timeout=30)
    assert (job["state"], job["reason"]) == ("CANCELLED", "Killed")
    assert c.services.store.get_job(job_id).cancel_forced
    assert (
        c.services.metrics.registry.get_sample_value("foxhunt_reconcile_recoveries_total", {"cause": "cancel_forced"})
        == 1
    )


def test_a_passed_deadline_cancels_the_job(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, local_command=stand_in_command("--sleep", "30")))
    deadline = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
    body = {"config": {"run": {"steps": 2}}, "pool": "cpu", "deadline": deadline}
    job_id = c.request("POST", "/v1/jobs", json=body).json()["id"]
    job = c.wait_for(job_id, timeout=30)
    assert (job["state"], job["reason"]) == ("CANCELLED", "DeadlineExceeded")
    assert (
        c.services.metrics.registry.get_sample_value("foxhunt_reconcile_recoveries_total", {"cause": "deadline"}) == 1
    )


def test_a_deadline_passes_for_a_queued_job_while_the_backend_is_down(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    backend = Unreachable(LocalBackend.from_settings(settings))
    c = Controller(create_app(settings, backend=backend))
    try:
        deadline = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
        body = {"config": {"run": {"steps": 2}}, "pool": "cpu", "deadline": deadline}
        job_id = c.request("POST", "/v1/jobs", json=body).json()["id"]
        job = c.wait_for(job_id, timeout=30)
        assert (job["state"], job["reason"]) == ("CANCELLED", "DeadlineExceeded")
        assert [h["state"] for h in job["history"]] == ["QUEUED", "CANCELLED"]
        backend.down = False  # back up: the expired job is never submitted
        assert c.services.reconciler.reconcile_once()
        assert backend.inner.list_statuses() == []
    finally:
        c.close()


def test_a_submission_the_backend_rejects_is_an_error_with_its_message(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    backend = Unreachable(LocalBackend.from_settings(settings), BackendError("Workflow is invalid: spec.arguments"))
    c = Controller(create_app(settings, backend=backend))
    try:
        job = c.wait_for(_submit(c, "k"))
        assert (job["state"], job["reason"]) == ("ERROR", "SubmitRejected")
        assert job["message"] == "Workflow is invalid: spec.arguments"
        registry = c.services.metrics.registry
        assert registry.get_sample_value("foxhunt_backend_errors_total", {"operation": "submit", "cause": "other"})
    finally:
        c.close()


# ---- one bad job never stops a pass ----------------------------------------------------------------


def test_a_queued_job_whose_pool_was_removed_fails_alone(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    settings = make_settings(tmp_path, local_command=stand_in_command("--sleep", "30"), run_reconciler=False)
    pools_file = settings.pools_file
    assert pools_file is not None
    pools_file.write_text(POOLS_YAML + "  - {name: spare, gpu_type: cpu, gpus_per_node: 1, default_quota_gpus: 8}\n")
    first = controller_factory(settings)
    running = _submit(first, "running")
    assert first.services.reconciler.reconcile_once()  # handed to the backend before the restart
    stranded = first.request("POST", "/v1/jobs", json={"pool": "spare", "config": {"run": {"steps": 2}}}).json()["id"]
    waiting = _submit(first, "waiting")
    first.close()
    pools_file.write_text(POOLS_YAML)  # the operator removed pool "spare"; then the controller restarts
    second = controller_factory(settings.model_copy(update={"run_reconciler": True}))
    job = second.wait_for(stranded, timeout=30)
    assert (job["state"], job["reason"]) == ("ERROR", "UnknownPool")
    assert "unknown pool 'spare'" in job["message"]
    second.wait_for(running, {"RUNNING"}, timeout=30)
    assert second.request("DELETE", f"/v1/jobs/{running}").status_code == 202  # the cancel reaches it
    assert second.wait_for(running, timeout=30)["state"] == "CANCELLED"
    second.wait_for(waiting, {"RUNNING"}, timeout=30)  # the next queued job starts in the freed slot
    assert second.request("GET", "/readyz").status_code == 200
    registry = second.services.metrics.registry
    assert registry.get_sample_value("foxhunt_reconcile_recoveries_total", {"cause": "bad_job"}) == 1


class _Picky(LocalBackend):
    """A real local backend that raises on the jobs a test marks: as a bug in building the backend's
    object would (submit), or as an API that refuses one patch would (cancel)."""

    refuse_cancel: set[str]

    def submit(self, spec: JobSpec) -> BackendStatus:
        if spec.labels.get("bad") == "submit":
            raise ValueError(f"Invalid value: {spec.tenant!r}: a label value must be 63 characters or less")
        return super().submit(spec)

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        if job_id in self.refuse_cancel:
            raise BackendError("admission webhook denied the request")
        super().cancel(job_id, force=force)


def test_a_job_the_backend_cannot_take_fails_alone_and_a_refused_cancel_holds_up_no_other(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, local_command=stand_in_command("--sleep", "30"), cancel_grace_seconds=30.0)
    backend = _Picky.from_settings(settings)
    assert isinstance(backend, _Picky)
    backend.refuse_cancel = set()
    c = Controller(create_app(settings, backend=backend))
    try:
        body = {"pool": "cpu", "config": {"run": {"steps": 2}}, "labels": {"bad": "submit"}}
        bad = c.request("POST", "/v1/jobs", json=body).json()["id"]
        stubborn, other = _submit(c, "stubborn"), _submit(c, "other")
        job = c.wait_for(bad, timeout=30)
        assert (job["state"], job["reason"]) == ("ERROR", "SubmitRejected") and "label value" in job["message"]
        c.wait_for(stubborn, {"RUNNING"}, timeout=30)
        backend.refuse_cancel.add(stubborn)
        for job_id in (stubborn, other):
            assert c.request("DELETE", f"/v1/jobs/{job_id}").status_code == 202
        assert c.wait_for(other, timeout=30)["state"] == "CANCELLED"  # its cancel went out after the refused one
        registry = c.services.metrics.registry
        refused = {"operation": "cancel", "cause": "other"}
        wait_until(lambda: registry.get_sample_value("foxhunt_backend_errors_total", refused), 30, what="a refusal")
        assert c.request("GET", f"/v1/jobs/{stubborn}").json()["state"] == "RUNNING"
        assert c.request("GET", "/readyz").status_code == 200  # the passes themselves succeed
        backend.refuse_cancel.clear()
        assert c.wait_for(stubborn, timeout=30)["state"] == "CANCELLED"
    finally:
        c.close()
        c.kill_jobs()


class _BuggyList(LocalBackend):
    """list_statuses raises what no handler expects, until `fixed`."""

    fixed = False

    def list_statuses(self) -> list[BackendStatus]:
        if not self.fixed:
            raise KeyError("status")
        return super().list_statuses()


def test_readyz_is_503_while_passes_keep_failing(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    backend = _BuggyList.from_settings(settings)
    assert isinstance(backend, _BuggyList)
    c = Controller(create_app(settings, backend=backend))
    try:
        failing = wait_until(
            lambda: (r := c.request("GET", "/readyz")).status_code == 503 and r.json(), 30, what="readyz to fail"
        )
        assert failing["detail"].startswith(f"reconciler failing: the last {FAILING_PASSES}")
        assert "KeyError" in failing["detail"]
        backend.fixed = True
        wait_until(lambda: c.request("GET", "/readyz").status_code == 200, 30, what="readyz to recover")
    finally:
        c.close()


class _Counting(LocalBackend):
    """A real local backend that counts full lists (one per full reconcile pass)."""

    lists = 0

    def list_statuses(self) -> list[BackendStatus]:
        self.lists += 1
        return super().list_statuses()


def test_a_new_job_is_handed_over_by_a_submit_pass_not_a_full_one(tmp_path: Path) -> None:
    """A submission wakes a pass that hands the queued jobs over and lists nothing: a full pass per
    submission read every active job, which made each submission cost O(active jobs)."""
    settings = make_settings(tmp_path, reconcile_interval_seconds=600.0)
    backend = _Counting.from_settings(settings)
    assert isinstance(backend, _Counting)
    c = Controller(create_app(settings, backend=backend))
    try:
        wait_until(lambda: backend.lists >= 1, 30, 0.05, what="the first full pass")
        for key in ("a", "b", "c"):
            job_id = _submit(c, key)
            path = f"/v1/jobs/{job_id}"
            wait_until(lambda path=path: c.request("GET", path).json()["state"] != "QUEUED", 30, 0.05)
        assert backend.lists == 1  # the full pass keeps its period (10 minutes here)
        c.services.reconciler.wake()  # a cancel or retry still gets a full pass at once
        wait_until(lambda: backend.lists >= 2, 30, 0.05, what="a full pass when woken")
    finally:
        c.close()
        c.kill_jobs()


def test_a_pass_records_the_jobs_it_hands_over_in_one_transaction(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    settings = make_settings(tmp_path, run_reconciler=False)
    c = controller_factory(settings)
    ids = [_submit(c, f"k{i}") for i in range(12)]
    store = c.services.store
    writes: list[bool] = []
    tx = store._tx

    def counted(*, write: bool = False) -> object:
        writes.append(write)
        return tx(write=write)

    store._tx = counted  # type: ignore[method-assign]
    assert c.services.reconciler.submit_once()
    assert writes.count(True) == 1, f"{writes.count(True)} write transactions to hand over 12 jobs"
    states = {store.get_job(job_id).state.value for job_id in ids}
    assert states <= {"PENDING", "RUNNING", "SUCCEEDED"} and all(store.get_job(i).submitted_attempt == 0 for i in ids)


def test_a_periodic_pass_after_one_job_changed_reads_only_that_job(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """Between complete passes, a pass over the local backend applies the statuses of the jobs that changed since
    the last pass (and of the running one) and lists nothing: the pass over thousands of waiting jobs every
    interval held the interpreter long enough to be the open loop's p99."""
    settings = make_settings(tmp_path, local_command=stand_in_command("--sleep", "30"), run_reconciler=False)
    c = controller_factory(settings)
    ids = [_submit(c, f"k{i}") for i in range(6)]
    reconciler, store, backend = c.services.reconciler, c.services.store, c.services.backend
    assert isinstance(backend, LocalBackend)
    assert reconciler.reconcile_once()  # hands the jobs over
    wait_until(lambda: backend.status(ids[0]).state.value == "RUNNING", 30, 0.05, what="the first job to run")
    assert reconciler.reconcile_once()
    assert store.get_job(ids[0]).state.value == "RUNNING"
    backend.cancel(ids[3])  # a change the store has not seen (the watch thread is off here)
    applied: list[str] = []
    lists: list[int] = []
    apply_status, list_statuses = store.apply_status, backend.list_statuses

    def counted_apply(status: BackendStatus, **kwargs: object) -> bool:
        applied.append(status.job_id)
        return apply_status(status, **kwargs)  # type: ignore[arg-type]

    def counted_list() -> list[BackendStatus]:
        lists.append(1)
        return list_statuses()

    store.apply_status = counted_apply  # type: ignore[method-assign]
    backend.list_statuses = counted_list  # type: ignore[method-assign]
    assert reconciler.reconcile_once(complete=False)
    assert not lists and sorted(applied) == sorted([ids[0], ids[3]])
    assert (store.get_job(ids[3]).state.value, store.get_job(ids[4]).state.value) == ("CANCELLED", "PENDING")
    applied.clear()
    assert reconciler.reconcile_once()  # a complete pass reads every job again
    assert len(lists) == 1 and sorted(applied) == sorted([ids[0], ids[1], ids[2], ids[4], ids[5]])


class _Incremental(_Counting):
    """A real local backend that counts the incremental passes' asks too."""

    asks = 0

    def changed_statuses(
        self, since: int | None, *, also: Collection[str] = ()
    ) -> tuple[list[BackendStatus] | None, int]:
        self.asks += since is not None
        return super().changed_statuses(since, also=also)


def test_periodic_passes_read_what_changed_and_every_nth_reads_every_job(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, reconcile_interval_seconds=0.05)
    backend = _Incremental.from_settings(settings)
    assert isinstance(backend, _Incremental)
    c = Controller(create_app(settings, backend=backend))
    try:
        c.services.reconciler.complete_sync_every = 4
        wait_until(lambda: backend.asks >= 9 and backend.lists >= 3, 30, 0.05, what="passes of both kinds")
        assert backend.lists <= backend.asks
    finally:
        c.close()
        c.kill_jobs()


class _Polling:
    """A backend whose watch polls (as the local one's watch_polls): each poll's changes as a list."""

    def watch_polls(self, *, timeout_seconds: float | None = None) -> Iterator[list[BackendStatus]]:
        yield [_status("a"), _status("b")]
        yield [_status("c")]


class _Streaming:
    """A backend whose watch streams one status at a time (as Argo's)."""

    def watch(self, *, timeout_seconds: float | None = None) -> Iterator[BackendStatus]:
        yield _status("a")
        yield _status("b")


def _status(job_id: str) -> BackendStatus:
    return BackendStatus(job_id=job_id, state=JobState.RUNNING, attempt=0)


def test_the_watch_records_a_polls_changes_together_and_a_streamed_status_alone(store: Store) -> None:
    """What the watch thread hands Store.apply_statuses, one transaction each: a polling backend's poll (a change
    each cost two transactions of its own), a streaming backend's every status as it comes."""

    def batches(backend: object) -> list[list[str]]:
        reconciler = Reconciler(
            store,
            backend,  # type: ignore[arg-type]
            Pools.local(0),
            ControllerMetrics(CollectorRegistry()),
            interval_seconds=5,
            grace_seconds=30,
        )
        return [[status.job_id for status in batch] for batch in reconciler._watch_batches()]

    assert batches(_Polling()) == [["a", "b"], ["c"]]
    assert batches(_Streaming()) == [["a"], ["b"]]
