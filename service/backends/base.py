"""The one interface every backend implements. Kubernetes details live only in argo.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from service.domain import BackendStatus, JobSpec


class BackendError(Exception):
    """Base of backend errors."""


class BackendUnavailable(BackendError):
    """The backend could not be reached. Never a reason to mark a job failed."""


class BackendNotFound(BackendError):
    """The backend has no object for this job (never created, or already garbage-collected)."""


class Backend(Protocol):
    """Blocking calls; the API runs them in a worker thread."""

    name: str

    def submit(self, spec: JobSpec) -> BackendStatus:
        """Start the job. Idempotent: submitting the same job_id again returns the existing job's status."""
        ...

    def status(self, job_id: str) -> BackendStatus:
        """Current status, or BackendNotFound."""
        ...

    def list_statuses(self) -> list[BackendStatus]:
        """Every job this backend holds: the reconciler's source of truth."""
        ...

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        """Graceful stop (exit handlers, last checkpoint); `force` terminates at once."""
        ...

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[str]:
        """Log lines; with `follow`, until the job ends. Empty strings may come between lines while
        nothing is written: they carry no text and let a consumer stop following."""
        ...

    def watch(self, *, timeout_seconds: float | None = None) -> Iterator[BackendStatus]:
        """Status changes as they happen (resuming after disconnects); ends after timeout_seconds."""
        ...

    def ping(self) -> None:
        """Raise BackendUnavailable unless the backend answers."""
        ...
