"""The default backend: jobs as subprocesses on this machine, recorded in job directories.

Each job has `<jobs_dir>/<job_id>/`: `job.json` (the JobSpec and the controller's pools file as it was when
the job was handed over; written atomically, the commit point of a submission and the one file it writes),
and from its launch on `config.json` and `pools.yaml` (both from job.json: the job's config, and the pools the
resolve step checks the job's pool against, as on Argo), `log.txt`, `run/`
(the pipeline's outputs: config.json, check/, hyperopt/, train/ with the trainer's `progress.json`,
status.json), `checkpoints/`, `optuna.db`, and per attempt `run-<n>.json` (claimed before launch),
`pid-<n>` (the supervisor), `pgid-<n>` (the attempt's process group: the supervisor leads a session of
its own, and every step and trainer process it starts stays in it), `pipeline-<n>.json` (the step
running now), `exit-<n>.json` (written by local_supervisor.py when the pipeline has ended), `cancel-<n>`
and `lost-<n>` (when the supervisor was found gone with processes of its group still running).
A restarted controller reads these files back, so it finds running and finished jobs and never
starts one twice.

The backend keeps an index of every job folder in memory (its last status; waiting jobs by priority; the
attempts holding a slot), read whole once, then kept current by what changes: every change this backend
makes to a job folder that is not running (a submit, a cancel marker, a launch) is also appended, under the
scheduler's flock, to `<jobs_dir>/.changes` (one job id a line), which every backend sharing the folder reads
from where it last stopped; only a running job's files change without a line there (its supervisor and
trainer write them), and the running jobs (at most the slots, and any whose orphans are being stopped) are
read again at each poll. So a poll of the watch reads O(changed) job folders, not all of them: with 10,000
jobs queued it had read every folder five times a second.

Signals go to the process group, never to one pid: a cancel reaches every step and trainer process,
also after their supervisor died. A supervisor that vanished without an exit code (killed, OOM) leaves
its steps running: they are stopped (SIGTERM, SIGKILL after the grace period) before the attempt reads
ERROR/ProcessLost, and the job stays RUNNING until the last of them has gone, so a retry cannot start a
second trainer beside an orphan. A new attempt is not launched either while a process of an earlier one
is alive.

A job runs the job pipeline (contracts/pipeline.py) through local_pipeline.py: the same steps and
commands as on Argo, with `command` as the trainer program.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from contracts.jsonfile import read_json_object, write_json_atomic
from service.backends.base import BackendNotFound, BackendUnavailable
from service.backends.local_pipeline import POOLS_FILE, search_progress, state_file, train_progress
from service.backends.spawn import spawn
from service.domain import MAX_RUNS, BackendStatus, JobSpec, JobState, RunProgress
from service.pools import Pools

if TYPE_CHECKING:
    from service.settings import Settings

_SUPERVISOR = "service.backends.local_supervisor"
_CANCEL_CODES = {143, -signal.SIGTERM, 137, -signal.SIGKILL}
_LOST_PHASE = "stopping: the supervisor is gone"
_LAST_LINE_CHARS = 300
_JOURNAL = ".changes"
_JOURNAL_MAX_BYTES = 1 << 20
"""Past this size the journal is replaced by an empty one (a new inode): every reader then reads the folder whole."""
_POOLS_KEY = "pools_file"
_NOT_INDEXED = frozenset({"config", _POOLS_KEY})
"""job.json's large parts, which only a launch reads (from the file): the index keeps every job's spec without
them, for as long as the controller runs (the whole config of thousands of jobs made each of the garbage collector's
full collections take about 100 ms, the interpreter held)."""
_PF_KTHREAD = 0x00200000
"""/proc/<pid>/stat flags: a kernel thread (no command line either)."""


def pack_runs(value: Any) -> list[RunProgress] | None:
    """A progress file's per-run entries, or None when it has none or they are not valid: the file is the
    trainer's, and a bad one must not break the job's status (its step and breakdown still count)."""
    if not isinstance(value, list) or len(value) > MAX_RUNS:
        return None
    try:
        runs = [RunProgress.model_validate(entry) for entry in value]
    except ValidationError:
        return None
    return runs if len({run.run for run in runs}) == len(runs) else None


def detect_gpus() -> int:
    """GPUs this machine offers, without torch: CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _now() -> datetime:
    return datetime.now(UTC)


