"""/v1/jobs: submit, list, get, cancel, retry, logs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import StringConstraints, TypeAdapter, ValidationError

from service.api.deps import BackendDep, JobsDep, ProgressJobDep, StoreDep, TenantDep, request_principal
from service.api.errors import problems
from service.api.routes import V1
from service.api.schemas import (
    JobCreate,
    JobDetail,
    JobPage,
    JobPublic,
    JobQuery,
    PhaseEvent,
    ProgressReport,
)
from service.backends.base import Backend, BackendError, BackendNotFound
from service.domain import JobState
from service.errors import JobNotFound
from service.jobs import JobService
from service.store import JobRecord, Store, parse_label_selector

JOB_ID_MAX = 64
QUEUED_POLL_SECONDS = 0.2
"""How often a log follower of a queued job checks whether it has started."""

router = APIRouter(prefix=f"{V1}/jobs", tags=["jobs"], responses=problems(401, 422))


def _job_id(job_id: str) -> str:
    """The path's job id; one that no job can have (a NUL, too long for the store) is simply not found."""
    if "\x00" in job_id or len(job_id) > JOB_ID_MAX:
        raise JobNotFound(job_id[:JOB_ID_MAX].replace("\x00", "\\x00"))
    return job_id


JobId = Annotated[str, Depends(_job_id)]


def _public(job: JobRecord) -> JobPublic:
    return JobPublic(
        **job.model_dump(exclude={"events", "config", "runs"}), cancel_requested=job.cancel_requested_at is not None
    )


def _detail(job: JobRecord) -> JobDetail:
    """Validated once, from the record's own dump (a job's config is large: no intermediate models)."""
    data = job.model_dump(exclude={"events"})
    data["cancel_requested"] = job.cancel_requested_at is not None
    data["history"] = [PhaseEvent.model_validate(e, from_attributes=True) for e in job.events]
    return JobDetail.model_validate(data)


async def _strict_body(request: Request) -> JobCreate:
    """Strict JSON: `"5"` is not an integer and `0` is not a date, exactly as the schema says.

    A dependency declared after the caller's authentication (FastAPI reads a declared body parameter
    before every dependency): an unauthenticated request is refused with its body unread."""
    raw = await request.body()
    try:
        return JobCreate.model_validate_json(raw, strict=True)
    except ValidationError as error:
        raise RequestValidationError(error.errors(include_url=False, include_context=False), body=raw) from None


async def _progress_body(request: Request) -> ProgressReport:
    """The progress report, read once the job's progress token is checked (as `_strict_body`)."""
    raw = await request.body()
    try:
        return ProgressReport.model_validate_json(raw)
    except ValidationError as error:
        raise RequestValidationError(error.errors(include_url=False, include_context=False), body=raw) from None


IDEMPOTENCY_KEY_MAX = 256
_idempotency_key_type: TypeAdapter[str] = TypeAdapter(
    Annotated[str, StringConstraints(min_length=1, max_length=IDEMPOTENCY_KEY_MAX)]
)
_IDEMPOTENCY_KEY_PARAMETER = {
    "in": "header",
    "name": "idempotency-key",
    "required": False,
    "schema": {
        "anyOf": [{"maxLength": IDEMPOTENCY_KEY_MAX, "minLength": 1, "type": "string"}, {"type": "null"}],
        "title": "Idempotency-Key",
    },
}


