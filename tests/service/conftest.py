"""Shared fixtures of the service tests: an app over a temporary SQLite store, tokens per tenant."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.api.deps import Services
from service.app import create_app
from service.auth import create_token
from service.backends.local import LocalBackend
from service.settings import Settings
from service.store import Store
from tests.polling import wait_until
from tests.service.factories import make_settings

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "ERROR"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


class Controller:
    """One running controller (app + TestClient) and bearer headers for a few tenants."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.client = TestClient(app)
        self.client.__enter__()
        self.services: Services = app.state.services
        store = self.services.store
        self.headers: dict[str, dict[str, str]] = {}
        for name, tenant, admin in (("alice", "team-a", False), ("bob", "team-b", False), ("root", "ops", True)):
            secret, _ = create_token(store, name=name, tenant=tenant, admin=admin)
            self.headers[name] = {"Authorization": f"Bearer {secret}"}

    def request(self, method: str, path: str, *, as_: str = "alice", **kwargs: Any) -> Any:
        headers = {**self.headers.get(as_, {}), **kwargs.pop("headers", {})}
        return self.client.request(method, path, headers=headers, **kwargs)

    def wait_for(self, job_id: str, states: set[str] = TERMINAL, *, timeout: float = 60.0, as_: str = "alice") -> Any:
        seen: list[str] = []

        def reached() -> Any:
            job = self.request("GET", f"/v1/jobs/{job_id}", as_=as_).json()
            seen.append(job["state"])
            return job["state"] in states and job

        try:
            return wait_until(reached, timeout)
        except AssertionError:
            raise AssertionError(f"job {job_id} stayed {seen[-1]} (wanted {sorted(states)})") from None

    def close(self) -> None:
        """Stop the app (idempotent); job processes live on, as after a controller crash."""
        if self.client is not None:
            self.client.__exit__(None, None, None)
            self.client = None  # type: ignore[assignment]

    def kill_jobs(self) -> None:
        """Kill every job process this controller's local backend still runs."""
        backend = self.services.backend
        if isinstance(backend, LocalBackend):
            for status in backend.list_statuses():
                if not status.state.terminal:
                    backend.cancel(status.job_id, force=True)


@pytest.fixture
def controller_factory() -> Iterator[Callable[[Settings], Controller]]:
    """Start controllers; all are shut down at the end (a restart test starts two over one DB)."""
    started: list[Controller] = []

    def start(settings: Settings) -> Controller:
        controller = Controller(create_app(settings))
        started.append(controller)
        return controller

    yield start
    for controller in started:
        controller.close()
        controller.kill_jobs()


@pytest.fixture
def controller(settings: Settings, controller_factory: Callable[[Settings], Controller]) -> Controller:
    return controller_factory(settings)


@pytest.fixture
def gc_restored() -> Iterator[None]:
    """This process's garbage collector as it was, after a test that runs a serving process's start in it."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.fixture
def served_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A controller's settings as a serving process reads them, from FOXHUNT_* variables (no reconciler, no GPUs)."""
    settings = make_settings(tmp_path, run_reconciler=False)
    monkeypatch.setenv("FOXHUNT_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("FOXHUNT_JOBS_DIR", str(settings.jobs_dir))
    monkeypatch.setenv("FOXHUNT_POOLS_FILE", str(settings.pools_file))
    monkeypatch.setenv("FOXHUNT_RUN_RECONCILER", "0")
    monkeypatch.setenv("FOXHUNT_LOCAL_GPUS", "0")
    return settings


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """One real PostgreSQL server for the session; each test gets its own database on it."""
    from tests.service.postgres import postgres_server

    with postgres_server() as url:
        yield url


_databases = iter(range(1_000_000))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind the store supports."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    from tests.service.postgres import create_database

    admin_url: str = request.getfixturevalue("postgres_admin_url")
    return create_database(admin_url, f"t{next(_databases)}")


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    """A migrated store on each database kind."""
    store = Store(database_url)
    store.migrate()
    yield store
    store.dispose()
