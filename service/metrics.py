"""Every Prometheus family of the controller, declared once, on an injected registry."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from service.domain import JobState

REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BACKEND_OPERATIONS = ("submit", "status", "list", "cancel", "logs", "watch", "ping")
BACKEND_CAUSES = ("unavailable", "not_found", "other")
API_RETRY_CAUSES = ("connection", "server_error", "throttled")
RECOVERY_CAUSES = (
    "resubmitted",
    "cancel_resent",
    "cancel_forced",
    "lost",
    "deadline",
    "watch_restarted",
    "bad_job",
)


class _JobsByState(Collector):
    """foxhunt_jobs{state}: read from the store at scrape time, so it is never stale."""

    def __init__(self, counts: Callable[[], dict[JobState, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("foxhunt_jobs", "Jobs in the store by state (QUEUED ... ERROR).", labels=["state"])
        for state, count in self._counts().items():
            family.add_metric([state.value], count)
        yield family


class _ReconcileLag(Collector):
    """foxhunt_reconcile_lag_seconds: time since the last full reconcile succeeded."""

    def __init__(self, last_success: Callable[[], float | None]) -> None:
        self._last_success = last_success

    def collect(self) -> Iterator[GaugeMetricFamily]:
        last = self._last_success()
        family = GaugeMetricFamily(
            "foxhunt_reconcile_lag_seconds", "Seconds since the store was last fully reconciled with the backend."
        )
        if last is not None:
            family.add_metric([], time.monotonic() - last)
        yield family


@runtime_checkable
class CountsApiCalls(Protocol):
    """A backend that counts its Kubernetes API retries (by cause) and watch relists (the Argo backend)."""

    retries: Mapping[str, int]
    relists: int


class _ArgoApiCalls(Collector):
    """foxhunt_argo_api_retries_total{cause} and foxhunt_argo_relists_total: the backend's own counts,
    read at scrape time."""

    def __init__(self, backend: CountsApiCalls) -> None:
        self._backend = backend

    def collect(self) -> Iterator[CounterMetricFamily]:
        retries = CounterMetricFamily(
            "foxhunt_argo_api_retries",
            "Kubernetes API calls of the Argo backend retried, by cause (connection, server_error, throttled).",
            labels=["cause"],
        )
        for cause in API_RETRY_CAUSES:
            retries.add_metric([cause], self._backend.retries.get(cause, 0))
        yield retries
        yield CounterMetricFamily(
            "foxhunt_argo_relists",
            "Full lists of Workflows the Argo backend's watch started from (the first, and after 410 Gone).",
            value=self._backend.relists,
        )


class ControllerMetrics:
    """The controller's metrics; verb helpers keep label values bounded."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.request_seconds = Histogram(
            "foxhunt_api_request_duration_seconds",
            "API request latency by method, route template and status code.",
            ["method", "route", "status"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self._request_children: dict[tuple[str, str, int], Histogram] = {}
        self.submissions = Counter(
            "foxhunt_jobs_submitted_total",
            "Job submissions by pool and outcome (created, existing).",
            ["pool", "outcome"],
            registry=registry,
        )
        self.backend_errors = Counter(
            "foxhunt_backend_errors_total",
            "Backend call failures by operation (submit, status, list, cancel, logs, watch, ping) "
            "and cause (unavailable, not_found, other).",
            ["operation", "cause"],
            registry=registry,
        )
        self.recoveries = Counter(
            "foxhunt_reconcile_recoveries_total",
            "Reconciler repairs by cause (resubmitted, cancel_resent, cancel_forced, lost, deadline, watch_restarted, "
            "bad_job: a queued job that could not be handed to the backend, set to ERROR so the pass goes on).",
            ["cause"],
            registry=registry,
        )
        self.reconcile_seconds = Histogram(
            "foxhunt_reconcile_duration_seconds",
            "Duration of one full reconcile pass.",
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        for operation in BACKEND_OPERATIONS:
            for cause in BACKEND_CAUSES:
                self.backend_errors.labels(operation, cause)
        for cause in RECOVERY_CAUSES:
            self.recoveries.labels(cause)

    def watch_store(self, counts: Callable[[], dict[JobState, int]]) -> None:
        self.registry.register(_JobsByState(counts))

    def watch_reconciler(self, last_success: Callable[[], float | None]) -> None:
        self.registry.register(_ReconcileLag(last_success))

    def watch_api_calls(self, backend: CountsApiCalls) -> None:
        self.registry.register(_ArgoApiCalls(backend))

    def record_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Called for every request on the event loop: the labelled child is looked up once per key."""
        key = (method, route, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.request_seconds.labels(method, route, str(status))
        child.observe(seconds)

    def record_submission(self, pool: str, *, created: bool) -> None:
        self.submissions.labels(pool, "created" if created else "existing").inc()

    def record_backend_error(self, operation: str, cause: str) -> None:
        self.backend_errors.labels(operation, cause).inc()

    def record_recovery(self, cause: str) -> None:
        self.recoveries.labels(cause).inc()
