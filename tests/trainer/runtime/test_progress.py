"""trainer/runtime/progress.py: the pod's progress reports to the controller, against a real local HTTP server."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trainer.runtime.progress import ProgressReporter

WAIT = 30.0  # generous bound for a loaded machine; every wait ends on an event


class Controller:
    """Records each PUT (path, Authorization, JSON body); `gate` holds answers back while cleared."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.cond = threading.Condition()
        self.gate = threading.Event()
        self.gate.set()
        self.arrived = threading.Event()
        controller = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def do_PUT(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                controller.arrived.set()
                controller.gate.wait(WAIT)
                with controller.cond:
                    controller.requests.append((self.path, self.headers["Authorization"], body))
                    controller.cond.notify_all()
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait_for(self, n: int) -> list[tuple[str, str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.requests) >= n, WAIT), f"{len(self.requests)} < {n} requests"
            return list(self.requests)


@pytest.fixture
def controller() -> Iterator[Controller]:
    c = Controller()
    yield c
    c.gate.set()
    c.server.shutdown()
    c.server.server_close()


def test_from_env_needs_the_url_the_token_and_the_job() -> None:
    full = {"FOXHUNT_PROGRESS_URL": "http://c:8000/", "FOXHUNT_PROGRESS_TOKEN": "t", "FOXHUNT_JOB_ID": "job-1"}
    reporter = ProgressReporter.from_env(full)
    assert reporter is not None and reporter.endpoint == "http://c:8000/v1/jobs/job-1/progress"
    reporter.close()
    for missing in full:
        assert ProgressReporter.from_env({**full, missing: ""}) is None


def test_reports_go_to_the_jobs_endpoint_with_its_token_non_finite_as_null(controller: Controller) -> None:
    reporter = ProgressReporter(controller.url, "job-1", "tok")
    reporter.update({"step": 5, "breakdown_ms": {"sample": 0.5}, "losses": {"c51": float("nan")}})
    ((path, auth, body),) = controller.wait_for(1)
    reporter.close()
    assert (path, auth) == ("/v1/jobs/job-1/progress", "Bearer tok")
    assert body == {"step": 5, "breakdown_ms": {"sample": 0.5}, "losses": {"c51": None}}


def test_the_latest_report_wins_and_update_never_waits_for_the_network(controller: Controller) -> None:
    reporter = ProgressReporter(controller.url, "job-1", "tok", min_interval=0.0)
    controller.gate.clear()  # the controller is slow to answer
    reporter.update({"step": 1})
    assert controller.arrived.wait(WAIT)
    for step in range(2, 50):
        reporter.update({"step": step})  # returns at once though a request hangs
    controller.gate.set()
    requests = controller.wait_for(2)
    reporter.close()
    assert [body["step"] for _, _, body in requests] == [1, 49]


def test_the_latest_report_is_sent_again_each_heartbeat(controller: Controller) -> None:
    reporter = ProgressReporter(controller.url, "job-1", "tok", heartbeat=0.05)
    reporter.update({"step": 7})
    requests = controller.wait_for(3)
    reporter.close()
    assert {body["step"] for _, _, body in requests} == {7}


def test_close_sends_a_report_not_sent_yet(controller: Controller) -> None:
    reporter = ProgressReporter(controller.url, "job-1", "tok", min_interval=3600.0)
    reporter.update({"step": 1})
    controller.wait_for(1)
    reporter.update({"step": 2})  # within min_interval: held back
    reporter.close()
    assert [body["step"] for _, _, body in controller.wait_for(2)] == [1, 2]


def test_network_errors_are_logged_once_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trainer.runtime.progress"):
        reporter = ProgressReporter("http://127.0.0.1:9", "job-1", "tok", heartbeat=0.01, min_interval=0.0)
        for step in range(3):
            reporter.update({"step": step})
        done = threading.Event()
        threading.Thread(target=lambda: (reporter.close(), done.set()), daemon=True).start()
        assert done.wait(WAIT)
    assert reporter.sent == 0
    assert [r.getMessage().split(" failed")[0] for r in caplog.records] == [
        "progress report to http://127.0.0.1:9/v1/jobs/job-1/progress"
    ]
