"""Several worker processes on one host (`foxhunt serve --workers N`): the reconciler runs in exactly one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from service.settings import Settings
from tests.polling import wait_until
from tests.service.conftest import Controller
from tests.service.factories import make_settings


def _handed_over(c: Controller, key: str) -> None:
    body = {"config": {"run": {"steps": 2}}, "pool": "cpu"}
    job_id = c.request("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key}).json()["id"]
    path = f"/v1/jobs/{job_id}"
    wait_until(lambda: c.request("GET", path).json()["state"] != "QUEUED", 30, 0.05, what=f"{key} handed over")


def test_of_two_workers_one_reconciles_the_other_wakes_it_and_takes_over_when_it_stops(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """Two apps over one database and one lock file, as two worker processes are (flock locks of two opens
    exclude each other within one process too). The full pass's period is 10 minutes: a job queued in the
    worker without the reconciler reaches the backend through the holder's wake socket, not a period."""
    settings = make_settings(
        tmp_path, reconciler_lock_file=tmp_path / "reconciler.lock", reconcile_interval_seconds=600.0
    )
    first = controller_factory(settings)
    assert first.services.seat is not None
    wait_until(first.services.seat.holding.is_set, 10, 0.05, what="the first worker to take the reconciler")
    second = controller_factory(settings)
    second_seat = second.services.seat
    assert second_seat is not None
    assert not second_seat.holding.is_set() and not second.services.reconciler._threads  # one reconciler only
    _handed_over(second, "queued-in-the-other-worker")
    assert not second.services.reconciler._threads and first.services.reconciler._threads
    first.close()  # the holder exits: its lock goes with it
    wait_until(second_seat.holding.is_set, 10, 0.05, what="the second worker to take the reconciler over")
    assert second.services.reconciler._threads and not first.services.reconciler._threads
    _handed_over(second, "queued-after-the-take-over")
