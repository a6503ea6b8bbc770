"""create_app(settings): the controller as an ASGI app. Nothing is built at import."""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import errors
from service.api.body_limit import BodyLimit
from service.api.deps import Services
from service.api.middleware import HttpMiddleware
from service.api.routes import health, jobs, pools
from service.auth import TokenCache
from service.backends.base import Backend
from service.jobs import JobService
from service.metrics import ControllerMetrics, CountsApiCalls
from service.pools import Pools
from service.reconciler import Reconciler
from service.settings import Settings
from service.store import Store
from service.workers import QUEUED, WAKE, ReconcilerSeat


def build_backend(settings: Settings) -> Backend:
    """The configured backend; the Argo one (and the kubernetes client) is imported only when chosen."""
    if settings.backend == "argo":
        from service.backends.argo import ArgoBackend

        backend: Backend = ArgoBackend.from_settings(settings)
        return backend
    from service.backends.local import LocalBackend

    return LocalBackend.from_settings(settings)


def build_pools(settings: Settings, backend: Backend) -> Pools:
    if settings.pools_file is not None:
        return Pools.load(settings.pools_file)
    if settings.backend == "argo":
        raise ValueError("FOXHUNT_POOLS_FILE is required with the argo backend")
    return Pools.local(int(getattr(backend, "gpus", 0)))


class _RequestMetrics(HttpMiddleware):
    """Latency by route template."""

    def __init__(self, app: ASGIApp, metrics: ControllerMetrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = scope.get("route")
            template = route.path if isinstance(route, APIRoute) else "unmatched"
            self.metrics.record_request(scope["method"], template, status, time.perf_counter() - started)


GC_YOUNG_THRESHOLD = 20_000
"""Allocations between two young collections (Python's default 700)."""


def freeze_startup_objects() -> None:
    """For a serving process, once its app is built (`foxhunt serve`; not create_app, which tests call many times).

    What the process built before serving (modules, the app, SQLAlchemy's and pydantic's structures) stays for its
    lifetime: moved out of the cyclic garbage collector's generations (gc.freeze), no full collection walks it again.
    And a young collection every GC_YOUNG_THRESHOLD allocations, not 700: a request's objects are mostly freed by
    their reference counts before one runs, instead of being promoted and walked again by the older collections.
    Under 100 concurrent submissions the collector took about a tenth of the server's CPU, and its full
    collections 10 to 100 ms each with the interpreter held (docs/benchmarks/submit-latency.md, round 4)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD)


def _start_reconciling(reconciler: Reconciler, elector: Any) -> None:
    if elector is not None:
        elector.start()
    reconciler.start()


def _stop_reconciling(reconciler: Reconciler, elector: Any) -> None:
    reconciler.stop()
    if elector is not None:
        elector.stop()  # after the last pass: then the Lease is released


def app_from_environment() -> FastAPI:
    """The app of one worker process of `foxhunt serve --workers N` (uvicorn's factory): settings from FOXHUNT_*."""
    app = create_app(Settings())
    freeze_startup_objects()
    return app


def create_app(
    settings: Settings, *, backend: Backend | None = None, registry: CollectorRegistry | None = None
) -> FastAPI:
    """Build store, backend, pools, metrics and reconciler from `settings`; start threads in the lifespan."""
    store = Store(settings.database_url)
    if settings.migrate_on_start:
        store.migrate()
    backend = backend if backend is not None else build_backend(settings)
    pools_config = build_pools(settings, backend)
    metrics = ControllerMetrics(registry if registry is not None else CollectorRegistry())
    elector = None
    if settings.leader_election_enabled and settings.run_reconciler:
        from service.leader import LeaderElector

        elector = LeaderElector.from_settings(settings, on_change=lambda _leading: reconciler.wake())
    reconciler = Reconciler(
        store,
        backend,
        pools_config,
        metrics,
        interval_seconds=settings.reconcile_interval_seconds,
        grace_seconds=settings.cancel_grace_seconds,
        leader=elector,
    )
    seat: ReconcilerSeat | None = None
    wake, queued = reconciler.wake, reconciler.queued
    if settings.run_reconciler and settings.reconciler_lock_file is not None:  # one of several workers
        seat = ReconcilerSeat(
            settings.reconciler_lock_file,
            start=lambda: _start_reconciling(reconciler, elector),
            stop=lambda: _stop_reconciling(reconciler, elector),
            queued=reconciler.queued,
            wake=reconciler.wake,
        )
        wake, queued = partial(seat.notify, WAKE), partial(seat.notify, QUEUED)
    metrics.watch_store(store.counts_by_state)
    metrics.watch_reconciler(lambda: reconciler.last_success)
    if isinstance(backend, CountsApiCalls):
        metrics.watch_api_calls(backend)
    services = Services(
        settings=settings,
        store=store,
        backend=backend,
        pools=pools_config,
        metrics=metrics,
        reconciler=reconciler,
        jobs=JobService(store, pools_config, metrics, wake, datasets=settings.dataset_access, queued=queued),
        tokens=TokenCache(store, settings.token_cache_seconds),
        seat=seat,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if seat is not None:
            seat.open()  # the reconciler starts if and when this worker holds the lock
        elif settings.run_reconciler:
            _start_reconciling(reconciler, elector)
        try:
            yield
        finally:
            if seat is not None:
                seat.close()
            else:
                _stop_reconciling(reconciler, elector)
            store.dispose()

    app = FastAPI(
        title="foxhunt controller",
        version="1",
        summary="Training jobs for the foxhunt trainer, on GPU pools or this machine.",
        lifespan=lifespan,
        generate_unique_id_function=lambda route: f"{route.tags[0]}-{route.name}" if route.tags else route.name,
    )
    app.state.services = services
    errors.install(app)
    app.include_router(jobs.router)
    app.include_router(pools.router)
    app.include_router(health.router)

    @app.get("/metrics", include_in_schema=False)
    def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            app.openapi_schema = errors.problem_openapi(schema, [pool.name for pool in pools_config])
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_seconds=settings.body_timeout_seconds)
    app.add_middleware(_RequestMetrics, metrics=metrics)  # outermost: refused bodies are counted too
    return app
