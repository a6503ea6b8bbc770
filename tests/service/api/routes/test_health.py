"""Probes and /metrics."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import sqlalchemy
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import Controller
from tests.service.factories import free_port, make_settings


def test_healthz_and_readyz_need_no_token(controller: Controller) -> None:
    assert controller.request("GET", "/healthz", as_="nobody").json() == {"status": "ok"}
    assert controller.request("GET", "/readyz", as_="nobody").json() == {"status": "ready"}


def test_readyz_is_503_when_the_store_is_unreachable(tmp_path: Path) -> None:
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/foxhunt"  # nothing listens there
    settings = make_settings(tmp_path, database_url=url, migrate_on_start=False, run_reconciler=False)
    with TestClient(create_app(settings)) as client:
        broken = client.get("/readyz")
    assert broken.status_code == 503 and broken.headers["content-type"] == "application/problem+json"
    assert broken.json()["detail"] == "store unreachable: OperationalError"


def test_metrics_expose_requests_jobs_by_state_and_submissions(controller: Controller) -> None:
    controller.request("POST", "/v1/jobs", json={"pool": "cpu", "config": {"run": {"steps": 1}}})
    controller.request("GET", "/v1/jobs/job-missing")
    text = controller.request("GET", "/metrics", as_="nobody").text
    assert 'foxhunt_jobs_submitted_total{outcome="created",pool="cpu"} 1.0' in text
    assert 'foxhunt_api_request_duration_seconds_count{method="GET",route="/v1/jobs/{job_id}",status="404"} 1.0' in text
    assert 'foxhunt_jobs{state="QUEUED"}' in text or 'foxhunt_jobs{state="RUNNING"}' in text
    assert 'foxhunt_backend_errors_total{cause="unavailable",operation="submit"} 0.0' in text


def test_a_database_outage_answers_503_with_retry_after_and_the_api_recovers(
    postgres_admin_url: str, tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """PostgreSQL refuses the controller's database and drops its connections (as in a restart or failover): reads
    and submissions answer 503 problem+json with Retry-After (a client's cue to retry, not a 500 bug), and once it
    accepts connections again the same controller answers as before, without a restart."""
    from tests.service.postgres import create_database

    name = f"outage_{uuid.uuid4().hex[:8]}"
    url = create_database(postgres_admin_url, name)
    controller = controller_factory(make_settings(tmp_path, database_url=url, run_reconciler=False))
    submit = {"pool": "cpu", "config": {"run": {"steps": 1}}}
    assert controller.request("POST", "/v1/jobs", json=submit).status_code == 201
    admin = sqlalchemy.create_engine(postgres_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
        connection.execute(
            sqlalchemy.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
            {"name": name},
        )
        try:
            for method, path, body in (("GET", "/v1/jobs", None), ("POST", "/v1/jobs", submit)):
                answer = controller.request(method, path, json=body)
                assert answer.status_code == 503, (method, answer.status_code, answer.text)
                assert answer.headers["content-type"] == "application/problem+json"
                assert answer.headers["retry-after"] == "1"
                assert answer.json()["type"] == "urn:foxhunt:problem:store-unavailable"
                assert name not in answer.text and "127.0.0.1" not in answer.text  # nothing of the server's
        finally:
            connection.execute(sqlalchemy.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
    admin.dispose()
    assert controller.request("GET", "/v1/jobs").status_code == 200
    assert controller.request("POST", "/v1/jobs", json=submit).status_code == 201
