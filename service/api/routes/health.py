"""Liveness and readiness, outside /v1 and without auth (probes carry no token)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError

from service.api.deps import BackendDep, ServicesDep, StoreDep
from service.api.errors import problems
from service.api.schemas import Health
from service.errors import ServiceUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> Health:
    """The process answers."""
    return Health(status="ok")


@router.get("/readyz", responses=problems(503))
def readyz(store: StoreDep, backend: BackendDep, services: ServicesDep) -> Health:
    """The store and the backend both answer, and the reconciler is not failing pass after pass."""
    try:
        store.ping()
    except SQLAlchemyError as error:
        raise ServiceUnavailable(f"store unreachable: {type(error).__name__}") from error
    backend.ping()
    failing = services.reconciler.failing
    if failing is not None:
        raise ServiceUnavailable(f"reconciler failing: {failing}")
    return Health(status="ready")
