"""Leader election: of two controller replicas against the fake API server, only the Lease holder
reconciles; when it dies, the other takes over once the Lease has expired; a graceful stop hands over."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from service.app import create_app
from service.backends.local import LocalBackend
from service.domain import BackendStatus, JobSpec
from service.leader import LeaderElector
from service.metrics import ControllerMetrics
from service.pools import Pools
from service.reconciler import Reconciler
from service.store import Store
from tests.polling import wait_until
from tests.service.backends.conftest import argo_backend, kube_client
from tests.service.conftest import Controller
from tests.service.factories import make_settings, stand_in_command
from tests.service.fake_kube import FakeKube
from tests.service.postgres import create_database
from tests.service.test_store import new_job

LEASE = "foxhunt-controller"
LEASE_SECONDS = 1


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube(namespace="foxhunt") as fake:
        yield fake


@pytest.fixture
def shared_database(postgres_admin_url: str) -> str:
    """One PostgreSQL database both replicas use, as in a cluster."""
    return create_database(postgres_admin_url, f"leader_{uuid.uuid4().hex[:12]}")


def _replica(tmp_path: Path, fake: FakeKube, database_url: str) -> Controller:
    tmp_path.mkdir()
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    settings = make_settings(
        tmp_path,
        database_url=database_url,
        kubeconfig=kubeconfig,
        argo_namespace=fake.namespace,
        leader_election=True,
        leader_election_lease_seconds=LEASE_SECONDS,
        leader_election_renew_deadline_seconds=0.6,
        leader_election_retry_seconds=0.1,
        reconcile_interval_seconds=0.1,
    )
    return Controller(create_app(settings, backend=argo_backend(fake)))


def _elector(c: Controller) -> LeaderElector:
    elector = c.services.reconciler.leader
    assert isinstance(elector, LeaderElector)
    return elector


def _passes(c: Controller) -> float:
    return c.services.metrics.registry.get_sample_value("foxhunt_reconcile_duration_seconds_count") or 0.0


def _holder(fake: FakeKube) -> Any:
    lease = fake.lease(LEASE)
    return lease and lease["spec"].get("holderIdentity")


def test_only_the_lease_holder_reconciles_and_the_other_takes_over_after_expiry(
    tmp_path: Path, fake: FakeKube, shared_database: str
) -> None:
    first = _replica(tmp_path / "a", fake, shared_database)
    second: Controller | None = None
    try:
        wait_until(lambda: first.services.reconciler.leading, 10, what="the first replica to lead")
        second = _replica(tmp_path / "b", fake, shared_database)
        assert _holder(fake) == _elector(first).identity
        job = second.request("POST", "/v1/jobs", json={"pool": "cpu", "config": {"run": {"steps": 2}}}).json()
        wait_until(lambda: [w for w in fake.workflows() if w["metadata"]["name"] == job["id"]], 10, what="a Workflow")
        seen = _passes(first)
        wait_until(lambda: _passes(first) >= seen + 5, 10, what="five more passes of the leader")
        assert _passes(second) == 0 and not second.services.reconciler.leading
        # the leader dies: it neither renews nor releases its Lease
        first.services.reconciler.stop()
        _elector(first).stop(release=False)
        died = time.monotonic()
        wait_until(lambda: second.services.reconciler.leading, 10, what="the second replica to take over")
        assert time.monotonic() - died > LEASE_SECONDS * 0.8  # not before the Lease expired
        assert _holder(fake) == _elector(second).identity
        lease = fake.lease(LEASE)
        assert lease is not None and lease["spec"]["leaseTransitions"] == 1
        wait_until(lambda: _passes(second) > 0, 10, what="the new leader's first pass")
        second.request("DELETE", f"/v1/jobs/{job['id']}")  # the new leader sends the cancel
        wait_until(lambda: fake.workflow(job["id"])["spec"].get("shutdown"), 10, what="the Workflow's shutdown")
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_graceful_stop_releases_the_lease_to_the_other_replica(
    tmp_path: Path, fake: FakeKube, shared_database: str
) -> None:
    first = _replica(tmp_path / "a", fake, shared_database)
    second = _replica(tmp_path / "b", fake, shared_database)
    try:
        wait_until(lambda: first.services.reconciler.leading or second.services.reconciler.leading, 10)
        leader, other = (first, second) if first.services.reconciler.leading else (second, first)
        leader.close()  # the lifespan ends: the last pass, then the Lease is released
        lease_events = [e.obj for e in fake.state.events if e.resource == "leases"]
        assert any(e["spec"].get("holderIdentity") is None for e in lease_events)  # released: held by nobody
        wait_until(lambda: other.services.reconciler.leading, 10, what="the other replica to lead")
        lease = fake.lease(LEASE)
        assert lease is not None and lease["spec"]["holderIdentity"] == _elector(other).identity
        assert lease["spec"]["leaseTransitions"] == 1
    finally:
        first.close()
        second.close()


def test_lease_timings_must_nest() -> None:
    with pytest.raises(ValueError, match="retry .* < renew deadline .* < lease duration"):
        LeaderElector(
            None,  # type: ignore[arg-type]
            namespace="ns",
            name="l",
            identity="me",
            lease_seconds=1,
            renew_deadline_seconds=2.0,
            retry_seconds=0.1,
        )


class Clock:
    """A monotonic clock the test moves: a stall of any length, without waiting for it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _stallable_elector(fake: FakeKube, clock: Clock) -> LeaderElector:
    """An elector whose renew thread is not started: the test decides when it renews (here: never again)."""
    return LeaderElector(
        client.CoordinationV1Api(kube_client(fake)),
        namespace=fake.namespace,
        name=LEASE,
        identity="stalled",
        lease_seconds=15,
        renew_deadline_seconds=10,
        retry_seconds=2,
        clock=clock,
    )


