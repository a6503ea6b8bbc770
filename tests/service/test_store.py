"""The store, run on SQLite and on a real PostgreSQL server (the `database_url` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from service.domain import BackendStatus, JobState
from service.errors import IdempotencyConflict, InvalidRequest, InvalidTransition, JobNotFound, QuotaExceeded
from service.models import Base
from service.store import MIGRATIONS_DIR, NewJob, Store, parse_label_selector


def new_job(job_id: str = "job-1", **overrides: object) -> NewJob:
    fields: dict[str, object] = {
        "id": job_id,
        "tenant": "team-a",
        "submitter": "alice",
        "name": None,
        "idempotency_key": job_id,
        "request_hash": "h1",
        "pool": "cpu",
        "gpus": 1,
        "model": "dqn",
        "plan": "eager",
        "commit_sha": "HEAD",
        "epochs": 1,
        "hyperopt_trials": 0,
        "priority": 0,
        "deadline": None,
        "config": {"run": {"steps": 2}},
        "labels": {},
    }
    return NewJob.model_validate({**fields, **overrides})


def test_migrations_create_exactly_the_orm_schema(store: Store) -> None:
    with store.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []
    store.migrate()  # running again at the next start is a no-op


def test_migration_0002_renames_the_old_default_model_to_dqn(database_url: str) -> None:
    from alembic import command
    from alembic.config import Config

    store = Store(database_url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with store.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0001")
    store.insert_job(new_job("old", model="c51-branching"))
    store.insert_job(new_job("other", model="rainbow"))
    store.migrate()
    assert store.get_job("old").model == "dqn"
    assert store.get_job("other").model == "rainbow"  # as submitted: compile refuses it with its name
    store.dispose()


def test_insert_is_idempotent_and_conflicts_on_a_different_body(store: Store) -> None:
    job, created = store.insert_job(new_job(labels={"exp": "a"}))
    assert created and job.state is JobState.QUEUED and job.labels == {"exp": "a"}
    again, created_again = store.insert_job(new_job(labels={"exp": "a"}))
    assert not created_again and again.id == job.id and again.created_at == job.created_at
    with pytest.raises(IdempotencyConflict, match="job-1"):
        store.insert_job(new_job(request_hash="h2"))


def test_concurrent_inserts_of_one_job_make_one_row(store: Store) -> None:
    barrier = threading.Barrier(20)
    outcomes: list[bool] = []

    def insert() -> None:
        barrier.wait()
        outcomes.append(store.insert_job(new_job("job-race"))[1])

    threads = [threading.Thread(target=insert) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [False] * 19 + [True]
    assert [j.id for j in store.list_jobs()[0]] == ["job-race"]
    assert len(store.get_job("job-race").events) == 1


def test_get_hides_other_tenants_jobs(store: Store) -> None:
    store.insert_job(new_job())
    assert store.get_job("job-1", tenant="team-a").id == "job-1"
    assert store.get_job("job-1").id == "job-1"  # admin
    with pytest.raises(JobNotFound, match="job job-1 not found"):
        store.get_job("job-1", tenant="team-b")
    with pytest.raises(JobNotFound):
        store.get_job("job-2")


def test_list_filters_by_tenant_state_pool_labels_submitter_and_pages(store: Store) -> None:
    for i in range(7):
        store.insert_job(
            new_job(
                f"job-{i}",
                tenant="team-a" if i < 5 else "team-b",
                pool="cpu" if i % 2 else "h200",
                labels={"exp": "x" if i % 3 == 0 else "y", "i": str(i)},
                submitter="alice" if i != 4 else "carol",
            )
        )
    store.apply_status(BackendStatus(job_id="job-1", state=JobState.RUNNING))
    assert {j.id for j in store.list_jobs(tenant="team-b")[0]} == {"job-5", "job-6"}
    assert [j.id for j in store.list_jobs(state=JobState.RUNNING)[0]] == ["job-1"]
    assert {j.id for j in store.list_jobs(pool="cpu")[0]} == {"job-1", "job-3", "job-5"}
    assert {j.id for j in store.list_jobs(labels={"exp": "x"})[0]} == {"job-0", "job-3", "job-6"}
    assert [j.id for j in store.list_jobs(labels={"exp": "x", "i": "3"})[0]] == ["job-3"]
    assert [j.id for j in store.list_jobs(submitter="carol")[0]] == ["job-4"]
    pages, cursor = [], None
    while True:
        items, cursor = store.list_jobs(limit=3, cursor=cursor)
        pages.append([j.id for j in items])
        if cursor is None:
            break
    assert pages == [["job-6", "job-5", "job-4"], ["job-3", "job-2", "job-1"], ["job-0"]]


def test_bad_cursor_and_label_selector_are_invalid_requests(store: Store) -> None:
    with pytest.raises(InvalidRequest, match="invalid cursor"):
        store.list_jobs(cursor="not-a-cursor")
    assert parse_label_selector("a=1, b=2") == {"a": "1", "b": "2"}
    for bad in ("a", "=1", "a=1,,b=2"):
        with pytest.raises(InvalidRequest, match="invalid label selector"):
            parse_label_selector(bad)


def test_apply_status_moves_forward_only_and_records_history(store: Store) -> None:
    store.insert_job(new_job())
    started = datetime(2030, 1, 1, tzinfo=UTC)
    assert store.apply_status(BackendStatus(job_id="job-1", state=JobState.RUNNING, started_at=started, attempt=0))
    assert not store.apply_status(BackendStatus(job_id="job-1", state=JobState.PENDING))  # stale event
    assert not store.apply_status(
        BackendStatus(job_id="job-1", state=JobState.RUNNING, step=5, breakdown_ms={"a": 1.0})
    )
    job = store.get_job("job-1")
    assert job.state is JobState.RUNNING and job.step == 5 and job.breakdown_ms == {"a": 1.0}
    assert job.started_at == started
    assert store.apply_status(BackendStatus(job_id="job-1", state=JobState.FAILED, reason="ExitCode", message="exit 3"))
    assert not store.apply_status(BackendStatus(job_id="job-1", state=JobState.SUCCEEDED))  # terminal stays
    job = store.get_job("job-1")
    assert [(e.state, e.reason) for e in job.events] == [
        (JobState.QUEUED, None),
        (JobState.RUNNING, None),
        (JobState.FAILED, "ExitCode"),
    ]
    assert job.finished_at is not None and job.message == "exit 3"
    assert not store.apply_status(BackendStatus(job_id="unknown", state=JobState.RUNNING))


def test_retry_starts_the_next_attempt_and_ignores_the_old_attempts_statuses(store: Store) -> None:
    store.insert_job(new_job())
    with pytest.raises(InvalidTransition, match="only FAILED, CANCELLED or ERROR"):
        store.retry("job-1", tenant="team-a")
    store.apply_status(BackendStatus(job_id="job-1", state=JobState.ERROR, reason="Lost", attempt=0))
    with pytest.raises(JobNotFound):
        store.retry("job-1", tenant="team-b")
    job = store.retry("job-1", tenant="team-a")
    assert job.state is JobState.QUEUED and job.attempt == 1 and job.reason == "Retry" and job.finished_at is None
    assert not store.apply_status(BackendStatus(job_id="job-1", state=JobState.ERROR, attempt=0))
    assert store.apply_status(BackendStatus(job_id="job-1", state=JobState.PENDING, attempt=1))


def test_cancel_before_submission_is_immediate_and_after_it_is_requested(store: Store) -> None:
    store.insert_job(new_job("job-q"))
    job = store.request_cancel("job-q", tenant="team-a")
    assert job.state is JobState.CANCELLED and job.cancel_requested_at is not None
    with pytest.raises(InvalidTransition, match="already CANCELLED"):
        store.request_cancel("job-q", tenant=None)
    store.insert_job(new_job("job-r"))
    store.mark_submitted("job-r", 0)
    store.apply_status(BackendStatus(job_id="job-r", state=JobState.RUNNING))
    job = store.request_cancel("job-r", tenant=None)
    assert job.state is JobState.RUNNING and job.cancel_requested_at is not None
    with pytest.raises(JobNotFound):
        store.request_cancel("job-r", tenant="team-b")
    store.mark_cancel_forced("job-r")
    assert store.get_job("job-r").cancel_forced


def test_gpu_use_counts_active_jobs_only_and_counts_by_state(store: Store) -> None:
    store.insert_job(new_job("a", gpus=8, pool="h200"))
    store.insert_job(new_job("b", gpus=8, pool="h200"))
    store.insert_job(new_job("c", gpus=8, pool="h200", tenant="team-b"))
    store.apply_status(BackendStatus(job_id="b", state=JobState.SUCCEEDED))
    assert store.gpu_use(tenant="team-a", pool="h200") == 8
    assert store.gpu_use(tenant="team-a", pool="cpu") == 0
    counts = store.counts_by_state()
    assert counts[JobState.QUEUED] == 2 and counts[JobState.SUCCEEDED] == 1 and counts[JobState.RUNNING] == 0
    assert {j.id for j in store.jobs_to_submit()} == {"a", "c"}
    assert {j.id for j in store.active_jobs()} == {"a", "c"}


def test_a_hand_over_of_many_jobs_is_one_transaction_that_moves_each_forward_only(store: Store) -> None:
    """Store.hand_over_many (a reconcile pass's hand-overs): each job's attempt marked submitted and its status
    applied as hand_over would, a job gone or already ended left as it is; and the pass's plain-row view of
    the active jobs (active_jobs_brief) says what the whole records say."""
    for job_id in ("a", "b", "c"):
        store.insert_job(new_job(job_id))
    store.set_state("c", JobState.ERROR, reason="Lost")
    store.request_cancel("b", tenant=None)  # queued, never handed over: CANCELLED at once
    store.insert_job(new_job("d"))
    pending = BackendStatus(job_id="", state=JobState.PENDING, phase="waiting for a slot", attempt=0)
    handed = [(job_id, 0, pending.model_copy(update={"job_id": job_id})) for job_id in ("a", "b", "c", "gone")]
    records = store.hand_over_many(handed)
    assert [r.state if r else None for r in records] == [JobState.PENDING, JobState.CANCELLED, JobState.ERROR, None]
    a = store.get_job("a")
    assert a.submitted_attempt == 0 and [e.state for e in a.events] == [JobState.QUEUED, JobState.PENDING]
    assert [e.state for e in store.get_job("c").events][-1] is JobState.ERROR  # an ended job: no event added
    brief = {job.id: job for job in store.active_jobs_brief()}
    assert set(brief) == {job.id for job in store.active_jobs()} == {"a", "d"}
    assert (brief["a"].state, brief["a"].submitted_attempt, brief["d"].state) == (JobState.PENDING, 0, JobState.QUEUED)
    assert store.active_jobs_brief("a") == [brief["a"]] and store.active_jobs_brief("c") == []
    assert store.active_jobs_brief(among=["a", "b", "c", "gone"]) == [brief["a"]]  # b and c ended
    assert store.active_jobs_brief(among=[]) == [] and store.active_jobs_brief(cancelling=True) == []
    store.request_cancel("a", tenant=None)
    assert [job.id for job in store.active_jobs_brief(cancelling=True)] == ["a"]
    assert store.hand_over_many([]) == []


def test_a_watch_polls_statuses_are_read_in_one_statement_and_written_in_one_transaction(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store.apply_statuses (the reconciler's watch, a poll's changes at once): each job moved forward as
    apply_status would, an ended job and one gone left alone, and one write transaction for them all (a change
    each cost a read and a write transaction); none when nothing would change."""
    for job_id in ("a", "b", "c", "d"):
        store.insert_job(new_job(job_id))
    store.set_state("c", JobState.ERROR, reason="Lost")
    store.hand_over_many([("d", 0, BackendStatus(job_id="d", state=JobState.RUNNING, attempt=0))])
    writes: list[bool] = []
    tx = store._tx
    monkeypatch.setattr(store, "_tx", lambda *, write=False: writes.append(write) or tx(write=write))
    polled = [
        BackendStatus(job_id="a", state=JobState.RUNNING, attempt=0),
        BackendStatus(job_id="b", state=JobState.SUCCEEDED, attempt=0, reason="Completed"),
        BackendStatus(job_id="c", state=JobState.RUNNING, attempt=0),  # ended here: left as it is
        BackendStatus(job_id="d", state=JobState.RUNNING, attempt=0),  # no change
        BackendStatus(job_id="gone", state=JobState.RUNNING, attempt=0),
    ]
    assert store.apply_statuses(polled) == 2
    assert writes.count(True) == 1 and len(writes) == 2  # one read, one write
    states = {job_id: store.get_job(job_id).state for job_id in ("a", "b", "c", "d")}
    assert states == {"a": JobState.RUNNING, "b": JobState.SUCCEEDED, "c": JobState.ERROR, "d": JobState.RUNNING}
    assert [e.state for e in store.get_job("b").events] == [JobState.QUEUED, JobState.SUCCEEDED]
    writes.clear()
    assert store.apply_statuses(polled) == 0 and writes == [False]  # nothing would change: no write transaction
    assert store.apply_statuses([]) == 0


def test_set_state_is_ignored_once_terminal(store: Store) -> None:
    store.insert_job(new_job())
    store.set_state("job-1", JobState.ERROR, reason="Lost")
    store.set_state("job-1", JobState.FAILED, reason="Other")
    job = store.get_job("job-1")
    assert (job.state, job.reason) == (JobState.ERROR, "Lost")


def test_deadlines_round_trip_as_utc(store: Store) -> None:
    deadline = datetime(2030, 6, 1, 12, tzinfo=UTC) + timedelta(microseconds=5)
    job, _ = store.insert_job(new_job(deadline=deadline))
    assert store.get_job(job.id).deadline == deadline


def test_tokens_are_stored_hashed_and_revocable(store: Store) -> None:
    info = store.add_token(token_hash="ab" * 32, name="alice", tenant="team-a", admin=False)
    assert store.find_token("ab" * 32) == info
    assert store.find_token("cd" * 32) is None
    assert store.revoke_token(info.id) and not store.revoke_token(info.id) and not store.revoke_token(999)
    assert store.find_token("ab" * 32) is None
    assert [t.revoked_at is not None for t in store.list_tokens()] == [True]


def test_ping_answers(store: Store) -> None:
    store.ping()


def _quota(limit: int) -> Callable[[int], None]:
    """An admission check allowing `limit` one-GPU jobs; it dwells a moment so racing checks overlap."""

    def admit(used: int) -> None:
        time.sleep(0.02)  # widens the check-then-insert window a missing lock would let others into
        if used + 1 > limit:
            raise QuotaExceeded(f"{used} of {limit} GPUs in use")

    return admit


def test_concurrent_admissions_never_overrun_the_quota(store: Store) -> None:
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def submit(i: int) -> None:
        barrier.wait()
        try:
            store.insert_job(new_job(f"job-{i}"), admit=_quota(3))
            outcomes.append("admitted")
        except QuotaExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["admitted"] * 3 + ["refused"] * 5
    assert store.gpu_use(tenant="team-a", pool="cpu") == 3


def _admit_from_another_process(database_url: str, first: int, barrier: Barrier) -> None:
    """A second controller: its own Store (engine, pool, in-process lock) submitting from 4 threads."""
    store = Store(database_url)

    def submit(i: int) -> None:
        with contextlib.suppress(QuotaExceeded):
            store.insert_job(new_job(f"job-{i}"), admit=_quota(3))

    barrier.wait()
    threads = [threading.Thread(target=submit, args=(i,)) for i in range(first, first + 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.dispose()


def test_admissions_from_two_controller_processes_never_overrun_the_quota(store: Store, database_url: str) -> None:
    """The quota holds across replicas: the lock is the database's (BEGIN IMMEDIATE on SQLite, an
    advisory lock on PostgreSQL), not one process's."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    processes = [
        context.Process(target=_admit_from_another_process, args=(database_url, first, barrier)) for first in (0, 4)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    assert store.gpu_use(tenant="team-a", pool="cpu") == 3
    assert len(store.list_jobs(tenant="team-a")[0]) == 3


def test_a_replay_at_the_quota_returns_the_stored_job(store: Store) -> None:
    job, created = store.insert_job(new_job("job-1"), admit=_quota(1))
    again, created_again = store.insert_job(new_job("job-1"), admit=_quota(1))
    assert created and not created_again and again.id == job.id
    with pytest.raises(QuotaExceeded):
        store.insert_job(new_job("job-2"), admit=_quota(1))


def test_submissions_on_an_event_loop_share_transactions_and_keep_idempotency(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store.insert_job_async (the API's submissions): concurrent callers wait as futures for one committer,
    which inserts each batch in one write transaction; a replay returns the stored job, another body conflicts."""
    writes: list[bool] = []
    tx = store._tx
    monkeypatch.setattr(store, "_tx", lambda *, write=False: writes.append(write) or tx(write=write))

    async def submit_all() -> list[object]:
        jobs = [store.insert_job_async(new_job(f"job-{i}", labels={"i": str(i)})) for i in range(20)]
        return await asyncio.gather(*jobs, return_exceptions=True)

    outcomes = asyncio.run(submit_all())
    assert [(job.id, created) for job, created in outcomes] == [(f"job-{i}", True) for i in range(20)]  # type: ignore[misc]
    assert 1 <= writes.count(True) <= 2  # the first batch, then everyone who came while it committed
    assert store.get_job("job-7").labels == {"i": "7"}
    assert [e.state for e in store.get_job("job-7").events] == [JobState.QUEUED]

    async def replay() -> list[object]:
        same = store.insert_job_async(new_job("job-3", labels={"i": "3"}))
        other = store.insert_job_async(new_job("job-4", request_hash="h2"))
        return await asyncio.gather(same, other, return_exceptions=True)

    again, conflict = asyncio.run(replay())
    assert again[0].id == "job-3" and again[1] is False  # type: ignore[index]
    assert isinstance(conflict, IdempotencyConflict)
    assert len(store.list_jobs(tenant="team-a", limit=100)[0]) == 20


def test_submissions_on_an_event_loop_and_in_threads_never_overrun_the_quota(store: Store) -> None:
    """The quota holds across the loop's batches and the threads' insert_job (the same database locks)."""
    outcomes: list[str] = []

    def in_thread(i: int) -> None:
        try:
            store.insert_job(new_job(f"thread-{i}"), admit=_quota(3))
            outcomes.append("admitted")
        except QuotaExceeded:
            outcomes.append("refused")

    async def on_loop() -> None:
        jobs = [store.insert_job_async(new_job(f"loop-{i}"), admit=_quota(3)) for i in range(6)]
        for outcome in await asyncio.gather(*jobs, return_exceptions=True):
            assert isinstance(outcome, (tuple, QuotaExceeded)), outcome
            outcomes.append("refused" if isinstance(outcome, QuotaExceeded) else "admitted")

    threads = [threading.Thread(target=in_thread, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    asyncio.run(on_loop())
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["admitted"] * 3 + ["refused"] * 7
    assert store.gpu_use(tenant="team-a", pool="cpu") == 3


def test_a_failed_batch_fails_its_waiting_submissions_and_the_next_one_commits(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store failing (a database outage) answers every submission of the batch with the error, and the
    committer does not stay stuck: the next submission is inserted."""
    from sqlalchemy.exc import OperationalError

    insert = store._admit_and_insert

    def outage(*_: object) -> None:
        raise OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(store, "_admit_and_insert", outage)

    async def submit(ids: list[str]) -> list[object]:
        return await asyncio.gather(*(store.insert_job_async(new_job(i)) for i in ids), return_exceptions=True)

    failed = asyncio.run(submit(["a", "b", "c"]))
    assert all(isinstance(outcome, OperationalError) for outcome in failed), failed
    monkeypatch.setattr(store, "_admit_and_insert", insert)
    [(job, created)] = asyncio.run(submit(["a"]))  # type: ignore[misc]
    assert created and job.id == "a" and store.find_job("b") is None


def test_a_batch_is_one_read_and_on_postgresql_one_insert_statement(store: Store) -> None:
    """A batch's statements (on PostgreSQL each a round trip): the admission lock, one read of the ids already
    stored and of the GPU use, and one insert of the jobs, their labels and events (PostgreSQL; SQLite three
    inserts, no round trips). Before, the read was two statements and the insert three."""
    from sqlalchemy import event

    store.insert_job(new_job("stored", labels={"x": "1"}), admit=_quota(10))
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement.split()[0].upper())

    event.listen(store.engine, "before_cursor_execute", record)
    try:

        async def submit() -> list[object]:
            jobs = [
                store.insert_job_async(new_job("stored", labels={"x": "1"}), admit=_quota(10)),
                store.insert_job_async(new_job("a", labels={"x": "2", "y": "3"}), admit=_quota(10)),
                store.insert_job_async(new_job("b"), admit=_quota(10)),
                store.insert_job_async(new_job("c", tenant="team-b", pool="h200", gpus=8), admit=_quota(10)),
                store.insert_job_async(new_job("d", tenant="team-b", pool="h200"), admit=_quota(8)),
            ]
            return await asyncio.gather(*jobs, return_exceptions=True)

        stored, a, b, c, refused = asyncio.run(submit())
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    assert (stored[1], a[1], b[1], c[1]) == (False, True, True, True)  # type: ignore[index]
    assert isinstance(refused, QuotaExceeded)  # c's 8 GPUs, earlier in the batch, count against d
    postgres = store.engine.dialect.name == "postgresql"
    inserts = ["WITH"] if postgres else ["INSERT"] * 3  # WITH new_jobs AS (INSERT …), … INSERT INTO job_events
    locks = ["SELECT"] * 2 if postgres else []  # (team-a, cpu), (team-b, h200)
    replay = ["SELECT", "SELECT"]  # the stored job and its events, read after the batch for the replay
    assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == [*locks, "SELECT", *inserts, *replay], statements
    assert store.get_job("a").labels == {"x": "2", "y": "3"} and store.get_job("c").labels == {}
    assert [e.state for e in store.get_job("a").events] == [JobState.QUEUED]
    assert store.gpu_use(tenant="team-b", pool="h200") == 8 and store.gpu_use(tenant="team-a", pool="cpu") == 3