def _idempotency_key(request: Request) -> str | None:
    """The Idempotency-Key header, checked as a declared `Header(min_length=1, max_length=256)` parameter was
    (the same 422)."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    try:
        return _idempotency_key_type.validate_python(key)
    except ValidationError as error:
        errors = [
            {**e, "loc": ("header", "idempotency-key")} for e in error.errors(include_url=False, include_context=True)
        ]
        raise RequestValidationError(errors) from None


# POST /v1/jobs solves no FastAPI dependency: its caller, body and key are read in the handler, in the order
# FastAPI's solving had (the caller first, so an unauthenticated request's body is never read; then the body,
# then the header), and its OpenAPI operation lists the header and the bearer scheme as before. Solving the
# four dependencies (the principal, its bearer scheme, the body, the header) was about a tenth of a
# submission's server CPU.
@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobDetail,
    openapi_extra={
        "parameters": [_IDEMPOTENCY_KEY_PARAMETER],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobCreate"}}},
        },
        "security": [{"HTTPBearer": []}],
    },
    responses={
        200: {"model": JobDetail, "description": "The job this key already created"},
        **problems(400, 408, 409, 413, 429),
    },
)
async def submit_job(request: Request) -> Response:
    """Queue a job. The same Idempotency-Key (or name) with the same body returns the same job (200)."""
    principal = await request_principal(request)
    body = await _strict_body(request)
    key = _idempotency_key(request)
    jobs: JobService = request.app.state.services.jobs
    # on the event loop: the submission waits for the store's group commit as a future, not in a worker thread
    job, created = await jobs.submit_async(principal, body, key)
    # JSON straight from pydantic-core: FastAPI would turn the model into a dict and json.dumps that
    return Response(
        _detail(job).model_dump_json(),
        status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        media_type="application/json",
    )


@router.get("", responses=problems(400))
def list_jobs(principal: TenantDep, store: StoreDep, query: Annotated[JobQuery, Query()]) -> JobPage:
    """Newest first; pages are stable under concurrent submissions."""
    labels = parse_label_selector(query.label_selector) if query.label_selector else None
    items, next_cursor = store.list_jobs(
        tenant=principal.visible_tenant, labels=labels, **query.model_dump(exclude={"label_selector"})
    )
    return JobPage(items=[_public(j) for j in items], next_cursor=next_cursor)


@router.get("/{job_id}", responses=problems(404))
def get_job(job_id: JobId, principal: TenantDep, store: StoreDep) -> JobDetail:
    return _detail(store.get_job(job_id, tenant=principal.visible_tenant))


@router.delete("/{job_id}", status_code=status.HTTP_202_ACCEPTED, responses=problems(404, 409))
def cancel_job(job_id: JobId, principal: TenantDep, jobs: JobsDep) -> JobDetail:
    """Graceful stop now, a forced one after the grace period."""
    jobs.cancel(principal, job_id)
    return _detail(jobs.store.get_job(job_id))


@router.post("/{job_id}/retry", status_code=status.HTTP_202_ACCEPTED, responses=problems(404, 409, 429))
def retry_job(job_id: JobId, principal: TenantDep, jobs: JobsDep) -> JobDetail:
    """Run a FAILED, CANCELLED or ERROR job again; it resumes from its checkpoint."""
    jobs.retry(principal, job_id)
    return _detail(jobs.store.get_job(job_id))


@router.put(
    "/{job_id}/progress",
    status_code=status.HTTP_204_NO_CONTENT,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ProgressReport"}}},
        }
    },
    responses=problems(400, 403, 404, 408, 409, 413),
)
def report_progress(
    job: ProgressJobDep, body: Annotated[ProgressReport, Depends(_progress_body)], store: StoreDep
) -> Response:
    """The trainer's progress (step, breakdown, epoch time; a pack's runs) while the job runs, sent from its pod.

    The bearer token is the job's progress token (the Workflow's `progress-token` parameter), not a
    user's token: it is good for the reports of this job's current attempt and nothing else."""
    store.record_progress(
        job.job_id,
        attempt=job.attempt,
        step=body.step,
        breakdown_ms=body.breakdown_ms,
        epoch_seconds=body.epoch_seconds,
        runs=body.runs,
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _lines(lines: Iterator[str]) -> Iterator[str]:
    """Stop quietly if the backend goes away mid-stream: the client sees the stream end."""
    try:
        yield from lines
    except BackendError:
        return


@router.get(
    "/{job_id}/logs",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **problems(404, 503)},
)
def job_logs(
    job_id: JobId, principal: TenantDep, store: StoreDep, backend: BackendDep, follow: bool = False
) -> Response:
    """The job's log; `follow=true` streams until the job ends, waiting first for a queued job to start."""
    job = store.get_job(job_id, tenant=principal.visible_tenant)
    if follow and job.state is JobState.QUEUED:
        lines = _logs_once_submitted(job_id, store, backend)
    else:
        lines = _backend_logs(job_id, backend, follow)
    return StreamingResponse(_lines(lines), media_type="text/plain; charset=utf-8")


def _backend_logs(job_id: str, backend: Backend, follow: bool) -> Iterator[str]:
    try:
        return backend.logs(job_id, follow=follow)
    except BackendNotFound:
        return iter(())


def _logs_once_submitted(job_id: str, store: Store, backend: Backend) -> Iterator[str]:
    """A queued job has no backend log yet: follow waits until the reconciler hands it over (or it ends).

    Each poll yields an empty chunk (nothing reaches the client) so that a client gone away stops the
    iteration here, instead of leaving a worker thread polling for as long as the job stays queued."""
    while store.get_job(job_id).state is JobState.QUEUED:
        time.sleep(QUEUED_POLL_SECONDS)
        yield ""
    yield from _backend_logs(job_id, backend, follow=True)
