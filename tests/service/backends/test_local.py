"""The local backend with a real tiny program as the trainer of the job pipeline: states, exit codes,
cancel, limits, restarts. The pipeline's own order, trials and exit handler: test_local_pipeline.py."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.backends import local, spawn
from service.backends.base import BackendNotFound
from service.backends.local import LocalBackend, detect_gpus
from service.domain import BackendStatus, JobSpec, JobState
from service.pools import Pools
from tests.polling import wait_until
from tests.service.factories import POOLS_YAML, faulting_popen, stand_in_command


def spec(job_id: str = "job-1", *, attempt: int = 0, priority: int = 0, trials: int = 0) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        tenant="team-a",
        pool="cpu",
        plan="eager",
        model="dqn",
        commit_sha="HEAD",
        epochs=1,
        config={"run": {"steps": 3}},
        priority=priority,
        attempt=attempt,
        hyperopt_trials=trials,
    )


def make_backend(jobs_dir: Path, *extra: str, gpus: int = 0, grace: float = 5.0) -> LocalBackend:
    return LocalBackend(jobs_dir, command=stand_in_command(*extra), gpus=gpus, grace_seconds=grace, poll_seconds=0.05)


def wait_state(backend: LocalBackend, job_id: str, states: set[JobState], timeout: float = 30.0) -> BackendStatus:
    def status_if_reached() -> BackendStatus | None:
        status = backend.status(job_id)
        return status if status.state in states else None

    return wait_until(status_if_reached, timeout, 0.05, what=f"{job_id} to reach one of {sorted(states)}")


def wait_log(backend: LocalBackend, job_id: str, text: str, timeout: float = 30.0) -> None:
    """Polls the job's status as well, as the controller's watch does: a submit that finds every slot held (by an
    attempt that ended since the index last looked) leaves the launch to the next poll."""

    def logged() -> bool:
        backend.status(job_id)
        return text in "".join(backend.logs(job_id))

    wait_until(logged, timeout, 0.05, what=f"{text!r} in the log of {job_id}")


TERMINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.ERROR}


@pytest.fixture
def backends() -> Iterator[list[LocalBackend]]:
    """Backends made by a test; their still-running jobs are killed at the end."""
    made: list[LocalBackend] = []
    yield made
    for backend in made:
        for status in backend.list_statuses():
            if not status.state.terminal:
                backend.cancel(status.job_id, force=True)


def test_each_job_gets_the_controllers_pools_for_its_compile_step(tmp_path: Path) -> None:
    """FOXHUNT_POOLS_FILE as it is, or without one the one local pool the controller then offers."""
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text(POOLS_YAML)
    configured = LocalBackend(tmp_path / "a", command=["true"], gpus=0, pools_file=pools_file)
    configured.submit(spec())
    assert (tmp_path / "a" / "job-1" / "pools.yaml").read_text() == POOLS_YAML
    local = LocalBackend(tmp_path / "b", command=["true"], gpus=0)
    local.submit(spec())
    written = json.loads((tmp_path / "b" / "job-1" / "pools.yaml").read_text())
    assert [pool["name"] for pool in written["pools"]] == [pool.name for pool in Pools.local(0)] == ["local"]


def test_a_job_runs_to_success_with_progress_and_logs(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    first = backend.submit(spec())
    assert first.state in {JobState.PENDING, JobState.RUNNING} and first.attempt == 0
    status = wait_state(backend, "job-1", TERMINAL)
    assert (status.state, status.reason, status.phase) == (JobState.SUCCEEDED, "Completed", "exit 0")
    assert status.breakdown_ms == {"sample": 0.25, "fused": 1.0, "guard": 0.25}
    assert status.step == 3 and status.epoch_seconds == 3.0 and status.started_at and status.finished_at
    log = "".join(backend.logs("job-1"))
    assert "Training step breakdown: sample=0.250ms" in log
    started = [line.split(" starting: ")[0] for line in log.splitlines() if " starting: " in line]
    steps = ("resolve", "compile", "train", "report", "on-exit")
    assert started[1:] == [f"--- foxhunt: step {name}" for name in steps]
    assert json.loads((tmp_path / "job-1" / "config.json").read_text())["run"]["steps"] == 3
    assert json.loads((tmp_path / "job-1" / "run" / "status.json").read_text())["status"] == "Succeeded"


def test_a_supervisor_start_that_faults_under_load_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One `make test` run saw Popen raise EFAULT under load, and the controller failed the job (SubmitRejected).
    calls, faulting = faulting_popen([errno.EFAULT])
    monkeypatch.setattr(spawn, "BACKOFF_S", 0.0)
    backend = make_backend(tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", faulting)
        backend.submit(spec())
    assert len(calls) == 2  # the fault, then the supervisor's start
    status = wait_state(backend, "job-1", TERMINAL)
    assert (status.state, status.reason) == (JobState.SUCCEEDED, "Completed")


def test_submit_is_idempotent_per_attempt(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    backend.submit(spec())
    wait_state(backend, "job-1", TERMINAL)
    backend.submit(spec())
    assert "".join(backend.logs("job-1")).count("attempt 0 starting") == 1
    assert [s.job_id for s in backend.list_statuses()] == ["job-1"]


@pytest.mark.parametrize(("code", "reason"), [(2, "BadInput"), (3, "ExitCode"), (143, "Terminated")])
def test_exit_codes_map_to_failed_with_a_reason(tmp_path: Path, code: int, reason: str) -> None:
    backend = make_backend(tmp_path, "--exit", str(code))
    backend.submit(spec())
    status = wait_state(backend, "job-1", TERMINAL)
    assert (status.state, status.reason, status.phase) == (JobState.FAILED, reason, f"train: exit {code}")
    if code == 3:
        assert status.message == "step train: exit code 3: stand-in: done, exit 3"
    if code == 2:
        assert status.message == "error: bad input for the stand-in"


def test_only_one_cpu_job_runs_at_a_time_and_priority_orders_the_queue(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    backend = make_backend(tmp_path, "--sleep", "30")
    backends.append(backend)
    backend.submit(spec("job-a"))
    wait_state(backend, "job-a", {JobState.RUNNING})
    backend.submit(spec("job-b"))
    backend.submit(spec("job-c", priority=5))
    states = {s.job_id: s.state for s in backend.list_statuses()}
    assert states == {"job-a": JobState.RUNNING, "job-b": JobState.PENDING, "job-c": JobState.PENDING}
    assert backend.status("job-b").phase == "waiting for a slot"
    backend.cancel("job-a", force=True)
    wait_state(backend, "job-a", TERMINAL)
    assert wait_state(backend, "job-c", {JobState.RUNNING}).state is JobState.RUNNING  # higher priority first
    assert backend.status("job-b").state is JobState.PENDING
    backend.cancel("job-c", force=True)
    assert wait_state(backend, "job-b", {JobState.RUNNING}).state is JobState.RUNNING


def test_a_pass_of_n_submits_lists_the_job_folders_once_and_reads_each_a_fixed_number_of_times(
    tmp_path: Path, backends: list[LocalBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconcile pass (N submits, then one list) is O(N): a submit reads its own folder, the journal's new
    lines and the running job, never every job folder; only the first read and the list list the folder."""
    backend = make_backend(tmp_path, "--sleep", "30")
    backends.append(backend)
    listings: list[int] = []
    reads: Counter[str] = Counter()
    names, status = backend._job_names, backend._status
    monkeypatch.setattr(backend, "_job_names", lambda: listings.append(1) or names())
    monkeypatch.setattr(backend, "_status", lambda job_dir: reads.update([job_dir.name]) or status(job_dir))
    for n in (5, 40):
        listings.clear()
        reads.clear()
        for i in range(n):
            backend.submit(spec(f"job-{n}-{i}"))
        statuses = backend.list_statuses()
        assert len(listings) <= 2, f"{len(listings)} listings of the job folders for a pass of {n} submits"
        waiting = [count for job_id, count in reads.items() if job_id not in ("job-5-0", f"job-{n}-0")]
        assert max(waiting) <= 3, f"a waiting job's folder read {max(waiting)} times in a pass of {n} submits"
    assert [s.job_id for s in statuses if s.state is JobState.RUNNING] == ["job-5-0"]
    assert len(statuses) == 45 and not (tmp_path / "job-40-3" / "config.json").exists()  # written at launch


