"""Keeps the store in step with the backend: submits queued jobs, follows status, enforces cancels.

The backend is the source of truth for running jobs. Two threads: one runs a full list-based pass every
interval (or when woken by a cancel, a retry, a change of leader) and, in between, a submit pass when a new
job was queued (`queued`: it hands the queued jobs to the backend and reads nothing else, so a submission
costs O(1) there, not a full pass over every active job); one follows backend.watch for prompt updates. An
unreachable backend is counted and retried; it never makes a job fail.

One bad job never stops a pass. A queued job that cannot be handed to the backend (its pool was
removed from the pools file, the backend rejects its spec, building the backend object raises) is
set to ERROR with a reason (UnknownPool, SubmitRejected) and the pass goes on with the other jobs.
A per-job call that fails otherwise (a cancel the backend refuses) is logged, counted in
foxhunt_backend_errors_total and retried next pass, while the other jobs are handled. Only an
unreachable backend or store fails a whole pass; `failing` turns true after FAILING_PASSES failed
passes in a row, and /readyz then answers 503.

With leader election, leadership is checked by the clock (service/leader.py) before each pass and
again before each backend call within it: a replica that stalled mid-pass (SIGSTOP, a long pause)
and lost the Lease meanwhile ends the pass at its next call instead of acting beside the new leader.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from service.backends.base import Backend, BackendError, BackendNotFound, BackendUnavailable
from service.domain import BackendStatus, JobSpec, JobState
from service.errors import InvalidTransition, UnknownPool
from service.metrics import ControllerMetrics
from service.pools import Pools
from service.store import ActiveJob, JobRecord, Store

log = logging.getLogger(__name__)

FAILING_PASSES = 3
"""Failed passes in a row after which the reconciler counts as failing (and /readyz says 503)."""
COMPLETE_SYNC_EVERY = 12
"""Of the periodic passes over a backend that can tell what changed (the local one's changed_statuses), every
this many reads every job (list_statuses); the others read the jobs that changed since the last pass, those
holding a slot and those being cancelled. With the default 5 s interval, a complete pass a minute."""
HAND_OVER_BATCH = 200
"""Jobs a pass hands to the backend before the store records them (one transaction for them all)."""
SUBMIT_PASS_DELAY_SECONDS = 0.05
"""How long a submit pass waits after the first new job woke it: the jobs queued meanwhile go in the same pass
(one store read and one transaction for them all) instead of a pass each (at 100 submissions a second the
passes' own cost was most of the reconciler's)."""


class NotLeading(Exception):
    """The Lease was lost (or its renew deadline passed) during a pass: the rest of the pass is skipped."""


class Leadership(Protocol):
    """Whether this replica may reconcile now (service/leader.py's LeaderElector holds a Lease for it)."""

    @property
    def leading(self) -> bool: ...


def spec_for(job: JobRecord, pools: Pools) -> JobSpec:
    """The backend's view of a stored job. A job submitted with epochs is stored with a config that leaves
    run.steps out (service/jobs.py), and its pipeline's resolve step turns the epochs into run.steps."""
    pool = pools.get(job.pool)
    return JobSpec(
        job_id=job.id,
        tenant=job.tenant,
        pool=job.pool,
        queue_name=pool.queue_name,
        placement=pool.placement(),
        plan=job.plan,
        model=job.model,
        commit_sha=job.commit_sha,
        epochs=job.epochs,
        train_epochs=None if "steps" in job.config.get("run", {}) else job.epochs,
        hyperopt_trials=job.hyperopt_trials,
        config=job.config,
        labels=job.labels,
        priority=job.priority,
        attempt=job.attempt,
    )


@dataclass(eq=False)  # one per controller: compared and hashed by identity
class Reconciler:
    """Brings the backend in step with the store: submits, cancels and times out jobs, and records what the
    backend says of them, every `interval_seconds` and on every watch event."""

    store: Store
    backend: Backend
    pools: Pools
    metrics: ControllerMetrics
    interval_seconds: float = field(kw_only=True)
    grace_seconds: float = field(kw_only=True)
    """How long a cancel may take before the job is forced to CANCELLED."""
    leader: Leadership | None = field(default=None, kw_only=True)
    last_success: float | None = field(default=None, init=False)
    failed_passes: int = field(default=0, init=False)
    last_error: str | None = field(default=None, init=False)
    _wake: threading.Event = field(default_factory=threading.Event, init=False)
    _full_due: threading.Event = field(default_factory=threading.Event, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False)
    _cancel_sent: set[tuple[str, int]] = field(default_factory=set, init=False)
    _pass_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _sync_token: int | None = field(default=None, init=False)
    """The backend's change token after the last pass's sync; None: the next pass reads every job."""
    complete_sync_every: int = field(default=COMPLETE_SYNC_EVERY, kw_only=True)

    def wake(self) -> None:
        """A full pass now (a cancel or retry to send, leadership gained)."""
        self._full_due.set()
        self._wake.set()

    def queued(self) -> None:
        """A job was queued: a submit pass now (the full pass keeps its period)."""
        self._wake.set()

    @property
    def leading(self) -> bool:
        """Whether this replica runs the passes: always without leader election, else while it holds the Lease."""
        return self.leader is None or self.leader.leading

    @property
    def failing(self) -> str | None:
        """Why the reconciler counts as failing (FAILING_PASSES failed passes in a row), or None."""
        if self.failed_passes < FAILING_PASSES:
            return None
        return f"the last {self.failed_passes} reconcile passes failed; last error: {self.last_error}"

    def start(self) -> None:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._pass_loop, name="reconcile-pass", daemon=True),
            threading.Thread(target=self._watch_loop, name="reconcile-watch", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        stop_watch = getattr(self.backend, "stop_watch", None)  # the local backend's watch polls: end it now
        if stop_watch is not None:
            stop_watch()
        for thread in self._threads:
            thread.join(timeout=self.interval_seconds + 5)
        self._threads = []

    # ---- one pass ---------------------------------------------------------------------------------

    def reconcile_once(self, *, complete: bool = True) -> bool:
        """Expire passed deadlines, submit queued jobs, then bring every job in step with
        backend.list_statuses(). Not `complete`, and the backend can tell what changed since the last pass
        (changed_statuses): only the jobs that changed, hold a slot or are being cancelled, and no job is found
        Lost (the next complete pass does that). True on success."""
        with self._pass_lock:
            started = time.monotonic()
            try:
                self._check_leading()
                self._expire_deadlines()  # the store alone: deadlines pass while the backend is down too
                self._submit_queued()
                self._sync(complete=complete)
            except BackendUnavailable as error:
                log.warning("backend unavailable during reconcile: %s", error)
                self._pass_failed(error)
                return False
            except NotLeading:
                log.info("reconcile pass stopped: this replica no longer holds the Lease")
                return False
            except Exception as error:
                self._pass_failed(error)
                raise
            self.failed_passes, self.last_error = 0, None
            self.last_success = time.monotonic()
            self.metrics.reconcile_seconds.observe(self.last_success - started)
            return True

    def submit_once(self) -> bool:
        """Hand the queued jobs to the backend, nothing else (between full passes). True on success; a failure
        is logged and left to the next full pass, which counts it."""
        with self._pass_lock:
            try:
                self._check_leading()
                self._submit_queued()
            except BackendUnavailable as error:
                log.warning("backend unavailable during a submit pass: %s", error)
                return False
            except NotLeading:
                return False
            return True

    def _check_leading(self) -> None:
        """Before each pass and each backend call: a replica whose Lease may have passed to another acts no more."""
        if not self.leading:
            raise NotLeading

    def _pass_failed(self, error: Exception) -> None:
        self.failed_passes += 1
        self.last_error = f"{type(error).__name__}: {error}"

    def _call_failed(self, operation: str, error: BackendError) -> None:
        cause = (
            "unavailable"
            if isinstance(error, BackendUnavailable)
            else "not_found"
            if isinstance(error, BackendNotFound)
            else "other"
        )
        self.metrics.record_backend_error(operation, cause)

    def _expire_deadlines(self) -> None:
        """Cancel every active job past its deadline: a queued one the backend never got ends at once
        (never submitted), a submitted one is stopped by the cancel `_sync` sends."""
        now = datetime.now(UTC)
        for job in self.store.active_jobs(with_deadline=True):
            if job.deadline is not None and now > job.deadline and job.cancel_requested_at is None:
                try:
                    self.store.request_cancel(job.id, tenant=None, reason="DeadlineExceeded")
                except InvalidTransition:  # it ended meanwhile
                    continue
                self.metrics.record_recovery("deadline")

    def _bad_job(self, job: JobRecord, reason: str, message: str) -> None:
        """A queued job that can never be handed over as it is: ERROR with the reason, and the pass goes on."""
        log.warning("job %s cannot be submitted (%s): %s", job.id, reason, message)
        self.store.set_state(job.id, JobState.ERROR, reason=reason, message=message)
        self.metrics.record_recovery("bad_job")

    def _submit_queued(self) -> None:
        """Hand every queued job to the backend; the store records them in one transaction per HAND_OVER_BATCH."""
        handed: list[tuple[JobRecord, BackendStatus]] = []
        try:
            for job in self.store.jobs_to_submit():
                try:
                    spec = spec_for(job, self.pools)
                except UnknownPool as error:  # the pool left the pools file while the job waited
                    self._bad_job(job, "UnknownPool", str(error))
                    continue
                self._check_leading()
                try:
                    status = self.backend.submit(spec)
                except BackendUnavailable as error:
                    self._call_failed("submit", error)
                    raise
                except BackendError as error:
                    self._call_failed("submit", error)
                    self._bad_job(job, "SubmitRejected", str(error))
                    continue
                except Exception as error:  # building the backend's object failed (e.g. a ValueError)
                    log.exception("submitting job %s raised", job.id)
                    self.metrics.record_backend_error("submit", "other")
                    self._bad_job(job, "SubmitRejected", f"the backend could not take the job: {error}")
                    continue
                if job.submitted_attempt == job.attempt:
                    self.metrics.record_recovery("resubmitted")
                handed.append((job, status))
                if len(handed) >= HAND_OVER_BATCH:
                    self._record_hand_over(handed)
                    handed = []
        finally:  # what the backend took is recorded also when the pass stops early
            self._record_hand_over(handed)

    def _record_hand_over(self, handed: list[tuple[JobRecord, BackendStatus]]) -> None:
        records = self.store.hand_over_many([(job.id, job.attempt, status) for job, status in handed])
        for (_, status), after in zip(handed, records, strict=True):
            if after is not None and after.cancel_requested_at is not None and not status.state.terminal:
                self._send_cancel(after, force=False)

    def _changes(self, since: int | None) -> tuple[list[BackendStatus] | None, list[ActiveJob], int | None]:
        """An incremental pass's statuses and active jobs, and the backend's token after them; (None, [], token)
        when the pass must read every job."""
        changed_statuses = getattr(self.backend, "changed_statuses", None)  # the local backend's; not Argo's
        if changed_statuses is None:
            return None, [], None
        cancelling = self.store.active_jobs_brief(cancelling=True) if since is not None else []
        statuses, token = changed_statuses(since, also=[job.id for job in cancelling])
        if statuses is None:
            return None, [], token
        listed = {status.job_id for status in statuses}
        return statuses, self.store.active_jobs_brief(among=sorted(listed)), token

    def _sync(self, *, complete: bool = True) -> None:
        self._check_leading()
        since = None if complete else self._sync_token
        self._sync_token = None  # until this sync has applied what it read: a failed one is followed by a complete one
        try:
            statuses, brief, token = self._changes(since)
            complete = statuses is None  # what the backend lists then is every job it holds: a missing one is Lost
            if statuses is None:
                statuses, brief = self.backend.list_statuses(), self.store.active_jobs_brief()
        except BackendUnavailable as error:
            self._call_failed("list", error)
            raise
        seen = {status.job_id: status for status in statuses}
        active: dict[str, ActiveJob] = {}
        for job in brief:  # a terminal job never changes: skip those statuses
            listed = seen.get(job.id)
            # no read per job (O(N) statements per pass); one whose state this changed is read again, not all
            if listed is not None and self.store.apply_status(listed, known=job):
                fresh = self.store.active_jobs_brief(job.id)
                if not fresh:
                    continue
                job = fresh[0]
            active[job.id] = job
        now = datetime.now(UTC)
        for status in statuses:
            if status.state.terminal or status.job_id in active:
                continue
            stored = self.store.find_job(status.job_id)  # cancelled here before the backend got it
            if stored is not None and stored.cancel_requested_at is not None:
                self._send_cancel(stored, force=True)
        for job in active.values():
            listed = seen.get(job.id)
            if listed is None:
                if complete and job.state is not JobState.QUEUED and job.submitted_attempt == job.attempt:
                    self.store.set_state(
                        job.id, JobState.ERROR, reason="Lost", message="the backend no longer has this job"
                    )
                    self.metrics.record_recovery("lost")
                continue
            if job.cancel_requested_at is not None and not listed.state.terminal:
                overdue = (now - job.cancel_requested_at).total_seconds() > self.grace_seconds
                self._send_cancel(job, force=overdue)
        self._sync_token = token

    def _send_cancel(self, job: JobRecord | ActiveJob, *, force: bool) -> None:
        """Graceful once per attempt (again after a restart), forced once after the grace period."""
        key = (job.id, job.attempt)
        if force and job.cancel_forced:
            return
        if not force and key in self._cancel_sent:
            return
        self._check_leading()
        try:
            self.backend.cancel(job.id, force=force)
        except BackendNotFound as error:
            self._call_failed("cancel", error)
            return
        except BackendUnavailable as error:
            self._call_failed("cancel", error)
            raise
        except Exception as error:  # refused for this one job: the others still get theirs; retried next pass
            log.warning("cancel of job %s failed: %s", job.id, error)
            self._call_failed("cancel", error if isinstance(error, BackendError) else BackendError(str(error)))
            return
        self._cancel_sent.add(key)
        if force:
            self.store.mark_cancel_forced(job.id)
            self.metrics.record_recovery("cancel_forced")
        elif job.state is not JobState.QUEUED and job.cancel_requested_at is not None:
            age = (datetime.now(UTC) - job.cancel_requested_at).total_seconds()
            if age > self.interval_seconds * 2:
                self.metrics.record_recovery("cancel_resent")

    # ---- threads ----------------------------------------------------------------------------------

    def _pass_loop(self) -> None:
        next_full = 0.0
        since_complete = 0  # periodic passes since the last complete one
        while not self._stop.is_set():
            if not self.leading:
                self._sync_token = None  # the other replica's passes meanwhile: a complete one when ours again
            if self.leading:  # another replica's passes otherwise; it is woken when the Lease becomes ours
                full = self._full_due.is_set() or time.monotonic() >= next_full
                try:
                    if full:
                        # woken (a cancel, a retry, the Lease gained) or every complete_sync_every: every job
                        complete = self._full_due.is_set() or since_complete + 1 >= self.complete_sync_every
                        since_complete = 0 if complete else since_complete + 1
                        self._full_due.clear()
                        next_full = time.monotonic() + self.interval_seconds
                        self.reconcile_once(complete=complete)
                    else:
                        self._stop.wait(SUBMIT_PASS_DELAY_SECONDS)
                        self._wake.clear()  # the jobs that woke it meanwhile are in this pass
                        self.submit_once()
                except Exception:  # a bug in one pass must not stop reconciliation for good
                    log.exception("reconcile pass failed")
            if not self._full_due.is_set():  # a wake() during a submit pass's delay: the full pass at once
                self._wake.wait(max(0.0, next_full - time.monotonic()) if self.leading else self.interval_seconds)
            self._wake.clear()

    def _watch_batches(self) -> Iterator[list[BackendStatus]]:
        """The backend's watch, as lists to record in one transaction each: a poll's changes where the backend
        polls (the local one's watch_polls; a change each cost a read and a write transaction of its own), one
        status a list otherwise (Argo's watch streams events one at a time)."""
        polls = getattr(self.backend, "watch_polls", None)
        if polls is not None:
            yield from polls(timeout_seconds=self.interval_seconds)
            return
        for status in self.backend.watch(timeout_seconds=self.interval_seconds):
            yield [status]

    def _watch_loop(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            if not self.leading:
                self._stop.wait(self.interval_seconds)
                continue
            try:
                for statuses in self._watch_batches():
                    if self._stop.is_set() or not self.leading:
                        break
                    self.store.apply_statuses(statuses)
                backoff = 0.5
            except BackendUnavailable as error:
                self._call_failed("watch", error)
                self.metrics.record_recovery("watch_restarted")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except Exception:
                log.exception("watch failed; restarting it")
                self.metrics.record_recovery("watch_restarted")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
