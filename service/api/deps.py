"""Typed dependencies: handlers declare what they need (`store: StoreDep`) and get it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.auth import Principal, TokenCache, authenticate, cached_principal
from service.backends.base import Backend
from service.errors import Forbidden, Unauthorized
from service.jobs import JobService
from service.metrics import ControllerMetrics
from service.pools import Pools
from service.progress import token_attempt
from service.reconciler import Reconciler
from service.settings import Settings
from service.store import Store
from service.workers import ReconcilerSeat


@dataclass
class Services:
    """What create_app builds once and every request shares."""

    settings: Settings
    store: Store
    backend: Backend
    pools: Pools
    metrics: ControllerMetrics
    reconciler: Reconciler
    jobs: JobService
    tokens: TokenCache
    seat: ReconcilerSeat | None = None
    """With several worker processes: where this one stands (does it run the reconciler?)."""


# The dependencies below that do no I/O are `async def`: FastAPI runs a plain `def` dependency in a worker
# thread, a hop through the thread pool per dependency per request (a submission made three).


async def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def _store(request: Request) -> Store:
    return (await _services(request)).store


async def _backend(request: Request) -> Backend:
    return (await _services(request)).backend


async def _pools(request: Request) -> Pools:
    return (await _services(request)).pools


async def _jobs(request: Request) -> JobService:
    return (await _services(request)).jobs


_bearer = HTTPBearer(auto_error=False, description="A token from `foxhunt token create`.")


async def request_principal(request: Request) -> Principal:
    """The caller, from the request's Authorization header: from the token cache on the event loop; the store
    is asked (on a cache miss) in a worker thread. `TenantDep`'s, and POST /v1/jobs' own (no dependency to
    solve: that route documents the bearer scheme itself)."""
    services: Services = request.app.state.services
    if services.settings.auth_disabled:
        return Principal(tenant=services.settings.default_tenant, name=services.settings.default_tenant)
    header = request.headers.get("authorization")
    cached = cached_principal(services.tokens, header)
    return cached if cached is not None else await run_in_threadpool(authenticate, services.tokens, header)


async def _principal(
    request: Request, _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    """`request_principal`; the bearer scheme is a dependency so that the OpenAPI document names it."""
    return await request_principal(request)


@dataclass(frozen=True)
class ProgressGrant:
    """What a valid progress token grants: reports about this attempt of this job (the store checks that the
    attempt is still the job's current one)."""

    job_id: str
    attempt: int


def _progress_job(
    job_id: str, request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> ProgressGrant:
    """The job and attempt a progress report is about, once its bearer token proves to be their progress token."""
    if credentials is None:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <the job's progress token>'")
    secret = request.app.state.services.settings.progress_secret
    if secret is None:
        raise Forbidden("this controller takes no progress reports: FOXHUNT_PROGRESS_SECRET is not set")
    attempt = token_attempt(secret.get_secret_value(), job_id, credentials.credentials)
    if attempt is None:
        raise Forbidden(f"not the progress token of job {job_id}")
    return ProgressGrant(job_id, attempt)


ServicesDep = Annotated[Services, Depends(_services)]
StoreDep = Annotated[Store, Depends(_store)]
BackendDep = Annotated[Backend, Depends(_backend)]
PoolsDep = Annotated[Pools, Depends(_pools)]
JobsDep = Annotated[JobService, Depends(_jobs)]
TenantDep = Annotated[Principal, Depends(_principal)]
ProgressJobDep = Annotated[ProgressGrant, Depends(_progress_job)]
