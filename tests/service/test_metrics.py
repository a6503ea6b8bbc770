"""The controller's metric families on a fresh registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from service.domain import JobState
from service.metrics import ControllerMetrics


def test_verb_helpers_and_scrape_time_collectors() -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    metrics.record_submission("cpu", created=True)
    metrics.record_submission("cpu", created=False)
    metrics.record_backend_error("list", "unavailable")
    metrics.record_recovery("lost")
    metrics.record_request("GET", "/v1/jobs", 200, 0.003)
    counts = dict.fromkeys(JobState, 0) | {JobState.RUNNING: 2}
    metrics.watch_store(lambda: counts)
    metrics.watch_reconciler(lambda: None)
    value = registry.get_sample_value
    assert value("foxhunt_jobs_submitted_total", {"pool": "cpu", "outcome": "created"}) == 1
    assert value("foxhunt_jobs_submitted_total", {"pool": "cpu", "outcome": "existing"}) == 1
    assert value("foxhunt_backend_errors_total", {"operation": "list", "cause": "unavailable"}) == 1
    assert value("foxhunt_backend_errors_total", {"operation": "submit", "cause": "other"}) == 0
    assert value("foxhunt_reconcile_recoveries_total", {"cause": "lost"}) == 1
    assert (
        value(
            "foxhunt_api_request_duration_seconds_bucket",
            {"method": "GET", "route": "/v1/jobs", "status": "200", "le": "0.005"},
        )
        == 1
    )
    assert value("foxhunt_jobs", {"state": "RUNNING"}) == 2 and value("foxhunt_jobs", {"state": "QUEUED"}) == 0
    assert value("foxhunt_reconcile_lag_seconds") is None  # never reconciled: no sample rather than a lie
    counts[JobState.RUNNING] = 1
    assert value("foxhunt_jobs", {"state": "RUNNING"}) == 1


def test_reconcile_lag_grows_from_the_last_success() -> None:
    import time

    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    last = time.monotonic() - 5
    metrics.watch_reconciler(lambda: last)
    lag = registry.get_sample_value("foxhunt_reconcile_lag_seconds")
    assert lag is not None and 5 <= lag < 10
