"""Progress reports from a trainer pod to the controller: `PUT {url}/v1/jobs/{job id}/progress`.

On Argo the controller cannot read the pod's progress.json, so `trainer train` sends each report it
writes there to the controller, authorised by the job's progress token. Configured by the pod's
environment: FOXHUNT_PROGRESS_URL (the controller's base URL), FOXHUNT_PROGRESS_TOKEN and
FOXHUNT_JOB_ID; without all three nothing is sent (a laptop run, whose controller reads progress.json).

Training never waits for the network: `update` only swaps the latest report in, and one background
thread sends it (latest wins; at most one request per `min_interval`). The latest report is sent again
every `heartbeat` seconds, so a lost request is repaired and the controller's figures are never older
than that while the trainer runs. Network and HTTP errors are logged once and otherwise ignored.
Standard library only: no torch, no HTTP client dependency.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

ENV_URL, ENV_TOKEN, ENV_JOB_ID = "FOXHUNT_PROGRESS_URL", "FOXHUNT_PROGRESS_TOKEN", "FOXHUNT_JOB_ID"
HEARTBEAT_SECONDS = 15.0
"""Resend period of the latest report: half the 30 s bound on the age of the controller's figures."""
MIN_INTERVAL_SECONDS = 1.0
REQUEST_TIMEOUT_SECONDS = 5.0

log = logging.getLogger(__name__)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: a non-finite loss becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class ProgressReporter:
    """Sends the latest progress report of one job on a background thread; see the module docstring."""

    def __init__(
        self,
        url: str,
        job_id: str,
        token: str,
        *,
        heartbeat: float = HEARTBEAT_SECONDS,
        min_interval: float = MIN_INTERVAL_SECONDS,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        self.endpoint = f"{url.rstrip('/')}/v1/jobs/{quote(job_id, safe='')}/progress"
        self._token = token
        self._heartbeat = heartbeat
        self._min_interval = min_interval
        self._timeout = timeout
        self._cond = threading.Condition()
        self._latest: bytes | None = None
        self._fresh = False  # the latest report has not been sent yet
        self._closed = False
        self._warned = False
        self.sent = 0  # requests the controller accepted
        self._thread = threading.Thread(target=self._run, name="progress-reporter", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ProgressReporter | None:
        """A reporter if the pod's environment names the controller, the token and the job; else None."""
        url, token, job_id = (env.get(name, "").strip() for name in (ENV_URL, ENV_TOKEN, ENV_JOB_ID))
        return cls(url, job_id, token) if url and token and job_id else None

    def update(self, progress: Mapping[str, Any]) -> None:
        """Make `progress` the report to send; returns at once."""
        body = json.dumps(_finite(progress), separators=(",", ":")).encode()
        with self._cond:
            self._latest, self._fresh = body, True
            self._cond.notify_all()

    def close(self) -> None:
        """Send a report not sent yet, then stop (waiting at most about one request's timeout)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(self._timeout + 1.0)

    def _next(self, last_sent: float) -> tuple[bytes | None, bool]:
        """Wait until a report is due: (body to send or None, whether the reporter is closing)."""
        with self._cond:
            while True:
                since = time.monotonic() - last_sent
                if self._closed:
                    body = self._latest if self._fresh else None
                    self._fresh = False
                    return body, True
                new_due = self._fresh and since >= self._min_interval
                if new_due or (self._latest is not None and since >= self._heartbeat):
                    self._fresh = False
                    return self._latest, False
                due = self._min_interval if self._fresh else self._heartbeat
                self._cond.wait(due - since if self._latest is not None else None)

    def _run(self) -> None:
        last_sent = -math.inf
        while True:
            body, closing = self._next(last_sent)
            if body is not None:
                self._send(body)
                last_sent = time.monotonic()
            if closing:
                return

    def _send(self, body: bytes) -> None:
        request = urllib.request.Request(
            self.endpoint,
            data=body,
            method="PUT",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                response.read()
            self.sent += 1
        except (urllib.error.URLError, OSError, ValueError) as error:  # HTTPError is a URLError
            if not self._warned:
                self._warned = True
                log.warning("progress report to %s failed (reported once; training goes on): %s", self.endpoint, error)