def test_a_holder_that_has_not_renewed_for_the_renew_deadline_no_longer_leads(fake: FakeKube) -> None:
    clock = Clock()
    elector = _stallable_elector(fake, clock)
    assert elector.attempt() and elector.leading
    clock.now += 9.9
    assert elector.leading  # within the renew deadline
    clock.now += 0.2  # stalled past it: the election thread never ran to clear its flag
    assert not elector.leading
    assert elector.attempt() and elector.leading  # the Lease is still ours: renewed, leading again


class StallingBackend:
    """A real LocalBackend whose calls are recorded; the first submit stalls the process past the renew
    deadline (the clock jumps, as after a SIGSTOP), as if the replica froze in the middle of a pass."""

    def __init__(self, inner: LocalBackend, clock: Clock, stall: float) -> None:
        self.inner = inner
        self.name = inner.name
        self.clock = clock
        self.stall = stall
        self.calls: list[str] = []

    def submit(self, spec: JobSpec) -> BackendStatus:
        self.calls.append(f"submit {spec.job_id}")
        status = self.inner.submit(spec)
        self.clock.now += self.stall
        return status

    def status(self, job_id: str) -> BackendStatus:
        self.calls.append(f"status {job_id}")
        return self.inner.status(job_id)

    def list_statuses(self) -> list[BackendStatus]:
        self.calls.append("list")
        return self.inner.list_statuses()

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        self.calls.append(f"cancel {job_id}")
        self.inner.cancel(job_id, force=force)

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[str]:
        return self.inner.logs(job_id, follow=follow)

    def watch(self, *, timeout_seconds: float | None = None) -> Iterator[BackendStatus]:
        self.calls.append("watch")
        return self.inner.watch(timeout_seconds=timeout_seconds)

    def ping(self) -> None:
        self.inner.ping()


def test_a_leader_stalled_past_its_renew_deadline_makes_no_further_backend_call(
    tmp_path: Path, fake: FakeKube, store: Store
) -> None:
    """A replica frozen mid-pass wakes with its `leading` flag still set: it must not go on acting."""
    clock = Clock()
    elector = _stallable_elector(fake, clock)
    inner = LocalBackend(tmp_path / "jobs", command=stand_in_command(), gpus=0, poll_seconds=0.05)
    backend = StallingBackend(inner, clock, stall=10.5)
    for job_id in ("job-a", "job-b"):
        store.insert_job(new_job(job_id, pool="local"))
    reconciler = Reconciler(
        store,
        backend,
        Pools.local(0),
        ControllerMetrics(CollectorRegistry()),
        interval_seconds=5,
        grace_seconds=30,
        leader=elector,
    )
    assert elector.attempt()
    assert reconciler.reconcile_once() is False, backend.calls  # the pass ended at the first call after the stall
    assert backend.calls == ["submit job-a"]  # neither job-b's submit nor the list went out
    assert reconciler.failing is None and reconciler.failed_passes == 0  # not a failure: another replica's turn
    backend.calls.clear()
    assert reconciler.reconcile_once() is False  # a pass that starts after the deadline does nothing at all
    assert backend.calls == []
    assert [job.id for job in store.jobs_to_submit()] == ["job-b"]
    inner.cancel("job-a", force=True)
