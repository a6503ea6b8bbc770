"""Submission, cancel and retry rules between the API and the store (no HTTP, no SQL here)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from contracts.config import STEPS_PER_EPOCH, ConfigError, TrainConfig, check_job_settings
from contracts.datasets import DatasetAccess, DatasetRefused, check_local_file, locate
from contracts.packs import packing_note
from service.api.schemas import JobCreate
from service.auth import Principal
from service.errors import DatasetNotAllowed, IdempotencyConflict, SettingNotAllowed, UnknownPool
from service.metrics import ControllerMetrics
from service.pools import Pools
from service.store import JobRecord, NewJob, Store


def job_id_for(tenant: str, key: str) -> str:
    """Deterministic and DNS-safe, so a backend object name follows from the idempotency key."""
    return "job-" + hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()[:20]


def request_hash(body: JobCreate) -> str:
    return hashlib.sha256(json.dumps(body.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def admit_dataset(config: TrainConfig, access: DatasetAccess) -> None:
    """Refuse a dataset outside `access` (422, naming what is allowed), and hand `access` to the trainer.

    Only names and stat are looked at, never the file's bytes. A local file that is not on this machine
    (it may be on the pods' volume) passes here; the trainer checks it again, with the same rules, when
    it opens it."""
    data = config.data
    if data.dataset_access is not None:
        raise DatasetNotAllowed("data.dataset_access is the controller's to set (its dataset settings), not a job's")
    if data.dataset is None:
        return
    try:
        location = locate(data.dataset, access)
        if location.local:
            check_local_file(data.dataset, location.target, access.max_bytes)
    except FileNotFoundError:
        pass
    except DatasetRefused as error:
        raise DatasetNotAllowed(str(error)) from None
    data.dataset_access = access


def admit_settings(config: TrainConfig) -> None:
    """Refuse a config that sets what only the operator sets (422 naming the field): the job's resolve
    step refuses it too (`contracts.config.check_job_settings`), with the same message."""
    try:
        check_job_settings(config)
    except ConfigError as error:
        raise SettingNotAllowed(str(error)) from None


@dataclass(frozen=True)
class _Replay:
    """A submission naming a pool that is not (or no longer) configured: only its stored job can answer it."""

    job_id: str
    digest: str
    error: UnknownPool


@dataclass(eq=False)  # one per controller: compared and hashed by identity
class JobService:
    """The rules; `wake` nudges the reconciler so a new job reaches the backend at once."""

    store: Store
    pools: Pools
    metrics: ControllerMetrics
    wake: Callable[[], None]
    datasets: DatasetAccess = field(default_factory=DatasetAccess, kw_only=True)
    """The datasets a job may name (the controller's settings); by default none."""
    queued: Callable[[], None] | None = field(default=None, kw_only=True)
    """Called for a new job (the reconciler's submit pass, not a full one); None: `wake`."""

    def submit(self, principal: Principal, body: JobCreate, idempotency_key: str | None) -> tuple[JobRecord, bool]:
        """(job with history, created). The same key and body return the stored job; another body conflicts."""
        admission = self._admission(principal, body, idempotency_key)
        if isinstance(admission, _Replay):
            return self._replayed(admission, self.store.find_job(admission.job_id, with_events=True))
        return self._submitted(*self.store.insert_job(*admission))

    async def submit_async(
        self, principal: Principal, body: JobCreate, idempotency_key: str | None
    ) -> tuple[JobRecord, bool]:
        """`submit` on the event loop: the checks there, the insert in the store's group commit
        (`Store.insert_job_async`), no worker thread per submission."""
        admission = self._admission(principal, body, idempotency_key)
        if isinstance(admission, _Replay):
            find = partial(self.store.find_job, admission.job_id, with_events=True)
            existing = await asyncio.get_running_loop().run_in_executor(None, find)
            return self._replayed(admission, existing)
        return self._submitted(*await self.store.insert_job_async(*admission))

    def _replayed(self, replay: _Replay, existing: JobRecord | None) -> tuple[JobRecord, bool]:
        if existing is None:
            raise replay.error
        if existing.request_hash != replay.digest:
            raise IdempotencyConflict(replay.job_id) from None
        self.metrics.record_submission(existing.pool, created=False)
        return existing, False

    def _submitted(self, job: JobRecord, created: bool) -> tuple[JobRecord, bool]:
        self.metrics.record_submission(job.pool, created=created)
        if created:
            (self.queued or self.wake)()
        return job, created

    def _admission(
        self, principal: Principal, body: JobCreate, idempotency_key: str | None
    ) -> tuple[NewJob, Callable[[int], None] | None] | _Replay:
        """The job to insert and its quota check, or (its pool unknown) the stored job to look for."""
        key = idempotency_key or (f"name:{body.name}" if body.name else f"uuid:{uuid.uuid4()}")
        job_id = job_id_for(principal.tenant, key)
        digest = request_hash(body)
        try:
            pool = self.pools.get(body.pool or self.pools.default)
        except UnknownPool as error:  # a replay of a job whose pool has left the pools file since is still the job
            return _Replay(job_id, digest, error)
        # the submitted config stays as it came: a copy of it and of the two parts set here (a deep copy was
        # a tenth of a submission's CPU)
        config = body.config.model_copy(
            update={"run": body.config.run.model_copy(), "data": body.config.data.model_copy()}
        )
        if body.plan is not None:
            config.run.plan = body.plan
        admit_settings(config)
        admit_dataset(config, self.datasets)
        # With epochs the stored config leaves run.steps out: the pipeline's resolve step sets it to
        # epochs x STEPS_PER_EPOCH (contracts.config.apply_epochs), the one place epochs become steps.
        steps = {"run": {"steps"}} if body.epochs is not None else None
        return (
            NewJob(
                id=job_id,
                tenant=principal.tenant,
                submitter=principal.name,
                name=body.name,
                idempotency_key=key,
                request_hash=digest,
                pool=pool.name,
                gpus=pool.gpus_per_node,
                model=body.model,
                plan=config.run.plan,
                commit_sha=body.commit_sha,
                epochs=body.epochs or max(1, math.ceil(config.run.steps / STEPS_PER_EPOCH)),
                hyperopt_trials=body.hyperopt_trials,
                priority=body.priority,
                deadline=body.deadline,
                config=config.model_dump(mode="json", exclude=steps),
                labels=dict(body.labels),
                message=packing_note(config.search.space or {}) if body.hyperopt_trials > 1 else None,
            ),
            # checked and inserted in one transaction: concurrent submissions cannot overrun the quota;
            # a replay (the key's job is stored) returns that job, and no quota is checked for it
            (
                (lambda used: pool.check_quota(tenant=principal.tenant, used=used))
                if pool.quota_for(principal.tenant) is not None
                else None
            ),
        )

    def cancel(self, principal: Principal, job_id: str) -> JobRecord:
        job = self.store.request_cancel(job_id, tenant=principal.visible_tenant)
        self.wake()
        return job

    def retry(self, principal: Principal, job_id: str) -> JobRecord:
        """Queue the next attempt; it resumes from the job's fixed checkpoint location."""
        job = self.store.retry(
            job_id,
            tenant=principal.visible_tenant,
            admit=lambda tenant, pool, used: self.pools.get(pool).check_quota(tenant=tenant, used=used),
        )
        self.wake()
        return job