def _index_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """What the index keeps of a job.json: everything but `_NOT_INDEXED`."""
    return {key: value for key, value in spec.items() if key not in _NOT_INDEXED}


class LocalBackend:
    """Runs at most `slots` jobs at once (one per GPU, or one on a CPU-only machine).

    `command` is the trainer program (`python -m trainer`); each pipeline step appends its own arguments.
    A job's hyper-parameter trials run `parallel_trials` at a time on the job's one slot.
    """

    name = "local"

    def __init__(
        self,
        jobs_dir: Path,
        *,
        command: list[str],
        gpus: int,
        grace_seconds: float = 30.0,
        poll_seconds: float = 0.2,
        parallel_trials: int = 1,
        pools_file: Path | None = None,
    ) -> None:
        self.jobs_dir = Path(jobs_dir).resolve()
        self.pools_file = pools_file
        self.command = list(command)
        self.gpus = gpus
        self.slots = max(gpus, 1)
        self.grace_seconds = grace_seconds
        self.poll_seconds = poll_seconds
        self.parallel_trials = parallel_trials
        self._lock = threading.Lock()
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._final: dict[str, tuple[int, BackendStatus]] = {}  # job id -> (job.json mtime, terminal status)
        self._specs: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}  # job id -> (job.json version, spec)
        # the index (module docstring), all under the scheduler's lock:
        self._known: dict[str, BackendStatus] = {}  # job id -> its last status
        self._waiting: dict[str, tuple[int, float]] = {}  # not launched, not cancelled -> (-priority, submitted_at)
        self._holders: dict[str, int | None] = {}  # launched and not ended: holds a slot -> its GPU
        self._journal_at: tuple[int, int] | None = None  # (inode, bytes read) of .changes; None: read the folder whole
        self._version = 0
        self._changed: dict[str, int] = {}  # job id -> version of its last status change, oldest change first
        self._pools_text: tuple[tuple[int, int], str] | None = None  # the pools file, by (mtime, size)
        self._watch_stopped = threading.Event()

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalBackend:
        gpus = settings.local_gpus if settings.local_gpus is not None else detect_gpus()
        return cls(
            settings.jobs_dir,
            command=settings.local_command,
            gpus=gpus,
            grace_seconds=settings.cancel_grace_seconds,
            parallel_trials=settings.local_parallel_trials,
            pools_file=settings.pools_file,
        )

    def _pools_now(self) -> str:
        """The controller's pools file as it is now (service/app.py's): FOXHUNT_POOLS_FILE, else the one local
        pool; read again only when the file changes."""
        if self.pools_file is None:
            return json.dumps({"pools": [pool.model_dump(mode="json") for pool in Pools.local(self.gpus)]})
        info = self.pools_file.stat()
        version = (info.st_mtime_ns, info.st_size)
        if self._pools_text is None or self._pools_text[0] != version:
            self._pools_text = (version, self.pools_file.read_text())
        return self._pools_text[1]

    # ---- the Backend interface --------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> BackendStatus:
        """Record the job; it starts when a slot is free. Same job id and attempt: the existing job.

        One file and a line in the journal; the scheduler then reads only the journal's new lines and the
        running jobs, never every job folder (which made a reconcile pass of N queued jobs O(N^2)), and only
        when the index has a free slot: while every slot is held, the watch's next poll finds a freed one."""
        job_dir = self._dir(spec.job_id)
        with self._locked():
            existing = read_json_object(job_dir / "job.json")
            if existing is not None and int(existing.get("attempt", 0)) >= spec.attempt:
                return self._status(job_dir)
            if existing is not None and not self._status(job_dir).state.terminal:
                return self._status(job_dir)
            job_dir.mkdir(parents=True, exist_ok=True)
            record = {**spec.model_dump(mode="json"), "submitted_at": time.time(), _POOLS_KEY: self._pools_now()}
            write_json_atomic(job_dir / "job.json", record)  # config.json and pools.yaml are written at launch
            self._remember_spec(job_dir, record)  # what the status and the launch read next: not parsed back
            self._journal(job_dir.name)
            if len(self._holders) < self.slots:  # else the watch's next poll schedules
                self._schedule_locked()
            return self._status(job_dir)

    def status(self, job_id: str) -> BackendStatus:
        job_dir = self._dir(job_id)
        with self._locked():
            self._schedule_locked()
            if not (job_dir / "job.json").is_file():
                raise BackendNotFound(f"local backend has no job {job_id}")
            return self._status(job_dir)

    def list_statuses(self) -> list[BackendStatus]:
        """Statuses are read under the scheduler's lock, so a launch is never seen half done. From the index,
        with the folder's listing compared against it (a job folder removed by hand is gone from the list)."""
        with self._locked():
            self._schedule_locked(listing=True)
            return [self._known[name].model_copy() for name in sorted(self._known)]

    def changed_statuses(
        self, since: int | None, *, also: Collection[str] = ()
    ) -> tuple[list[BackendStatus] | None, int]:
        """For the reconciler's incremental pass: the statuses that changed after `since` (a token this method
        returned), those of the jobs holding a slot (their progress moves without changing the state) and
        those of the jobs in `also`, with the token to pass next time. None instead of a list when `since` is
        None: the caller lists every job (list_statuses). Jobs whose folders were removed by hand show only in
        a full list."""
        with self._locked():
            self._schedule_locked()
            if since is None:
                return None, self._version
            names = {status.job_id for status in self._changed_since(since)}
            names.update(self._holders)
            names.update(name for name in also if name in self._known)
            return [self._known[name].model_copy() for name in sorted(names) if name in self._known], self._version

    def cancel(self, job_id: str, *, force: bool = False) -> None:
        """SIGTERM to the job's process group, SIGKILL after the grace period (at once with `force`)."""
        job_dir = self._dir(job_id)
        spec = read_json_object(job_dir / "job.json")
        if spec is None:
            raise BackendNotFound(f"local backend has no job {job_id}")
        attempt = int(spec.get("attempt", 0))
        with self._locked():  # not between the scheduler's check of the marker and its launch
            (job_dir / f"cancel-{attempt}").touch()
            self._journal(job_dir.name)
            if not self._signal_group(job_dir, attempt, signal.SIGKILL if force else signal.SIGTERM):
                return
        if not force and self.grace_seconds >= 0:
            timer = threading.Timer(self.grace_seconds, self._kill_if_alive, args=(job_dir, attempt))
            timer.daemon = True
            timer.start()

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[str]:
        """Lines of the job's log; with `follow`, keeps reading until the job has ended (an empty string
        each idle poll: the consumer's chance to stop, e.g. when an HTTP client has gone)."""
        job_dir = self._dir(job_id)
        if not (job_dir / "job.json").is_file():
            raise BackendNotFound(f"local backend has no job {job_id}")
        return self._read_log(job_dir, follow)

    def watch(self, *, timeout_seconds: float | None = None) -> Iterator[BackendStatus]:
        """Polls the jobs and yields each status that changed since the last poll: a poll reads the running
        jobs and those the journal names, not every job folder."""
        for changed in self.watch_polls(timeout_seconds=timeout_seconds):
            yield from changed

    def watch_polls(self, *, timeout_seconds: float | None = None) -> Iterator[list[BackendStatus]]:
        """`watch`, one list per poll that found changes: the reconciler records each poll's in one transaction."""
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        self._watch_stopped.clear()
        with self._locked():
            self._schedule_locked()
            seen = self._version
        while deadline is None or time.monotonic() < deadline:
            if self._watch_stopped.wait(self.poll_seconds):
                return
            with self._locked():
                self._schedule_locked()
                changed = self._changed_since(seen)
                seen = self._version
            if changed:
                yield changed

    def stop_watch(self) -> None:
        """End the running watch at its next poll (the reconciler stops): it otherwise ran to its timeout, the
        reconcile interval, and a worker giving up the reconciler held its lock that long."""
        self._watch_stopped.set()

    def ping(self) -> None:
        try:
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
            probe = self.jobs_dir / f".ping.{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as error:
            raise BackendUnavailable(f"jobs dir {self.jobs_dir} is not writable: {error}") from error

    # ---- internals --------------------------------------------------------------------------------

    def _dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise BackendNotFound(f"invalid job id {job_id!r}")
        return self.jobs_dir / job_id

    def _job_names(self) -> list[str]:
        """Every job folder's name (a listing, no folder read); folders without job.json drop out on load."""
        if not self.jobs_dir.is_dir():
            return []
        return [e.name for e in os.scandir(self.jobs_dir) if not e.name.startswith(".") and e.is_dir()]

    def _journal(self, job_id: str) -> None:
        """Note (under the scheduler's lock) that this job's folder changed, for every backend sharing jobs_dir."""
        path = self.jobs_dir / _JOURNAL
        with open(path, "ab") as journal:
            journal.write(f"{job_id}\n".encode())
            if journal.tell() > _JOURNAL_MAX_BYTES:
                fresh = path.with_name(f"{_JOURNAL}.{os.getpid()}.tmp")
                fresh.write_bytes(b"")
                os.replace(fresh, path)  # a new inode: readers read the folder whole once, then follow this one

    def _journal_news(self) -> set[str] | None:
        """The job ids appended to the journal since the last read; None when it must be read whole (the first
        time, or the journal was replaced)."""
        path = self.jobs_dir / _JOURNAL
        try:
            info = path.stat()
        except FileNotFoundError:
            path.touch()
            info = path.stat()
        at = self._journal_at
        if at is None or at[0] != info.st_ino or info.st_size < at[1]:
            self._journal_at = (info.st_ino, info.st_size)
            return None
        if info.st_size == at[1]:
            return set()
        with open(path, "rb") as journal:
            journal.seek(at[1])
            data = journal.read(info.st_size - at[1])
        self._journal_at = (info.st_ino, at[1] + len(data))
        return set(data.decode().split())

    def _refresh(self, *, listing: bool = False) -> None:
        """Bring the index up to date (under the lock): the jobs the journal names, the running ones, and with
        `listing` (or when the journal must be read whole) every folder the listing shows or no longer shows."""
        names = self._journal_news()
        if names is None or listing:
            listed = set(self._job_names())
            for gone in set(self._known) - listed:
                self._forget(gone)
            names = listed if names is None else names | (listed - self._known.keys())
        for name in names | self._holders.keys():
            self._load(name)

    def _forget(self, job_id: str) -> None:
        self._known.pop(job_id, None)
        self._waiting.pop(job_id, None)
        self._holders.pop(job_id, None)

    def _load(self, job_id: str) -> None:
        """Read one job folder into the index; a status that changed is noted for the watch."""
        job_dir = self.jobs_dir / job_id
        spec = self._spec(job_dir)
        if spec is None:
            self._forget(job_id)
            return
        try:
            status = self._status(job_dir)
        except FileNotFoundError:  # removed while read
            self._forget(job_id)
            return
        self._waiting.pop(job_id, None)
        self._holders.pop(job_id, None)
        if status.state is JobState.PENDING:
            self._waiting[job_id] = (-int(spec.get("priority", 0)), float(spec["submitted_at"]))
        elif not status.state.terminal:
            run = read_json_object(job_dir / f"run-{int(spec.get('attempt', 0))}.json") or {}
            self._holders[job_id] = run.get("gpu")
        old = self._known.get(job_id)
        self._known[job_id] = status
        if old is None and status.state is JobState.PENDING:
            return  # a job just submitted, waiting: what its submit answered, no change for the watch to report
        if old is None or self._fingerprint(old) != self._fingerprint(status):
            self._version += 1
            self._changed.pop(job_id, None)
            self._changed[job_id] = self._version

    def _changed_since(self, version: int) -> list[BackendStatus]:
        """The statuses that changed after `version`, newest last (walks back from the newest change only)."""
        names: list[str] = []
        for name, at in reversed(self._changed.items()):
            if at <= version:
                break
            names.append(name)
        return [self._known[name].model_copy() for name in reversed(names) if name in self._known]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One scheduler at a time, across threads and controller processes sharing jobs_dir."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.jobs_dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @staticmethod
    def _fingerprint(status: BackendStatus) -> tuple[Any, ...]:
        return (status.state, status.attempt, status.step)

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]

    def _schedule(self) -> None:
        with self._locked():
            self._schedule_locked()

    def _schedule_locked(self, *, listing: bool = False) -> None:
        """Start waiting jobs, highest priority then oldest first, while slots are free (index: `_refresh`)."""
        self._reap()
        self._refresh(listing=listing)
        running = list(self._holders.values())
        held_back: list[str] = []  # an earlier attempt of theirs still runs
        while len(running) < self.slots and len(held_back) < len(self._waiting):
            job_id = min((w for w in self._waiting if w not in held_back), key=self._waiting.__getitem__)
            job_dir = self.jobs_dir / job_id
            spec = self._spec(job_dir)
            if spec is None:
                self._forget(job_id)
                continue
            if self._earlier_attempts_alive(job_dir, int(spec.get("attempt", 0))):
                held_back.append(job_id)  # killed just now; a later pass launches it once they are gone
                continue
            whole = read_json_object(job_dir / "job.json")  # with its config, which the index does not keep
            if whole is None:
                self._forget(job_id)
                continue
            free = [g for g in range(self.gpus) if g not in running]
            gpu = free[0] if free else None
            self._launch(job_dir, whole, gpu)
            running.append(gpu)
            self._load(job_id)

    def _launch(self, job_dir: Path, spec: dict[str, Any], gpu: int | None) -> None:
        """Claim the attempt, then start its supervisor (which runs the pipeline) in a process group of its own."""
        attempt = int(spec.get("attempt", 0))
        write_json_atomic(job_dir / "config.json", spec["config"])
        pools = spec.get(_POOLS_KEY)
        if pools is None:  # a job folder from before the pools went into job.json has its pools.yaml already
            pools = (job_dir / POOLS_FILE).read_text() if (job_dir / POOLS_FILE).exists() else self._pools_now()
        (job_dir / POOLS_FILE).write_text(pools)
        launch = {"started_at": time.time(), "gpu": gpu, "parallel_trials": self.parallel_trials}
        write_json_atomic(job_dir / f"run-{attempt}.json", launch)
        self._journal(job_dir.name)
        trials = int(spec.get("hyperopt_trials", 0))
        with open(job_dir / "log.txt", "ab") as log:
            log.write(
                f"--- foxhunt: attempt {attempt} starting: the job pipeline ({trials} hyper-parameter trials) "
                f"with trainer {' '.join(self.command)}\n".encode()
            )
            log.flush()
            child = spawn(
                [sys.executable, "-m", _SUPERVISOR, str(job_dir), str(attempt), "--", *self.command],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[child.pid] = child
        (job_dir / f"pid-{attempt}").write_text(str(child.pid))
        (job_dir / f"pgid-{attempt}").write_text(str(child.pid))  # start_new_session: it leads its own group

    def _live_pid(self, job_dir: Path, attempt: int) -> int | None:
        """The supervisor's pid if it is alive (checked by its command line, so a reused pid is not ours)."""
        signature = f"\0{job_dir}\0{attempt}\0--\0".encode()
        try:
            pid: int | None = int((job_dir / f"pid-{attempt}").read_text())
        except (FileNotFoundError, ValueError):
            pid = None
        child = self._children.get(pid) if pid is not None else None
        if child is not None and child.poll() is None:
            return pid  # launched by this process and not exited (its /proc cmdline may still be mid-exec)
        candidates = [pid] if pid is not None else [int(p) for p in os.listdir("/proc") if p.isdigit()]
        for candidate in candidates:
            try:
                cmdline = Path(f"/proc/{candidate}/cmdline").read_bytes()
                fields = Path(f"/proc/{candidate}/stat").read_text().rsplit(")", 1)[1].split()
                state, flags = fields[0], int(fields[6])
            except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
                continue
            if not cmdline and candidate == pid and state != "Z" and not flags & _PF_KTHREAD:
                # launched this instant by another process (its exec not done): seen from here as gone, it
                # was taken for lost, and that terminal status was kept. A stranger that reused the pid is
                # taken for alive only until its command line shows.
                return candidate
            if signature in b"\0" + cmdline and state != "Z":
                return candidate
        return None

    @staticmethod
    def _pgid(job_dir: Path, attempt: int) -> int | None:
        """The attempt's process group as recorded at launch (`pgid-<n>`; older job dirs: the supervisor's pid)."""
        for name in (f"pgid-{attempt}", f"pid-{attempt}"):
            try:
                return int((job_dir / name).read_text())
            except (FileNotFoundError, ValueError):
                continue
        return None

    def _group_members(self, job_dir: Path, attempt: int) -> list[int]:
        """Live (not zombie) processes of the attempt's group that are the job's own, the supervisor aside.

        A group id can be reused once every member has gone, so a member must carry the job's identity
        in its environment (FOXHUNT_JOB_ID and FOXHUNT_ATTEMPT, which every step gets and its children
        inherit): a stranger's group of the same number is never signalled."""
        pgid = self._pgid(job_dir, attempt)
        if pgid is None or pgid == os.getpgid(0):
            return []
        try:
            os.killpg(pgid, 0)  # cheap: no such group, nothing to scan
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        identity = {f"FOXHUNT_JOB_ID={job_dir.name}".encode(), f"FOXHUNT_ATTEMPT={attempt}".encode()}
        members: list[int] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) != pgid or fields[0] == "Z":
                    continue
                environ = set(Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"))
            except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
                continue
            if identity <= environ:
                members.append(int(entry))
        return members

    def _signal_group(self, job_dir: Path, attempt: int, sig: signal.Signals) -> bool:
        """Signal the attempt's whole process group if its supervisor or one of the job's processes in it
        lives (never the controller's own group); whether it did."""
        pgid = self._pgid(job_dir, attempt)
        if pgid is None or pgid == os.getpgid(0):
            return False
        if self._live_pid(job_dir, attempt) != pgid and not self._group_members(job_dir, attempt):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        return True

    def _kill_if_alive(self, job_dir: Path, attempt: int) -> None:
        with self._locked():
            self._signal_group(job_dir, attempt, signal.SIGKILL)

    def _earlier_attempts_alive(self, job_dir: Path, attempt: int) -> bool:
        """Whether a process of an earlier attempt still runs; if so it is killed (a new attempt must never
        run beside it: same run folder, same checkpoints)."""
        alive = False
        for earlier in range(attempt):
            if self._signal_group(job_dir, earlier, signal.SIGKILL):
                alive = True
        return alive

    def _stop_orphans(self, job_dir: Path, attempt: int) -> bool:
        """The supervisor is gone without an exit code: stop what it left running in its group, SIGTERM first
        (the trainer checkpoints), SIGKILL once the grace period has passed. Whether any is still alive."""
        if not self._group_members(job_dir, attempt):
            return False
        marker = job_dir / f"lost-{attempt}"
        try:
            since = float(marker.read_text())
        except (FileNotFoundError, ValueError):
            marker.write_text(str(time.time()))
            self._signal_group(job_dir, attempt, signal.SIGTERM)
            return True
        if time.time() - since > max(self.grace_seconds, 0):
            self._signal_group(job_dir, attempt, signal.SIGKILL)
        return True

    def _spec(self, job_dir: Path) -> dict[str, Any] | None:
        """job.json without its config and pools (`_index_spec`), parsed once per version (it is replaced by rename
        on a resubmit, so inode and mtime name the version): every scan reads it for every job that has not ended."""
        path = job_dir / "job.json"
        try:
            info = path.stat()
        except FileNotFoundError:
            return None
        version = (info.st_ino, info.st_mtime_ns)
        cached = self._specs.get(job_dir.name)
        if cached is not None and cached[0] == version:
            return cached[1]
        spec = read_json_object(path)
        if spec is None:
            return None
        spec = _index_spec(spec)
        self._specs[job_dir.name] = (version, spec)
        return spec

    def _remember_spec(self, job_dir: Path, spec: dict[str, Any]) -> None:
        """`spec` is what job.json holds now (written by this process under the scheduler's lock): `_spec` takes it
        from here for as long as the file is that version."""
        info = (job_dir / "job.json").stat()
        self._specs[job_dir.name] = ((info.st_ino, info.st_mtime_ns), _index_spec(spec))

    def _cached(self, job_dir: Path) -> BackendStatus | None:
        """The terminal status of the current attempt, if known: it cannot change until a resubmit."""
        final = self._final.get(job_dir.name)
        try:
            mtime = (job_dir / "job.json").stat().st_mtime_ns
        except FileNotFoundError:
            return None
        return final[1].model_copy() if final is not None and final[0] == mtime else None

    def _status(self, job_dir: Path) -> BackendStatus:
        cached = self._cached(job_dir)
        if cached is not None:
            return cached
        mtime = (job_dir / "job.json").stat().st_mtime_ns
        status = self._read_status(job_dir)
        if status.state.terminal:
            self._final[job_dir.name] = (mtime, status)
        return status

    def _read_status(self, job_dir: Path) -> BackendStatus:
        spec = self._spec(job_dir) or {}
        attempt = int(spec.get("attempt", 0))
        run = read_json_object(job_dir / f"run-{attempt}.json")
        if run is None:  # not launched: no exit file, no progress of this attempt (most jobs of a long queue)
            status = BackendStatus(job_id=job_dir.name, state=JobState.PENDING, attempt=attempt)
            if (job_dir / f"cancel-{attempt}").exists():
                status.state, status.reason, status.phase = JobState.CANCELLED, "CancelledBeforeStart", "cancelled"
            else:
                status.phase = "waiting for a slot"
            return status
        alive = self._live_pid(job_dir, attempt) is not None
        # read after the liveness check: a supervisor writes its exit file before it exits
        finished = read_json_object(job_dir / f"exit-{attempt}.json")
        cancelled = (job_dir / f"cancel-{attempt}").exists()
        search = read_json_object(search_progress(job_dir)) or {}  # a search's last pack report, with its runs
        progress = read_json_object(train_progress(job_dir)) or search
        status = BackendStatus(
            job_id=job_dir.name,
            state=JobState.PENDING,
            attempt=attempt,
            breakdown_ms=progress.get("breakdown_ms"),
            epoch_seconds=progress.get("epoch_seconds"),
            step=progress.get("step"),
            runs=pack_runs(progress.get("runs")) or pack_runs(search.get("runs")),  # train's solo run has none
        )
        status.started_at = datetime.fromtimestamp(run["started_at"], UTC)
        if finished is not None:
            code = int(finished["code"])
            failed = finished.get("step")
            status.finished_at = datetime.fromtimestamp(finished["finished_at"], UTC)
            status.phase = f"{failed}: exit {code}" if failed and code else f"exit {code}"
            status.state, status.reason, status.message = self._exit_state(job_dir, finished, cancelled)
        elif alive:
            current = (read_json_object(state_file(job_dir, attempt)) or {}).get("current")
            status.state, status.phase = JobState.RUNNING, f"running: {current}" if current else "running"
        elif self._stop_orphans(job_dir, attempt):
            status.state, status.phase = JobState.RUNNING, _LOST_PHASE
        elif cancelled:
            status.state, status.reason, status.phase = JobState.CANCELLED, "Killed", "killed"
        else:
            status.state, status.reason, status.phase = JobState.ERROR, "ProcessLost", "lost"
            status.message = "the job's process ended without recording an exit code"
            if (job_dir / f"lost-{attempt}").exists():
                status.message += "; the processes it left running were stopped"
        return status

    def _exit_state(
        self, job_dir: Path, finished: dict[str, Any], cancelled: bool
    ) -> tuple[JobState, str | None, str | None]:
        """0 SUCCEEDED; a signal exit after a cancel CANCELLED; anything else FAILED with the failed step's cause."""
        code = int(finished["code"])
        if code == 0:
            return JobState.SUCCEEDED, "Completed", None
        if cancelled and code in _CANCEL_CODES:
            return JobState.CANCELLED, "Cancelled", f"stopped on request (exit {code})"
        last = finished.get("last_line") or self._last_log_line(job_dir)
        step = f"step {finished['step']}: " if finished.get("step") else ""
        if code == 2:
            return JobState.FAILED, "BadInput", last or f"{step}exit code 2"
        if code in _CANCEL_CODES:
            return JobState.FAILED, "Terminated", f"{step}killed by a signal nobody here sent (exit {code})"
        return JobState.FAILED, "ExitCode", f"{step}exit code {code}" + (f": {last}" if last else "")

    @staticmethod
    def _last_log_line(job_dir: Path) -> str | None:
        try:
            with open(job_dir / "log.txt", "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 4096))
                lines = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
        except FileNotFoundError:
            return None
        return lines[-1][:_LAST_LINE_CHARS] if lines else None

    def _ended(self, job_dir: Path) -> bool:
        with self._locked():
            return self._status(job_dir).state.terminal

    def _read_log(self, job_dir: Path, follow: bool) -> Iterator[str]:
        path = job_dir / "log.txt"
        while follow and not path.exists():
            if self._ended(job_dir):
                return
            time.sleep(self.poll_seconds)
            yield ""
        if not path.exists():
            return
        with open(path, encoding="utf-8", errors="replace") as log:
            pending = ""
            while True:
                chunk = log.readline()
                if chunk:
                    pending += chunk
                    if pending.endswith("\n"):
                        yield pending
                        pending = ""
                    continue
                if not follow:
                    break
                if self._ended(job_dir):
                    rest = log.read()
                    pending += rest
                    if not rest:
                        break
                    continue
                time.sleep(self.poll_seconds)
                yield ""
            if pending:
                yield pending