def test_a_submit_parses_back_no_job_json_and_the_index_keeps_no_config(
    tmp_path: Path, backends: list[LocalBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit reads job.json once, to see whether the job is there, and never parses back what it wrote; the
    index keeps each job's spec without its config and pools, which a launch reads from the file (the configs of
    thousands of jobs held in the index made the garbage collector's full collections take up to 100 ms)."""
    backend = make_backend(tmp_path, "--sleep", "30")
    backends.append(backend)
    backend.submit(spec("job-a"))  # takes the one slot
    reads: Counter[str] = Counter()
    read = local.read_json_object
    monkeypatch.setattr(local, "read_json_object", lambda path: reads.update([path.name]) or read(path))
    for i in range(3):
        assert backend.submit(spec(f"job-{i}")).phase == "waiting for a slot"
    assert reads["job.json"] == 3
    assert all(not {"config", "pools_file"} & set(indexed) for _, indexed in backend._specs.values())
    backend.cancel("job-a", force=True)
    wait_state(backend, "job-0", {JobState.RUNNING})
    assert json.loads((tmp_path / "job-0" / "config.json").read_text()) == {"run": {"steps": 3}}
    assert (tmp_path / "job-0" / "pools.yaml").is_file()


def test_watch_polls_yields_each_polls_changes_as_one_list(tmp_path: Path, backends: list[LocalBackend]) -> None:
    """The reconciler records a poll's changes in one transaction (LocalBackend.watch_polls); watch yields the same
    statuses one by one. A job cancelled before it started and one that ran are both reported."""
    backend = make_backend(tmp_path, "--sleep", "30")
    backends.append(backend)
    backend.submit(spec("job-a"))
    backend.submit(spec("job-b"))
    wait_state(backend, "job-a", {JobState.RUNNING})

    def cancel_both() -> None:
        backend.cancel("job-b")  # waiting: cancelled before it starts
        backend.cancel("job-a", force=True)

    threading.Timer(0.3, cancel_both).start()  # once the watch below has started
    seen: dict[str, JobState] = {}
    for poll in backend.watch_polls(timeout_seconds=10):
        assert poll and all(isinstance(status, BackendStatus) for status in poll)
        seen.update({status.job_id: status.state for status in poll})
        if seen.get("job-a") in TERMINAL and "job-b" in seen:
            break
    assert seen["job-b"] is JobState.CANCELLED and seen["job-a"] is JobState.CANCELLED


def test_a_watch_poll_reads_the_running_job_and_the_changed_ones_not_every_job_folder(
    tmp_path: Path, backends: list[LocalBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With jobs waiting for the slot, a poll of the watch reads the running job and the jobs the journal names
    (here one cancelled by another backend over the same folder, as another controller process would), not
    every job folder five times a second (10,000 queued jobs then drained at half the backend's pace)."""
    backend = make_backend(tmp_path, "--sleep", "30")
    backends.append(backend)
    for i in range(30):
        backend.submit(spec(f"job-{i:02d}"))
    wait_state(backend, "job-00", {JobState.RUNNING})
    reads: Counter[str] = Counter()
    status = backend._status
    monkeypatch.setattr(backend, "_status", lambda job_dir: reads.update([job_dir.name]) or status(job_dir))
    seen: list[BackendStatus] = []

    def follow() -> None:
        for changed in backend.watch(timeout_seconds=30):
            seen.append(changed)
            if changed.job_id == "job-17":
                return

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    wait_until(lambda: reads["job-00"] >= 6, 20, 0.05, what="five polls of the watch")
    make_backend(tmp_path).cancel("job-17")  # another process's backend: its change reaches this one's index
    watcher.join(20)
    waiting = [(s.job_id, s.state, s.reason) for s in seen if s.job_id != "job-00"]  # job-00 reports its steps
    assert waiting == [("job-17", JobState.CANCELLED, "CancelledBeforeStart")]
    others = {job_id: n for job_id, n in reads.items() if job_id not in ("job-00", "job-17")}
    assert not others, f"waiting job folders read by the watch's polls: {others}"


def test_changed_statuses_names_the_changed_running_and_asked_for_jobs_only(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    """The reconciler's incremental pass asks for the jobs that changed since its last token (here one cancelled
    by another backend over the same folder), the running one and those it names (`also`), not every job."""
    backend = make_backend(tmp_path, "--sleep", "30")
    backends.append(backend)
    for i in range(10):
        backend.submit(spec(f"job-{i}"))
    wait_state(backend, "job-0", {JobState.RUNNING})
    statuses, token = backend.changed_statuses(None)
    assert statuses is None  # no token: the caller lists every job
    statuses, token = backend.changed_statuses(token)
    assert [s.job_id for s in statuses or []] == ["job-0"]  # nothing changed: the running job only
    make_backend(tmp_path).cancel("job-7")
    statuses, token = backend.changed_statuses(token, also=["job-3", "nope"])
    assert [(s.job_id, s.state) for s in statuses or []] == [
        ("job-0", JobState.RUNNING),
        ("job-3", JobState.PENDING),
        ("job-7", JobState.CANCELLED),
    ]
    statuses, _ = backend.changed_statuses(token)
    assert [s.job_id for s in statuses or []] == ["job-0"]


def test_gpu_jobs_get_one_gpu_each(tmp_path: Path, backends: list[LocalBackend]) -> None:
    backend = make_backend(tmp_path, "--sleep", "30", gpus=2)
    backends.append(backend)
    for job_id in ("job-a", "job-b", "job-c"):
        backend.submit(spec(job_id))
    wait_state(backend, "job-b", {JobState.RUNNING})
    assert backend.status("job-c").state is JobState.PENDING
    wait_log(backend, "job-a", "stand-in: train env job=job-a pool=cpu commit=HEAD attempt=0")
    wait_log(backend, "job-b", "stand-in: train env job=job-b pool=cpu commit=HEAD attempt=0")
    assert "cuda=0\n" in "".join(backend.logs("job-a")) and "cuda=1\n" in "".join(backend.logs("job-b"))


def test_cancel_is_graceful_first(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, "--sleep", "30")
    backend.submit(spec())
    wait_log(backend, "job-1", "stand-in: steps=3")
    backend.cancel("job-1")
    status = wait_state(backend, "job-1", TERMINAL)
    assert (status.state, status.reason) == (JobState.CANCELLED, "Cancelled")
    assert status.message == "stopped on request (exit 143)"
    log = "".join(backend.logs("job-1"))
    assert "--- foxhunt: step train finished: exit 143" in log and "step report starting" not in log
    assert "--- foxhunt: step on-exit finished: exit 0" in log  # the exit handler ran after the stop
    record = json.loads((tmp_path / "job-1" / "run" / "status.json").read_text())
    assert record["status"] == "Failed" and record["failures"][0]["displayName"] == "train"


def test_a_job_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, "--sleep", "60", "--ignore-term", grace=0.5)
    backend.submit(spec())
    wait_log(backend, "job-1", "stand-in: steps=3")
    started = time.monotonic()
    backend.cancel("job-1")
    status = wait_state(backend, "job-1", TERMINAL)
    assert status.state is JobState.CANCELLED and status.reason == "Killed"
    assert 0.4 < time.monotonic() - started < 10


def test_cancel_before_start_and_unknown_jobs(tmp_path: Path, backends: list[LocalBackend]) -> None:
    backend = make_backend(tmp_path, "--sleep", "30")
    backends.append(backend)
    backend.submit(spec("job-a"))
    backend.submit(spec("job-b"))
    backend.cancel("job-b")
    assert backend.status("job-b").reason == "CancelledBeforeStart"
    backend.cancel("job-a", force=True)
    wait_state(backend, "job-a", TERMINAL)
    backend.list_statuses()  # a scheduling pass with the slot free: the only way job-b could start
    assert backend.status("job-b").state is JobState.CANCELLED  # never started
    assert not (tmp_path / "job-b" / "run-0.json").exists()
    for call in (lambda: backend.status("nope"), lambda: backend.cancel("nope"), lambda: backend.logs("nope")):
        with pytest.raises(BackendNotFound):
            call()
    with pytest.raises(BackendNotFound, match="invalid job id"):
        backend.status("../etc")


def test_a_restarted_backend_finds_running_and_finished_jobs_and_starts_nothing_twice(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    first = make_backend(tmp_path, "--sleep", "1.5")
    first.submit(spec("job-a"))
    wait_state(first, "job-a", {JobState.RUNNING})
    second = make_backend(tmp_path, "--sleep", "1.5")  # a new controller process over the same dir
    backends.append(second)
    assert second.status("job-a").state is JobState.RUNNING
    second.submit(spec("job-a"))
    assert wait_state(second, "job-a", TERMINAL).state is JobState.SUCCEEDED
    third = make_backend(tmp_path)
    assert third.status("job-a").state is JobState.SUCCEEDED
    assert "".join(third.logs("job-a")).count("attempt 0 starting") == 1


def test_a_process_that_vanished_without_exit_code_is_an_error(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, "--sleep", "30")
    backend.submit(spec())
    wait_state(backend, "job-1", {JobState.RUNNING})
    pid = int((tmp_path / "job-1" / "pid-0").read_text())
    assert os.getpgid(pid) == pid != os.getpgid(0)  # the job's own process group, never ours
    os.killpg(pid, signal.SIGKILL)  # the whole group dies, as in an OOM kill or a reboot
    status = wait_state(backend, "job-1", TERMINAL)
    assert (status.state, status.reason) == (JobState.ERROR, "ProcessLost")


def job_processes(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, read from /proc independently of the backend."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def assert_group_ends(pgid: int) -> None:
    """The group's processes are gone within seconds: one the backend signalled may still be exiting when the
    job's status changes (its /proc environ, which the backend checks, goes before it is a zombie)."""
    wait_until(lambda: job_processes(pgid) == [], 5, 0.02, what=f"process group {pgid} to end")


def kill_supervisor(backend: LocalBackend, job_dir: Path, attempt: int = 0) -> int:
    """kill -9 the attempt's supervisor alone, once its train step runs; the group id it led."""
    wait_log(backend, job_dir.name, f"stand-in: train env job={job_dir.name} pool=cpu commit=HEAD attempt={attempt}")
    pid = int((job_dir / f"pid-{attempt}").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid not in job_processes(pid), 10, 0.02, what="the supervisor to die")
    assert job_processes(pid), "the train step outlives its supervisor (the orphan this is about)"
    return pid


def lose_supervisor(
    tmp_path: Path, backends: list[LocalBackend], *extra: str, grace: float = 5.0
) -> tuple[LocalBackend, int]:
    """A backend running job-1 with the stand-in's `extra` knobs, whose supervisor was killed; the group id it led."""
    backend = make_backend(tmp_path, *extra, grace=grace)
    backends.append(backend)
    backend.submit(spec())
    return backend, kill_supervisor(backend, tmp_path / "job-1")


def test_a_lost_supervisors_trainer_is_stopped_before_the_job_is_an_error(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    backend, pgid = lose_supervisor(tmp_path, backends, "--sleep", "60")
    status = wait_state(backend, "job-1", TERMINAL)
    assert (status.state, status.reason) == (JobState.ERROR, "ProcessLost")
    assert status.message is not None and "stopped" in status.message
    assert_group_ends(pgid)  # the orphan was stopped, not left training


def test_a_job_dir_from_before_pgid_files_finds_its_group_by_the_supervisors_pid(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    backend, pgid = lose_supervisor(tmp_path, backends, "--sleep", "60")
    (tmp_path / "job-1" / "pgid-0").unlink()  # as a controller without them left it: the leader's pid is the group
    assert wait_state(backend, "job-1", TERMINAL).reason == "ProcessLost"
    assert_group_ends(pgid)


def test_a_lost_supervisors_trainer_that_ignores_sigterm_is_killed(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    backend, pgid = lose_supervisor(tmp_path, backends, "--sleep", "60", "--ignore-term", grace=0.3)
    assert backend.status("job-1").phase == "stopping: the supervisor is gone"
    assert wait_state(backend, "job-1", TERMINAL).reason == "ProcessLost"
    assert_group_ends(pgid)


def test_a_retry_after_a_lost_supervisor_never_runs_beside_the_orphan(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    backend, pgid = lose_supervisor(tmp_path, backends, "--sleep", "60")
    wait_state(backend, "job-1", TERMINAL)  # what lets the controller accept a retry
    backend.submit(spec(attempt=1))
    wait_log(backend, "job-1", "stand-in: train env job=job-1 pool=cpu commit=HEAD attempt=1")
    assert_group_ends(pgid)  # attempt 0's trainer is gone: one trainer in the run folder


def test_an_earlier_attempts_survivor_is_killed_before_the_next_attempt_starts(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    """Even when the next attempt comes while the orphan still runs (a controller that marked it lost)."""
    backend, pgid = lose_supervisor(tmp_path, backends, "--sleep", "60", "--ignore-term", grace=60)
    job = json.loads((tmp_path / "job-1" / "job.json").read_text())
    (tmp_path / "job-1" / "job.json").write_text(json.dumps({**job, "attempt": 1}))  # as submit writes it
    run = tmp_path / "job-1" / "run-1.json"
    wait_until(lambda: backend.list_statuses() and run.exists(), 10, 0.05, what="attempt 1 to start")
    assert_group_ends(pgid)  # killed when attempt 1 was launched, not left running beside it


def test_cancel_stops_a_lost_supervisors_trainer(tmp_path: Path, backends: list[LocalBackend]) -> None:
    backend, pgid = lose_supervisor(tmp_path, backends, "--sleep", "60")
    backend.cancel("job-1")
    status = wait_state(backend, "job-1", TERMINAL)
    assert status.state is JobState.CANCELLED
    assert_group_ends(pgid)


def test_a_reused_group_id_of_a_strangers_group_is_never_signalled(
    tmp_path: Path, backends: list[LocalBackend]
) -> None:
    """A group id is free for reuse once its members are gone: only processes carrying the job's identity
    (FOXHUNT_JOB_ID, FOXHUNT_ATTEMPT) are taken for its orphans."""
    backend = make_backend(tmp_path, "--sleep", "60")
    backend.submit(spec())
    kill_supervisor(backend, tmp_path / "job-1")
    wait_state(backend, "job-1", TERMINAL)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / "job-1" / "pgid-0").write_text(str(stranger.pid))  # as if the job's group id were reused
        restarted = make_backend(tmp_path, "--sleep", "60")  # a new controller: nothing cached
        backends.append(restarted)
        assert restarted.status("job-1").reason == "ProcessLost"
        restarted.cancel("job-1", force=True)
        restarted.submit(spec(attempt=1))  # a new attempt's check of the earlier ones
        wait_log(restarted, "job-1", "stand-in: train env job=job-1 pool=cpu commit=HEAD attempt=1")
        assert stranger.poll() is None and job_processes(stranger.pid) == [stranger.pid]
    finally:
        stranger.kill()
        stranger.wait()


def test_retry_runs_the_next_attempt_with_resume(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, "--exit", "3")
    backend.submit(spec())
    wait_state(backend, "job-1", TERMINAL)
    retried = backend.submit(spec(attempt=1))
    assert retried.attempt == 1
    status = wait_state(backend, "job-1", TERMINAL)
    assert status.attempt == 1 and status.state is JobState.FAILED
    log = "".join(backend.logs("job-1"))
    assert "stand-in: steps=3 resume=True" in log  # attempt 0's checkpoint, found where it left it
    checkpoints = tmp_path / "job-1" / "checkpoints" / "train"
    for attempt in (0, 1):
        assert f"stand-in: train env job=job-1 pool=cpu commit=HEAD attempt={attempt} checkpoint={checkpoints} " in log


def test_following_an_idle_job_hands_control_back_between_lines(tmp_path: Path) -> None:
    """While nothing is written, follow yields empty strings: an HTTP route can stop once its client has gone."""
    backend = make_backend(tmp_path, "--sleep", "30")
    backend.submit(spec())
    lines = backend.logs("job-1", follow=True)
    idle = threading.Event()

    def read_until_idle() -> None:
        for line in lines:
            if line == "":
                idle.set()
                return

    threading.Thread(target=read_until_idle, daemon=True).start()
    assert idle.wait(timeout=20)
    lines.close()
    backend.cancel("job-1", force=True)


def test_logs_follow_until_the_end_and_watch_reports_changes(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, "--sleep", "0.5")
    backend.submit(spec())
    lines = [line for line in backend.logs("job-1", follow=True) if line]  # "" marks an idle poll
    assert "stand-in: done, exit 0\n" in lines
    assert lines[-1].startswith("--- foxhunt: step on-exit finished: exit 0")
    backend.submit(spec("job-2"))
    seen = [s.state for s in backend.watch(timeout_seconds=3) if s.job_id == "job-2"]
    assert seen[-1] is JobState.SUCCEEDED


def test_ping_and_gpu_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_backend(tmp_path).ping()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,3")
    assert detect_gpus() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert detect_gpus() == 0


def test_supervisor_records_exit_codes_and_rejects_bad_usage(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "service.backends.local_supervisor"]
    bad = subprocess.run([*run, str(tmp_path), "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage:" in bad.stderr
    (tmp_path / "job.json").write_text(spec().model_dump_json())
    for attempt in (4, 5):
        (tmp_path / f"run-{attempt}.json").write_text(json.dumps({"started_at": 0, "gpu": None}))
    subprocess.run([*run, str(tmp_path), "4", "--", sys.executable, "-c", "raise SystemExit(7)"], check=True)
    assert json.loads((tmp_path / "exit-4.json").read_text())["code"] == 7
    assert json.loads((tmp_path / "exit-4.json").read_text())["step"] == "resolve"
    subprocess.run([*run, str(tmp_path), "5", "--", str(tmp_path / "missing-binary")], check=True)
    assert json.loads((tmp_path / "exit-5.json").read_text())["code"] == 127


def test_supervisor_records_a_broken_executor_as_a_failure(tmp_path: Path) -> None:
    """No job.json (a wiped job dir): the executor cannot start, and the exit file says so."""
    run = [sys.executable, "-m", "service.backends.local_supervisor", str(tmp_path), "0", "--", "trainer"]
    subprocess.run(run, check=True, capture_output=True)
    record = json.loads((tmp_path / "exit-0.json").read_text())
    assert record["code"] == 1 and "the local pipeline executor failed" in record["last_line"]


def test_a_progress_files_runs_reach_the_status_only_when_valid() -> None:
    from service.backends.local import pack_runs

    entry = {"run": 0, "seed": 1, "trial": 2, "step": 5, "train_return": 1.0, "eval_return": None, "diverged": False}
    assert [r.trial for r in pack_runs([entry, {**entry, "run": 1, "trial": 3}]) or []] == [2, 3]
    for bad in (None, {"0": entry}, [{**entry, "step": "5"}], [entry, entry], [{**entry, "run": i} for i in range(65)]):
        assert pack_runs(bad) is None, bad
