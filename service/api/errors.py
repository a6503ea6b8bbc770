"""Every error the API returns is RFC 9457 problem+json; domain errors are mapped here, once."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.schemas import JobCreate, Problem, ProgressReport
from service.backends.base import BackendUnavailable
from service.errors import (
    BodyTimeout,
    BodyTooLarge,
    DatasetNotAllowed,
    DomainError,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    InvalidTransition,
    JobNotFound,
    QuotaExceeded,
    ServiceUnavailable,
    SettingNotAllowed,
    Unauthorized,
    UnknownPool,
)

PROBLEM_MEDIA_TYPE = "application/problem+json"
_STATUS: dict[type[Exception], tuple[int, str, str]] = {
    JobNotFound: (404, "job-not-found", "Job not found"),
    IdempotencyConflict: (409, "idempotency-conflict", "Idempotency key reused with a different request"),
    InvalidTransition: (409, "invalid-transition", "Not allowed in the job's current state"),
    QuotaExceeded: (429, "quota-exceeded", "GPU quota exceeded"),
    UnknownPool: (422, "unknown-pool", "Unknown pool"),
    DatasetNotAllowed: (422, "dataset-not-allowed", "Dataset not allowed"),
    SettingNotAllowed: (422, "setting-not-allowed", "Setting not allowed"),
    InvalidRequest: (400, "invalid-request", "Invalid request"),
    Unauthorized: (401, "unauthorized", "Authentication required"),
    Forbidden: (403, "forbidden", "Forbidden"),
    BodyTimeout: (408, "body-timeout", "Request body timeout"),
    BodyTooLarge: (413, "body-too-large", "Request body too large"),
    ServiceUnavailable: (503, "unavailable", "Service unavailable"),
    BackendUnavailable: (503, "backend-unavailable", "Backend unavailable"),
}
STORE_RETRY_AFTER_SECONDS = 1
"""Retry-After of a 503 while the database is out: the pool reconnects on the next request that finds it back."""

STORE_OUTAGES: tuple[type[Exception], ...] = (OperationalError, InterfaceError, PoolTimeout)
"""What the store raises while its database cannot serve (down, restarting, refusing or dropping connections, the
pool exhausted, SQLite's lock held past its timeout): transient, unlike a constraint or a bug."""

_TITLES = {
    400: "Bad request",
    404: "Not found",
    405: "Method not allowed",
    408: "Request body timeout",
    413: "Request body too large",
    422: "Invalid request body",
}


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    request: Request,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> ProblemResponse:
    body = Problem(
        type=f"urn:foxhunt:problem:{slug}",
        title=title,
        status=status,
        detail=detail,
        instance=request.url.path,
        **extra,
    )
    headers = {**(headers or {}), **({"WWW-Authenticate": "Bearer"} if status == 401 else {})}
    return ProblemResponse(body.model_dump(mode="json", exclude_none=True), status_code=status, headers=headers)


def domain_problem(request: Request, error: Exception) -> ProblemResponse:
    """The problem+json answer of a domain error (`_STATUS`); anything else is an internal 500."""
    for kind, (status, slug, title) in _STATUS.items():
        if isinstance(error, kind):
            return problem(status, slug, title, str(error), request)
    return problem(500, "internal", "Internal error", "unexpected error", request)


def _validation(request: Request, error: Exception) -> ProblemResponse:
    assert isinstance(error, RequestValidationError)
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in error.errors()
    ]
    if any(e["type"] == "json_invalid" for e in errors):
        return problem(400, "malformed-json", "Malformed JSON", "the request body is not valid JSON", request)
    detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
    return problem(422, "validation", "Invalid request", detail, request, errors=errors)


def _allowed_methods(request: Request) -> str | None:
    """Every method the OpenAPI document lists for this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, request.url.path):
            methods.update(m.upper() for m in operations)
    return ", ".join(sorted(methods)) or None


def _http(request: Request, error: Exception) -> ProblemResponse:
    assert isinstance(error, StarletteHTTPException)
    title = _TITLES.get(error.status_code, "Error")
    headers = dict(error.headers or {})
    if error.status_code == 405:
        allowed = _allowed_methods(request)
        if allowed:
            headers["Allow"] = allowed
    return problem(error.status_code, "http", title, str(error.detail), request, headers=headers)


def _store_unavailable(request: Request, error: Exception) -> ProblemResponse:
    """503 with Retry-After, naming only the error's kind (its text holds the database's host and name); handled
    here, the connection stays open and no traceback is logged per request."""
    detail = f"the job store is unavailable ({type(error).__name__}); retry"
    retry = {"Retry-After": str(STORE_RETRY_AFTER_SECONDS)}
    return problem(503, "store-unavailable", "Store unavailable", detail, request, headers=retry)


def _unexpected(request: Request, error: Exception) -> ProblemResponse:
    """A bug: problem+json 500 that names nothing internal. Starlette re-raises the error after this
    answer is sent, so the server still logs its traceback."""
    return problem(500, "internal", "Internal error", "unexpected error; the controller's log has the details", request)


def install(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _unexpected)
    app.add_exception_handler(DomainError, domain_problem)
    app.add_exception_handler(BackendUnavailable, domain_problem)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    for outage in STORE_OUTAGES:
        app.add_exception_handler(outage, _store_unavailable)


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for a route; the OpenAPI hook sets their media type to problem+json."""
    return {code: {"model": Problem, "description": _TITLES.get(code, "Problem details")} for code in codes}


def problem_openapi(schema: dict[str, Any], pools: list[str]) -> dict[str, Any]:
    """Every 4xx/5xx response is problem+json with the Problem schema; `pool` lists the configured pools."""
    ref = {"$ref": "#/components/schemas/Problem"}
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            for code, response in operation.get("responses", {}).items():
                if code[0] in "45":
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": ref}}
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    body = JobCreate.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(body.pop("$defs", {}))
    components["JobCreate"] = job_create = body
    # bodies read by dependencies (after authentication) that FastAPI therefore does not list itself
    progress = ProgressReport.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(progress.pop("$defs", {}))
    components["ProgressReport"] = progress
    if pools:
        job_create["properties"]["pool"] = {
            "anyOf": [{"type": "string", "enum": pools}, {"type": "null"}],
            "title": "Pool",
            "description": "GPU pool (one of the configured pools); the first pool if omitted.",
        }
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)
    return schema
