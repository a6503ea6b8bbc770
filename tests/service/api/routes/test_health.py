"""Probes and /metrics."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from service.app import create_app
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
