"""Leader election: of two controller replicas against the fake API server, only the Lease holder
reconciles; when it dies, the other takes over once the Lease has expired; a graceful stop hands over."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
import yaml

from service.app import create_app
from service.leader import LeaderElector
from tests.polling import wait_until
from tests.service.backends.conftest import argo_backend
from tests.service.conftest import Controller
from tests.service.factories import make_settings
from tests.service.fake_kube import FakeKube

LEASE = "foxhunt-controller"
LEASE_SECONDS = 1


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube(namespace="foxhunt") as fake:
        yield fake


@pytest.fixture
def shared_database(postgres_admin_url: str) -> str:
    """One PostgreSQL database both replicas use, as in a cluster."""
    name = f"leader_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(postgres_admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return postgres_admin_url.rsplit("/", 1)[0] + f"/{name}"


def _replica(tmp_path: Path, fake: FakeKube, database_url: str) -> Controller:
    tmp_path.mkdir()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
                "users": [{"name": "controller", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "controller"}}],
                "current-context": "fake",
            }
        )
    )
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
