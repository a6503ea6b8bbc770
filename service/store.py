"""The job record: every SQL statement of the controller lives here (SQLite by default, PostgreSQL too)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, cast

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Table,
    bindparam,
    create_engine,
    event,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import TextClause

from service.domain import TERMINAL_STATES, BackendStatus, JobFields, JobState, RunProgress
from service.errors import Forbidden, IdempotencyConflict, InvalidRequest, InvalidTransition, JobNotFound
from service.models import JobEventRow, JobLabelRow, JobRow, TokenRow

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
POOL_SIZE = 40
"""Connections kept open: one per API worker thread (anyio's default 40), each holding one at a time."""
POOL_OVERFLOW = 5
"""Beyond those, for the reconciler's threads; two replicas hold at most 90 of PostgreSQL's default 100."""
_RANK = {JobState.QUEUED: 0, JobState.PENDING: 1, JobState.RUNNING: 2}
_TERMINAL = [s.value for s in TERMINAL_STATES]
_RETRYABLE = {JobState.FAILED, JobState.CANCELLED, JobState.ERROR}
_ACTIVE = [s.value for s in JobState if not s.terminal]
_APPLIED = (
    *("state", "reason", "message", "phase", "started_at", "finished_at", "updated_at"),
    *("breakdown_ms", "epoch_seconds", "step", "runs", "submitted_attempt"),
)
"""The jobs columns a backend's status (and a hand-over) may change: what `Store._apply_many` writes back."""
_JOBS, _LABELS, _EVENTS, _TOKENS = (
    cast(Table, row.__table__) for row in (JobRow, JobLabelRow, JobEventRow, TokenRow)
)  # the tables, for Core statements on the hot paths


def utcnow() -> datetime:
    """Naive UTC: what we store, identically on SQLite and PostgreSQL."""
    return datetime.now(UTC).replace(tzinfo=None)


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _runs_json(runs: Sequence[RunProgress | dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A pack's runs as the jobs.runs column holds them (JSON objects), from the models or the column itself."""
    if runs is None:
        return None
    return [run.model_dump() if isinstance(run, RunProgress) else run for run in runs]


def _naive(value: datetime | None) -> datetime | None:
    return value.astimezone(UTC).replace(tzinfo=None) if value is not None and value.tzinfo else value


class JobEvent(BaseModel):
    state: JobState
    reason: str | None
    message: str | None
    attempt: int
    at: datetime


class NewJob(JobFields):
    """A validated submission, ready to insert: the job's fields plus what only the store keeps."""

    idempotency_key: str
    request_hash: str
    gpus: int
    config: dict[str, Any]
    message: str | None = None
    """What the controller says of the job at admission (its first event's message too), until a backend says more."""


class JobRecord(NewJob):
    """A job as stored, detached from any session."""

    model_config = ConfigDict(from_attributes=True)

    state: JobState
    reason: str | None
    message: str | None
    phase: str | None
    attempt: int
    submitted_attempt: int | None
    cancel_requested_at: datetime | None
    cancel_forced: bool
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    breakdown_ms: dict[str, float] | None
    epoch_seconds: float | None
    step: int | None
    runs: list[RunProgress] | None = None
    events: list[JobEvent] = Field(default_factory=list)


class ActiveJob(NamedTuple):
    """What a full reconcile pass needs of an active job (no config, no history): read as plain rows, since
    building every active job's whole record made a pass over 10,000 jobs hold the interpreter for seconds."""

    id: str
    state: JobState
    attempt: int
    submitted_attempt: int | None
    cancel_requested_at: datetime | None
    cancel_forced: bool
    breakdown_ms: dict[str, float] | None
    epoch_seconds: float | None
    step: int | None
    runs: list[dict[str, Any]] | None


class TokenInfo(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    tenant: str
    admin: bool
    created_at: datetime
    revoked_at: datetime | None


def _record(row: JobRow | Row[Any], *, with_events: bool = False) -> JobRecord:
    """The record of an ORM row (with its events if asked) or of a Core row of every jobs column."""
    if isinstance(row, Row):
        data = dict(row._mapping)
    else:
        data = {c.key: getattr(row, c.key) for c in JobRow.__table__.columns}
    for key in ("deadline", "cancel_requested_at", "created_at", "updated_at", "started_at", "finished_at"):
        data[key] = _aware(data[key])
    data["events"] = (
        [
            JobEvent(state=e.state, reason=e.reason, message=e.message, attempt=e.attempt, at=_aware(e.at))
            for e in cast(JobRow, row).events
        ]
        if with_events
        else []
    )
    return JobRecord.model_validate(data)


def _brief(row: Any) -> ActiveJob:
    """An ActiveJob from a jobs row (Core or ORM)."""
    return ActiveJob(
        row.id,
        JobState(row.state),
        row.attempt,
        row.submitted_attempt,
        _aware(row.cancel_requested_at),
        bool(row.cancel_forced),
        row.breakdown_ms,
        row.epoch_seconds,
        row.step,
        row.runs,
    )


def encode_cursor(created_at: datetime, job_id: str) -> str:
    raw = json.dumps([_naive(created_at).isoformat(), job_id]).encode()  # type: ignore[union-attr]
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """(created_at as stored, job id) from `encode_cursor`'s text; anything else is InvalidRequest."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, job_id = json.loads(raw)
        if not isinstance(created, str) or not isinstance(job_id, str) or "\x00" in job_id:
            raise ValueError("not a cursor")
        return _naive(datetime.fromisoformat(created)), job_id  # type: ignore[return-value]
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest(f"invalid cursor {cursor!r}: pass back next_cursor from a previous page") from None


def parse_label_selector(selector: str) -> dict[str, str]:
    """`key=value,key2=value2` -> dict; anything else is a one-line InvalidRequest."""
    out: dict[str, str] = {}
    for part in selector.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key.strip():
            raise InvalidRequest(f"invalid label selector {selector!r}: expected key=value[,key=value]")
        out[key.strip()] = value.strip()
    return out


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite's own BEGIN comes only before the first INSERT/UPDATE, so a read (the quota's GPU use)
    # ran outside the writing transaction; we emit every BEGIN ourselves instead (`_sqlite_begin`)
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    # WAL + NORMAL: a killed controller loses no committed row; only an OS crash or power cut can
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


_WRITE = "foxhunt_write"
"""Execution option of the write engine: its transactions start with BEGIN IMMEDIATE on SQLite."""


def _sqlite_begin(connection: Connection) -> None:
    """BEGIN IMMEDIATE for writes: the database's write lock is taken before the first read, so a check
    and the write it allows (the quota) are atomic across processes too; plain BEGIN (a snapshot) for reads."""
    immediate = connection.get_execution_options().get(_WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _new_row(job: NewJob, now: datetime) -> dict[str, Any]:
    """The jobs row of a new submission, every column of migration 0001 given (later ones default to null, so
    a test can insert into a database it has migrated that far)."""
    return {
        **job.model_dump(exclude={"deadline"}),
        "deadline": _naive(job.deadline),
        "state": JobState.QUEUED.value,
        "reason": None,
        "message": job.message,
        "phase": None,
        "attempt": 0,
        "submitted_attempt": None,
        "cancel_requested_at": None,
        "cancel_forced": False,
        "created_at": now,
        "updated_at": now,
        "started_at": None,
        "finished_at": None,
        "breakdown_ms": None,
        "epoch_seconds": None,
        "step": None,
    }


def _json_datetime(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()  # naive UTC, as the DateTime columns hold it
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


@functools.cache
def _pg_insert_statement(job_columns: tuple[str, ...]) -> TextClause:
    """PostgreSQL: a batch's jobs, labels and events in one statement (one round trip), each table's rows given
    as one JSON array (`json_populate_recordset` types each field as the table's column)."""

    def rows_of(table: Table, columns: Sequence[str], parameter: str) -> str:
        names = ", ".join(f'"{c}"' for c in columns)
        return (
            f'INSERT INTO "{table.name}" ({names}) SELECT {names} '
            f'FROM json_populate_recordset(NULL::"{table.name}", CAST(:{parameter} AS json))'
        )

    events = ("job_id", "state", "reason", "message", "attempt", "at")
    return text(
        f"WITH new_jobs AS ({rows_of(_JOBS, job_columns, 'jobs')}), "
        f"new_labels AS ({rows_of(_LABELS, ('job_id', 'key', 'value'), 'labels')}) "
        f"{rows_of(_EVENTS, events, 'events')}"
    )


@dataclass
class _Submission:
    """One caller's job in a group commit, and what became of it."""

    job: NewJob
    admit: Callable[[int], None] | None
    values: dict[str, Any]
    done: bool = False
    stored_hash: str | None = None  # set when the id was stored already: a replay
    error: BaseException | None = None


class _LoopBatcher:
    """The group commit of one event loop's submissions (`Store.insert_job_async`): touched only from that loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[tuple[_Submission, asyncio.Future[None]]] = []
        self.committing = False
        self.task: asyncio.Task[None] | None = None  # the committer, referenced while it runs


class Store:
    """Thread-safe (one session per call); built by create_app from Settings.database_url."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        sqlite = database_url.startswith("sqlite")
        # one pooled connection per thread that may hold one at once, kept open: a pool smaller than that
        # closed and reopened its overflow connections under load (PostgreSQL: a new backend process each)
        kwargs: dict[str, Any] = {"pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
        if sqlite and make_url(database_url).database in (None, "", ":memory:"):
            kwargs = {}  # an in-memory database lives in one connection (SingletonThreadPool): no pool to size
        if sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True  # a restarted server's dead connections are replaced, not handed out
        self.engine: Engine = create_engine(database_url, **kwargs)
        if sqlite:
            event.listen(self.engine, "connect", _sqlite_connect)
            event.listen(self.engine, "begin", _sqlite_begin)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self.engine.execution_options(**{_WRITE: True}), expire_on_commit=False)
        self._sqlite = sqlite
        self._write_lock = threading.Lock()
        self._batching = threading.Condition()  # guards the two below; notified when a batch has committed
        self._pending: list[_Submission] = []  # submissions waiting for the next batch
        self._batch_in_flight = False
        self._loop_batcher: _LoopBatcher | None = None  # insert_job_async's, for the loop it last ran on
        self._committer: ThreadPoolExecutor | None = None  # its one thread, made on first use

    def migrate(self) -> None:
        """`alembic upgrade head` on this database."""
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def dispose(self) -> None:
        if self._committer is not None:
            self._committer.shutdown(wait=True)
            self._committer = None
        self.engine.dispose()

    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    @contextmanager
    def _tx(self, *, write: bool = False) -> Iterator[Session]:
        """One transaction. A SQLite write transaction starts with BEGIN IMMEDIATE (the database's write
        lock, held across processes until it ends); within one process writers queue on an in-process
        lock first, rather than in SQLite's sleeping busy handler, which gives long tail latencies."""
        with (
            self._write_lock if write and self._sqlite else contextlib.nullcontext(),
            (self._write_sessions if write else self._sessions).begin() as session,
        ):
            yield session

    # ---- jobs -------------------------------------------------------------------------------------

    def find_job(self, job_id: str, *, with_events: bool = False) -> JobRecord | None:
        with self._tx() as s:
            row = s.get(JobRow, job_id)
            return _record(row, with_events=with_events) if row else None

    def insert_job(self, job: NewJob, admit: Callable[[int], None] | None = None) -> tuple[JobRecord, bool]:
        """Insert, or return the job already stored under this id: (record, created). Race-safe via the PK.

        `admit(gpus_in_use)` runs inside the inserting transaction, with the tenant's non-terminal GPUs
        on the job's pool, and may raise to refuse the job (the quota). Concurrent admissions for one
        tenant and pool are serialised by a lock the database holds (a transaction-scoped advisory lock
        on PostgreSQL, BEGIN IMMEDIATE on SQLite), so two submissions cannot both pass a check that only
        one of them fits, also from two controller processes.

        Group commit: concurrent calls share one transaction. A caller that finds no batch in flight
        inserts every submission waiting by then, in arrival order, each admitted against the GPU use
        including those before it; the others wait for that commit (or lead the next batch), instead
        of queueing for the write lock one transaction each. The record is built from the values
        inserted rather than read back; a replay reads the stored job.
        """
        mine = _Submission(job, admit, _new_row(job, utcnow()))
        with self._batching:
            self._pending.append(mine)
            while self._batch_in_flight and not mine.done:
                self._batching.wait()  # woken when a batch commits: ours, or the chance to lead the next
            if not mine.done:
                batch, self._pending, self._batch_in_flight = self._pending, [], True
        if not mine.done:
            try:
                self._insert_batch(batch)
            finally:
                with self._batching:
                    self._batch_in_flight = False
                    self._batching.notify_all()
        if mine.error is not None:
            raise mine.error
        if mine.stored_hash is not None:  # the key's job was there already
            if mine.stored_hash != job.request_hash:
                raise IdempotencyConflict(job.id)
            return self.get_job(job.id), False
        return self._inserted(mine), True

    async def insert_job_async(self, job: NewJob, admit: Callable[[int], None] | None = None) -> tuple[JobRecord, bool]:
        """`insert_job` for a caller on an event loop, with the same guarantees, without a thread per caller.

        The submissions of one loop wait as futures; one committer task takes every submission waiting by
        then as one batch (`_insert_batch`, the same transaction as `insert_job`'s) in the store's one
        committer thread, resolves the batch's futures on the loop when it has committed, and takes the
        next batch until none waits. A submission that finds no batch in flight starts the committer at
        once. Batches of `insert_job` and of this method (or of another process) are serialised by the
        same database locks. Answered only after the commit, as `insert_job`."""
        loop = asyncio.get_running_loop()
        batcher = self._loop_batcher
        if batcher is None or batcher.loop is not loop:
            batcher = self._loop_batcher = _LoopBatcher(loop)
        mine = _Submission(job, admit, _new_row(job, utcnow()))
        done: asyncio.Future[None] = loop.create_future()
        batcher.pending.append((mine, done))
        if not batcher.committing:
            batcher.committing = True
            batcher.task = loop.create_task(self._commit_batches(batcher))
        await done
        if mine.error is not None:
            raise mine.error
        if mine.stored_hash is not None:  # the key's job was there already: read in a worker thread
            if mine.stored_hash != job.request_hash:
                raise IdempotencyConflict(job.id)
            return await loop.run_in_executor(None, self.get_job, job.id), False
        return self._inserted(mine), True

    async def _commit_batches(self, batcher: _LoopBatcher) -> None:
        """`insert_job_async`'s committer: a batch at a time in the committer thread, until none waits."""
        try:
            while batcher.pending:
                batch, batcher.pending = batcher.pending, []
                try:
                    if self._committer is None:
                        self._committer = ThreadPoolExecutor(1, thread_name_prefix="foxhunt-commit")
                    await batcher.loop.run_in_executor(self._committer, self._insert_batch, [b for b, _ in batch])
                except BaseException as error:  # not the store's failure (_insert_batch keeps those): the loop's
                    for submission, _ in batch:
                        if not submission.done:
                            submission.error = error
                    raise
                finally:
                    for _, done in batch:
                        if not done.done():  # a caller whose request was cancelled has stopped waiting
                            done.set_result(None)
        finally:
            batcher.committing = False
            for submission, done in batcher.pending:  # left by a cancelled committer: refused, not stranded
                submission.error = RuntimeError("the store's committer stopped")
                if not done.done():
                    done.set_result(None)
            batcher.pending = []

    @staticmethod
    def _inserted(mine: _Submission) -> JobRecord:
        """The record of a submission this store inserted, from the values inserted (not read back)."""
        job = mine.job
        values = mine.values
        at = _aware(values["created_at"])
        first = JobEvent(state=JobState.QUEUED, reason=None, message=job.message, attempt=0, at=at)  # type: ignore[arg-type]
        record = {**values, "deadline": job.deadline, "created_at": at, "updated_at": at, "events": [first]}
        return JobRecord.model_validate(record)

    def _insert_batch(self, batch: list[_Submission]) -> None:
        """One transaction for the batch; if another controller inserted one of its ids meanwhile (the
        primary key refuses ours), each submission again in a transaction of its own."""
        try:
            with self._tx(write=True) as s:
                self._admit_and_insert(s, batch)
        except IntegrityError:
            if len(batch) > 1:
                for submission in batch:
                    submission.stored_hash = submission.error = None
                    self._insert_batch([submission])
                return
            existing = self.find_job(batch[0].job.id)
            if existing is None:  # the other insert rolled back: ours may go now
                self._insert_batch(batch)
                return
            batch[0].stored_hash = existing.request_hash
        except Exception as error:  # the store failed: every waiting caller gets the error
            for submission in batch:
                submission.error = error
        finally:
            for submission in batch:
                submission.done = True

    def _admit_and_insert(self, s: Session, batch: list[_Submission]) -> None:
        """Admit and insert a batch. Its statements, each a round trip to PostgreSQL: the admission locks, one
        read (the ids already stored and the GPU use of each tenant and pool to admit on), one insert (jobs,
        labels and events; on SQLite three, which cost no round trip)."""
        keys = sorted({(b.job.tenant, b.job.pool) for b in batch if b.admit is not None})
        for tenant, pool in keys:
            self._lock_admission(s, tenant, pool)  # in one order, so two controllers cannot deadlock
        stored, used = self._stored_and_used(s, [b.job.id for b in batch], keys)
        rows: list[dict[str, Any]] = []
        labels: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        for b in batch:
            job = b.job
            if job.id in stored:  # a replay of a stored job (or of one earlier in this batch) is no admission
                b.stored_hash = stored[job.id]
                continue
            if b.admit is not None:
                key = (job.tenant, job.pool)
                try:
                    b.admit(used[key])
                except Exception as error:  # refused (the quota): this submission alone
                    b.error = error
                    continue
                used[key] += job.gpus
            stored[job.id] = job.request_hash
            rows.append(b.values)
            labels.extend({"job_id": job.id, "key": k, "value": v} for k, v in job.labels.items())
            at = b.values["created_at"]
            events.append(
                {
                    "job_id": job.id,
                    "state": JobState.QUEUED.value,
                    "reason": None,
                    "message": job.message,
                    "attempt": 0,
                    "at": at,
                }
            )
        if not rows:
            return
        if self._sqlite:
            s.execute(insert(_JOBS), rows)
            if labels:
                s.execute(insert(_LABELS), labels)
            s.execute(insert(_EVENTS), events)
            return
        # one statement, of a fixed text whatever the batch: each table's rows as one JSON parameter (SQLAlchemy's
        # multi-row VALUES took milliseconds to compile and to key for its cache, per batch size)
        s.execute(
            _pg_insert_statement(tuple(rows[0])),
            {
                "jobs": json.dumps(rows, default=_json_datetime),
                "labels": json.dumps(labels),
                "events": json.dumps(events, default=_json_datetime),
            },
        )

    @staticmethod
    def _stored_and_used(
        s: Session, ids: list[str], keys: list[tuple[str, str]]
    ) -> tuple[dict[str, str], dict[tuple[str, str], int]]:
        """In one statement: the request hash of each of `ids` already stored, and the GPUs in use by each
        (tenant, pool) of `keys` (what `_gpu_use` reads)."""
        parts = [select(literal("id"), _JOBS.c.id, _JOBS.c.request_hash, literal(0)).where(_JOBS.c.id.in_(set(ids)))]
        parts.extend(
            select(literal("use"), literal(tenant), literal(pool), func.coalesce(func.sum(_JOBS.c.gpus), 0)).where(
                _JOBS.c.tenant == tenant, _JOBS.c.pool == pool, _JOBS.c.state.in_(_ACTIVE)
            )
            for tenant, pool in keys
        )
        stored: dict[str, str] = {}
        used: dict[tuple[str, str], int] = {}
        for kind, first, second, gpus in s.execute(union_all(*parts)):
            if kind == "id":
                stored[first] = second
            else:
                used[(first, second)] = int(gpus)
        return stored, used

    def get_job(self, job_id: str, *, tenant: str | None = None) -> JobRecord:
        """The job with its history; `tenant` restricts visibility (None: admin)."""
        with self._tx() as s:
            row = s.get(JobRow, job_id)
            if row is None or (tenant is not None and row.tenant != tenant):
                raise JobNotFound(job_id)
            return _record(row, with_events=True)

    def list_jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | None = None,
        pool: str | None = None,
        labels: dict[str, str] | None = None,
        submitter: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        """Newest first, ordered by (created_at, id) so pages are stable while jobs are added."""
        query = select(JobRow)
        if tenant is not None:
            query = query.where(JobRow.tenant == tenant)
        if state is not None:
            query = query.where(JobRow.state == state.value)
        if pool is not None:
            query = query.where(JobRow.pool == pool)
        if submitter is not None:
            query = query.where(JobRow.submitter == submitter)
        for key, value in (labels or {}).items():
            query = query.where(
                exists().where(JobLabelRow.job_id == JobRow.id, JobLabelRow.key == key, JobLabelRow.value == value)
            )
        if cursor is not None:
            created, last_id = decode_cursor(cursor)
            query = query.where(
                or_(JobRow.created_at < created, (JobRow.created_at == created) & (JobRow.id < last_id))
            )
        query = query.order_by(JobRow.created_at.desc(), JobRow.id.desc()).limit(limit + 1)
        with self._tx() as s:
            rows = list(s.scalars(query))
            records = [_record(r) for r in rows[:limit]]
        next_cursor = encode_cursor(records[-1].created_at, records[-1].id) if len(rows) > limit else None
        return records, next_cursor

    def _event(self, s: Session, row: JobRow, now: datetime) -> None:
        s.add(
            JobEventRow(
                job_id=row.id,
                state=row.state,
                reason=row.reason,
                message=row.message,
                attempt=row.attempt,
                at=now,
            )
        )

    def apply_status(self, status: BackendStatus, *, known: JobRecord | ActiveJob | None = None) -> bool:
        """Bring one job in step with the backend; True if its state changed.

        Statuses only move a job forward (QUEUED < PENDING < RUNNING < terminal); a terminal job is
        never changed here, and a status about an older attempt is ignored. `known`: the job as the
        caller read it moments ago (a reconcile pass reads every active job at once), which saves the
        read that decides whether anything changes; a stale one costs a write transaction, never an update.
        """
        if not self._would_change(status, known):  # most statuses of a pass: no write transaction, no write lock
            return False
        with self._tx(write=True) as s:
            return self._apply_many(s, [(status.job_id, None, status)], utcnow())[1] > 0

    def apply_statuses(self, statuses: Sequence[BackendStatus]) -> int:
        """`apply_status` for several jobs (a watch poll's changes): their stored state read in one statement, and
        those that would change written in one transaction (none: no write transaction). How many changed."""
        if not statuses:
            return 0
        # a job not among the active ones has ended (or is gone): a status never changes it
        known = {job.id: job for job in self.active_jobs_brief(among=sorted({s.job_id for s in statuses}))}
        changing = [s for s in statuses if s.job_id in known and self._would_change(s, known[s.job_id])]
        if not changing:
            return 0
        with self._tx(write=True) as s:
            return self._apply_many(s, [(status.job_id, None, status) for status in changing], utcnow())[1]

    def hand_over(self, job_id: str, attempt: int, status: BackendStatus) -> ActiveJob | None:
        """The backend took the job's `attempt` and answered `status`: mark the attempt submitted and
        apply the status in one transaction (a reconcile pass does this for every queued job); the job
        as it stands then (its state and cancel, as a pass needs them), None if it is gone."""
        return self.hand_over_many([(job_id, attempt, status)])[0]

    def hand_over_many(self, handed: list[tuple[str, int, BackendStatus]]) -> list[ActiveJob | None]:
        """`hand_over` for many jobs in one transaction, their rows read in one statement: a pass hands over
        every job queued since the last one, and a transaction each (the write lock each) made the store, not
        the backend, the pace of a long queue."""
        if not handed:
            return []
        with self._tx(write=True) as s:
            rows, _ = self._apply_many(s, handed, utcnow())
        return [_brief(rows[job_id]) if job_id in rows else None for job_id, _, _ in handed]

    def _apply_many(
        self, s: Session, changes: Sequence[tuple[str, int | None, BackendStatus]], now: datetime
    ) -> tuple[dict[str, SimpleNamespace], int]:
        """(job id, attempt handed over or None, status): the rows locked for update and read in one statement,
        `_apply`'d, written back in one executemany UPDATE and their events in one INSERT (SQLAlchemy Core: the
        ORM's unit of work was most of a hand-over's cost, and read each job's config too). The rows as written
        and how many changed state."""
        c = _JOBS.c
        columns = [c.id, c.attempt, c.cancel_requested_at, c.cancel_forced, *(c[name] for name in _APPLIED)]
        query = select(*columns).where(c.id.in_({job_id for job_id, _, _ in changes})).with_for_update()
        rows = {row.id: SimpleNamespace(**row._mapping) for row in s.execute(query)}
        events: list[dict[str, Any]] = []
        for job_id, attempt, status in changes:
            row = rows.get(job_id)
            if row is None:
                continue
            if attempt is not None and row.attempt == attempt:
                row.submitted_attempt = attempt
            if self._apply(row, status, now):
                events.append(
                    {"job_id": job_id, "state": row.state, "reason": row.reason, "message": row.message}
                    | {"attempt": row.attempt, "at": now}
                )
        if rows:
            values = {name: bindparam(f"new_{name}", type_=c[name].type) for name in _APPLIED}
            statement = update(_JOBS).where(c.id == bindparam("row_id")).values(values)
            s.execute(
                statement,
                [
                    {"row_id": row.id, **{f"new_{name}": getattr(row, name) for name in _APPLIED}}
                    for row in rows.values()
                ],
            )
        if events:
            s.execute(insert(_EVENTS), events)
        return rows, len(events)

    @staticmethod
    def _apply(row: Any, status: BackendStatus, now: datetime) -> bool:
        """`apply_status` on a row (its `_APPLIED` columns, attributes of any object) read under the write lock;
        True if its state changed, when the caller records the event."""
        if JobState(row.state).terminal:
            return False
        if status.attempt is not None and status.attempt < row.attempt:
            return False
        current = JobState(row.state)
        forward = status.state.terminal or _RANK[status.state] > _RANK[current]
        if status.breakdown_ms is not None:
            row.breakdown_ms = status.breakdown_ms
        if status.epoch_seconds is not None:
            row.epoch_seconds = status.epoch_seconds
        if status.step is not None:
            row.step = status.step
        if status.runs is not None:
            row.runs = _runs_json(status.runs)
        if not forward:
            return False
        deadline_hit = status.state is JobState.CANCELLED and row.reason == "DeadlineExceeded"
        row.state = status.state.value
        row.reason = "DeadlineExceeded" if deadline_hit else status.reason  # why it was cancelled
        row.message = status.message
        row.phase = status.phase
        row.started_at = _naive(status.started_at) or row.started_at
        if status.state in (JobState.RUNNING, *TERMINAL_STATES) and row.started_at is None:
            row.started_at = now
        if status.state.terminal:
            row.finished_at = _naive(status.finished_at) or now
        row.updated_at = now
        return True

    def _would_change(self, status: BackendStatus, known: JobRecord | ActiveJob | None) -> bool:
        """Whether `apply_status` would change the stored job, read without the write lock (or taken from
        `known`); the writing transaction decides again, so a job changed in between is handled right."""
        row: Any = known
        if row is None:
            c = _JOBS.c
            query = select(c.state, c.attempt, c.breakdown_ms, c.epoch_seconds, c.step, c.runs).where(
                c.id == status.job_id
            )
            with self._tx() as s:
                row = s.execute(query).first()
        if row is None or JobState(row.state).terminal:
            return False
        if status.attempt is not None and status.attempt < row.attempt:
            return False
        if status.state.terminal or _RANK[status.state] > _RANK[JobState(row.state)]:
            return True
        figures = ((status.breakdown_ms, row.breakdown_ms), (status.epoch_seconds, row.epoch_seconds))
        runs = (None if status.runs is None else _runs_json(status.runs), _runs_json(row.runs))
        return any(new is not None and new != old for new, old in (*figures, (status.step, row.step), runs))

    def record_progress(
        self,
        job_id: str,
        *,
        attempt: int,
        step: int,
        breakdown_ms: dict[str, float] | None,
        epoch_seconds: float | None,
        runs: list[RunProgress] | None = None,
    ) -> None:
        """A running job's own report (step, breakdown, epoch time, a pack's runs); the state is left to the backend.

        Only the job's current attempt reports (checked under the row lock, so a retry in between wins);
        figures missing from the report keep their last value; a terminal job takes no more reports."""
        with self._tx(write=True) as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is None:
                raise JobNotFound(job_id)
            if row.attempt != attempt:
                raise Forbidden(f"a progress token of attempt {attempt}; job {job_id} runs attempt {row.attempt}")
            if JobState(row.state).terminal:
                raise InvalidTransition(f"job {job_id} is already {row.state}; it takes no more progress reports")
            row.step = step
            if breakdown_ms is not None:
                row.breakdown_ms = breakdown_ms
            if epoch_seconds is not None:
                row.epoch_seconds = epoch_seconds
            if runs is not None:
                row.runs = _runs_json(runs)
            row.updated_at = utcnow()

    def set_state(self, job_id: str, state: JobState, *, reason: str | None, message: str | None = None) -> None:
        """Controller-observed state (e.g. the backend lost the job); ignored once terminal."""
        now = utcnow()
        with self._tx(write=True) as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is None or JobState(row.state).terminal:
                return
            row.state, row.reason, row.message, row.updated_at = state.value, reason, message, now
            if state.terminal:
                row.finished_at = now
            self._event(s, row, now)

    def request_cancel(self, job_id: str, *, tenant: str | None, reason: str = "CancelRequested") -> JobRecord:
        """Record a cancel; a job the backend never got is cancelled at once."""
        now = utcnow()
        with self._tx(write=True) as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is None or (tenant is not None and row.tenant != tenant):
                raise JobNotFound(job_id)
            state = JobState(row.state)
            if state.terminal:
                raise InvalidTransition(f"job {job_id} is already {state.value}; nothing to cancel")
            if row.cancel_requested_at is None:
                row.cancel_requested_at = now
                row.reason = reason
                row.updated_at = now
            if state is JobState.QUEUED and row.submitted_attempt != row.attempt:
                row.state, row.finished_at = JobState.CANCELLED.value, now
                self._event(s, row, now)
        return self.get_job(job_id)

    def retry(
        self, job_id: str, *, tenant: str | None, admit: Callable[[str, str, int], None] | None = None
    ) -> JobRecord:
        """Queue a failed/cancelled/errored job again as the next attempt (same checkpoint location).

        `admit(tenant, pool, gpus_in_use)` runs in the same transaction under the admission lock, as
        in `insert_job`, and may raise to refuse the retry.
        """
        now = utcnow()
        with self._tx(write=True) as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is None or (tenant is not None and row.tenant != tenant):
                raise JobNotFound(job_id)
            if JobState(row.state) not in _RETRYABLE:
                raise InvalidTransition(
                    f"job {job_id} is {row.state}; only FAILED, CANCELLED or ERROR jobs can be retried"
                )
            if admit is not None:
                self._lock_admission(s, row.tenant, row.pool)
                admit(row.tenant, row.pool, self._gpu_use(s, tenant=row.tenant, pool=row.pool))
            row.attempt += 1
            row.state, row.reason, row.message, row.phase = JobState.QUEUED.value, "Retry", None, None
            row.cancel_requested_at, row.cancel_forced = None, False
            row.started_at = row.finished_at = None
            row.updated_at = now
            self._event(s, row, now)
        return self.get_job(job_id)

    def mark_submitted(self, job_id: str, attempt: int) -> None:
        with self._tx(write=True) as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is not None and row.attempt == attempt:
                row.submitted_attempt = attempt

    def mark_cancel_forced(self, job_id: str) -> None:
        with self._tx(write=True) as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is not None:
                row.cancel_forced = True

    def jobs_to_submit(self) -> list[JobRecord]:
        """QUEUED jobs, oldest first (a restarted controller re-submits; backends dedupe by job id)."""
        c = _JOBS.c
        query = select(_JOBS).where(c.state == JobState.QUEUED.value).order_by(c.priority.desc(), c.created_at, c.id)
        with self._tx() as s:  # plain rows (Core): the ORM's identity map and unit of work are of no use here
            return [_record(r) for r in s.execute(query)]

    def active_jobs(self, *, with_deadline: bool = False) -> list[JobRecord]:
        """Every non-terminal job (`with_deadline`: those with a deadline only, which the pass checks)."""
        query = select(JobRow).where(JobRow.state.not_in(_TERMINAL))
        if with_deadline:
            query = query.where(JobRow.deadline.is_not(None))
        with self._tx() as s:
            return [_record(r) for r in s.scalars(query)]

    def active_jobs_brief(
        self, job_id: str | None = None, *, among: Sequence[str] | None = None, cancelling: bool = False
    ) -> list[ActiveJob]:
        """Every non-terminal job (or the one with `job_id`, if active) as an ActiveJob, in one Core query per
        500 ids: `among` those ids only (the reconciler's incremental pass), `cancelling` those with a cancel
        requested only."""
        c = _JOBS.c
        query = select(*(getattr(c, name) for name in ActiveJob._fields)).where(c.state.not_in(_TERMINAL))
        if job_id is not None:
            query = query.where(c.id == job_id)
        if cancelling:
            query = query.where(c.cancel_requested_at.is_not(None))
        with self._tx() as s:
            if among is None:
                rows = s.execute(query).all()
            else:
                ids = list(among)
                rows = [
                    row
                    for at in range(0, len(ids), 500)
                    for row in s.execute(query.where(c.id.in_(ids[at : at + 500])))
                ]
        return [_brief(row) for row in rows]

    def gpu_use(self, *, tenant: str, pool: str) -> int:
        """GPUs held by the tenant's non-terminal jobs on the pool."""
        with self._tx() as s:
            return self._gpu_use(s, tenant=tenant, pool=pool)

    @staticmethod
    def _gpu_use(session: Session, *, tenant: str, pool: str) -> int:
        # IN, not NOT IN: a probe per active state in ix_jobs_admission, never a scan of the tenant's history
        query = select(func.coalesce(func.sum(JobRow.gpus), 0)).where(
            JobRow.tenant == tenant, JobRow.pool == pool, JobRow.state.in_(_ACTIVE)
        )
        return int(session.scalar(query) or 0)

    def _lock_admission(self, session: Session, tenant: str, pool: str) -> None:
        """Hold the (tenant, pool) admission lock until this transaction ends (SQLite: `_write_lock`)."""
        if not self._sqlite:
            key = text("SELECT pg_advisory_xact_lock(hashtext(:key))")
            session.execute(key, {"key": f"foxhunt-admission/{tenant}/{pool}"})

    def counts_by_state(self) -> dict[JobState, int]:
        with self._tx() as s:
            rows = s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
        counts = dict.fromkeys(JobState, 0)
        counts.update({JobState(state): int(n) for state, n in rows})
        return counts

    # ---- tokens -----------------------------------------------------------------------------------

    def add_token(self, *, token_hash: str, name: str, tenant: str, admin: bool) -> TokenInfo:
        with self._tx(write=True) as s:
            row = TokenRow(token_hash=token_hash, name=name, tenant=tenant, admin=admin, created_at=utcnow())
            s.add(row)
            s.flush()
            return TokenInfo.model_validate(row)

    def find_token(self, token_hash: str) -> TokenInfo | None:
        """The live (not revoked) token with this hash."""
        columns = [getattr(_TOKENS.c, name) for name in TokenInfo.model_fields]
        query = select(*columns).where(_TOKENS.c.token_hash == token_hash, _TOKENS.c.revoked_at.is_(None))
        with self.engine.connect() as connection:  # every request asks: one Core query, no ORM session
            row = connection.execute(query).first()
        return TokenInfo.model_validate(row._mapping) if row else None

    def list_tokens(self) -> list[TokenInfo]:
        with self._tx() as s:
            return [TokenInfo.model_validate(r) for r in s.scalars(select(TokenRow).order_by(TokenRow.id))]

    def revoke_token(self, token_id: int) -> bool:
        """True if a live token was revoked."""
        with self._tx(write=True) as s:
            row = s.get(TokenRow, token_id)
            if row is None or row.revoked_at is not None:
                return False
            row.revoked_at = utcnow()
            return True
