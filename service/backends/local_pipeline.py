"""The local backend's executor of the job pipeline (contracts/pipeline.py): its graph walked as local processes.

The same graph, steps, commands, arguments and environment as on Argo; only the Kubernetes parts
differ. The placeholders are bound to the job directory:

=============  =====================================================================
placeholder    local value
=============  =====================================================================
{config}       JOB_DIR/config.json (the TrainConfig the API stored, read by resolve alone; no run.steps with epochs)
{model}        the JobSpec's model
{train_epochs} the JobSpec's train_epochs (0: none; the config's run.steps)
{pool}         the JobSpec's pool
{pools}        JOB_DIR/pools.yaml (the controller's pools file when the job was handed over)
{run}          JOB_DIR/run (config.json: resolve's resolved config; check/, hyperopt/, train/, status.json)
{job_id}       the JobSpec's id
{commit}       the JobSpec's commit_sha
{checkpoints}  JOB_DIR/checkpoints (fixed per job: a retry resumes from it)
{storage}      sqlite:///JOB_DIR/optuna.db
{study}        foxhunt-<job id>
{trials}       the JobSpec's hyperopt_trials
=============  =====================================================================

Order: the graph's nodes in turn, a node whose `when` does not hold skipped, a sub-graph walked in
place, a fan-out run once per item its source printed (`parallel_trials` at a time); on-exit always
runs last, after a failure or a stop too, with {status} Succeeded or Failed. A failed fan-out item
does not stop the graph when the fan-out tolerates failures (Argo's `continueOn: failed`); any other
failed step ends the pipeline with its exit code. A stop (the backend's SIGTERM, which reaches the
running step through the process group) starts no further step; the pipeline then ends with 143 once
on-exit has run.

Each step's output goes to the job's log (this process's stdout), framed by
`--- foxhunt: step NAME starting: COMMAND` and `--- foxhunt: step NAME finished: exit N (S s)`.
`pipeline-<attempt>.json` records the step running now (`current`) and those done, for the status.

Runs inside `local_supervisor.py`; imports no torch (contracts/pipeline.py is torch-free).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from contracts.jsonfile import write_json_atomic
from contracts.pipeline import PIPELINE, Graph, Node, Pipeline, Step
from service.backends.spawn import spawn

RUN = "run"
POOLS_FILE = "pools.yaml"
CHECKPOINTS = "checkpoints"
STOPPED_CODE = 143  # what a SIGTERM'd trainer exits with; the backend maps it to CANCELLED after a cancel
NOT_STARTED_CODE = 127
MARK = "--- foxhunt:"
_TAIL_BYTES = 4096
_LAST_LINE_CHARS = 300


def train_progress(job_dir: Path) -> Path:
    """The train step's progress.json (run/train is the pipeline's TRAIN_RUN_DIR)."""
    return job_dir / RUN / "train" / "progress.json"


def search_progress(job_dir: Path) -> Path:
    """The search's progress.json: the last report of a pack of trials, with its runs (`trainer hyperopt trial`
    writes it into its --run-dir, the pipeline's {run}/hyperopt)."""
    return job_dir / RUN / "hyperopt" / "progress.json"


def _fan_out_item(item: object) -> bool:
    """What a fan-out passes on as one argument: a whole number, or a string of one line (a pack: "0,1,2")."""
    if isinstance(item, str):
        return bool(item) and "\n" not in item and "\x00" not in item
    return isinstance(item, int) and not isinstance(item, bool)


def state_file(job_dir: Path, attempt: int) -> Path:
    return job_dir / f"pipeline-{attempt}.json"


def bindings(job_dir: Path, job: dict[str, Any]) -> dict[str, str]:
    """The pipeline's placeholders bound to the job directory (see the module's table)."""
    return {
        "config": str(job_dir / "config.json"),
        "model": str(job.get("model", "")),
        "train_epochs": str(job.get("train_epochs") or 0),
        "pool": str(job.get("pool", "")),
        "pools": str(job_dir / POOLS_FILE),
        "run": str(job_dir / RUN),
        "checkpoints": str(job_dir / CHECKPOINTS),
        "storage": f"sqlite:///{job_dir / 'optuna.db'}",
        "study": f"foxhunt-{job['job_id']}",
        "job_id": str(job["job_id"]),
        "commit": str(job.get("commit_sha", "")),
        "trials": str(int(job.get("hyperopt_trials", 0))),
    }


@dataclass(frozen=True)
class Outcome:
    """How the pipeline ended: its exit code and, when a step failed, which one and its last line."""

    code: int
    step: str | None = None
    last_line: str | None = None


@dataclass
class _Failure:
    name: str
    template: str
    code: int
    message: str

    def as_argo(self) -> dict[str, str]:
        """Shaped like an item of Argo's `workflow.failures`, which the exit handler gets on a cluster."""
        return {
            "displayName": self.name,
            "templateName": self.template,
            "phase": "Failed",
            "exitCode": str(self.code),
            "message": self.message,
        }


@dataclass
class PipelineRun:
    """One attempt of one job's pipeline. `stop` (set by the SIGTERM handler) starts no further step."""

    job_dir: Path
    job: dict[str, Any]
    trainer: list[str]
    gpu: int | None = None
    parallel_trials: int = 1
    stop: threading.Event = field(default_factory=threading.Event)
    pipeline: Pipeline = PIPELINE
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    clock: Callable[[], float] = time.monotonic
    _failures: list[_Failure] = field(default_factory=list, init=False)
    _done: list[dict[str, Any]] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    @property
    def attempt(self) -> int:
        return int(self.job.get("attempt", 0))

    def run(self) -> Outcome:
        """The whole pipeline, then on-exit; the outcome of the first failed step (or of on-exit)."""
        started = self.clock()
        values = bindings(self.job_dir, self.job)
        outcome = self._main(values)
        if outcome.code != 0 and self.stop.is_set():
            step = outcome.step or ""
            self._failures.append(_Failure(step, step, outcome.code, "stopped on request"))
        status = "Succeeded" if outcome.code == 0 else "Failed"
        exit_values = {
            **values,
            "status": status,
            "duration": f"{self.clock() - started:.1f}",
            "failures": json.dumps([f.as_argo() for f in self._failures] or None),
        }
        code, last = self._run(self.pipeline.on_exit, exit_values, self.pipeline.on_exit.name, stoppable=False)
        self._record(None)
        if outcome.code == 0 and code != 0:
            return Outcome(code, self.pipeline.on_exit.name, last)
        return outcome

    def _main(self, values: dict[str, str]) -> Outcome:
        return self._walk(self.pipeline.graph, values) or Outcome(0)

    def _walk(self, graph: Graph, values: dict[str, str]) -> Outcome | None:
        """`graph`'s nodes in order; the outcome of the first that failed (or of a stop), else None."""
        sources = {node.fan_out.source for node in graph.nodes if node.fan_out}
        printed: dict[str, list[str]] = {}
        for node in graph.nodes:  # each step checks for a stop before it starts
            if node.when is not None and not node.when.holds(values):
                continue
            bound = node.values(values)
            if isinstance(node.run, Graph):
                outcome = self._walk(node.run, bound)
            elif node.fan_out is not None:
                outcome = self._fan_out(node, node.run, graph.node(node.fan_out.source), printed, bound)
            else:
                capture = printed.setdefault(node.name, []) if node.name in sources else None
                outcome = self._required(node.run, bound, capture=capture)
            if outcome is not None:
                return outcome
        return None

    def _required(self, step: Step, values: dict[str, str], capture: list[str] | None = None) -> Outcome | None:
        """Run a step that must succeed; the pipeline's outcome if it did not (or a stop came)."""
        if self.stop.is_set():
            return Outcome(STOPPED_CODE, step.name)
        code, last = self._run(step, values, step.name, capture=capture)
        if code != 0:
            if not self.stop.is_set():
                self._failures.append(_Failure(step.name, step.name, code, f"exit code {code}"))
            return Outcome(code, step.name, last)
        if self.stop.is_set():
            return Outcome(STOPPED_CODE, step.name)
        return None

    def _fan_out(
        self, node: Node, step: Step, source: Node, printed: dict[str, list[str]], values: dict[str, str]
    ) -> Outcome | None:
        """`step` once per item of the JSON list `source` printed (its log lines go to stderr),
        `parallel_trials` at a time; a failed item is recorded, and ends the graph unless tolerated."""
        fan_out = node.fan_out
        assert fan_out is not None
        source_name = source.run.name
        try:
            items = json.loads("".join(printed.get(source.name, [])).strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            items = None
        if not isinstance(items, list) or not all(_fan_out_item(n) for n in items):
            line = f"{source_name} printed no JSON list of {fan_out.item} items (numbers or strings)"
            self._say(line)
            self._failures.append(_Failure(source_name, source_name, 1, line))
            return Outcome(1, source_name, line)
        started = iter(range(1, len(items) + 1))
        failed: list[tuple[str, int]] = []

        def one(item: int | str) -> None:
            if self.stop.is_set():
                return
            with self._lock:
                phase = f"{step.name} {next(started)}/{len(items)}"
            name = f"{step.name} {item}"
            code, _ = self._run(step, {**values, fan_out.item: str(item)}, name, phase=phase)
            if code != 0 and not self.stop.is_set():
                self._failures.append(_Failure(name, step.name, code, f"exit code {code}"))
                failed.append((name, code))
                if fan_out.tolerate_failures:
                    self._say(f"{MARK} {name} failed; the {node.name} fan-out goes on without it")

        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel_trials, len(items) or 1))) as pool:
            list(pool.map(one, items))
        if self.stop.is_set():
            return Outcome(STOPPED_CODE, step.name)
        if failed and not fan_out.tolerate_failures:
            return Outcome(failed[0][1], failed[0][0])
        return None

    def _run(
        self,
        step: Step,
        values: dict[str, str],
        name: str,
        *,
        phase: str | None = None,
        capture: list[str] | None = None,
        stoppable: bool = True,
    ) -> tuple[int, str | None]:
        """One step's process, its output into the log (stdout into `capture` when given): exit code, last line."""
        command = [*self.trainer, *step.command(values)]
        self._record(phase or name)
        self._say(f"{MARK} step {name} starting: {shlex.join(command)}")
        begun = self.clock()
        try:
            child = spawn(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if capture is not None else self.out,
                stderr=self.out,
                env=self._env(step, values),
                text=True,
            )
        except OSError as error:
            self._say(f"error: cannot start {command[0]}: {error}")
            code = NOT_STARTED_CODE
        else:
            if stoppable and self.stop.is_set():  # the stop came between the check and the start
                child.terminate()
            if capture is not None:
                assert child.stdout is not None
                for line in child.stdout:
                    capture.append(line)
                    self.out.write(line)
                    self.out.flush()
            code = child.wait()
            if code < 0:  # killed by a signal: report it as a shell (and Argo) would
                code = 128 - code
        last = self._last_line()
        seconds = self.clock() - begun
        self._say(f"{MARK} step {name} finished: exit {code} ({seconds:.1f} s)")
        with self._lock:
            self._done.append({"step": name, "code": code, "seconds": round(seconds, 3)})
        return code, last

    def _env(self, step: Step, values: dict[str, str]) -> dict[str, str]:
        """The step's environment from the pipeline (as an Argo pod gets it), over this process's without
        any of the pipeline's names; FOXHUNT_JOB_ID and FOXHUNT_ATTEMPT on every step, by which the
        backend finds a job's processes (local.py); the job's GPU on its GPU steps."""
        env = {name: value for name, value in os.environ.items() if name not in self.pipeline.env_names()}
        env |= {"FOXHUNT_JOB_ID": str(self.job["job_id"]), "FOXHUNT_ATTEMPT": str(self.attempt)}
        env |= step.environment(values)
        if self.gpu is not None:  # the job's GPU for its GPU steps; none for the others, as on a cluster
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu) if step.resources == "gpu" else ""
        return env

    def _say(self, line: str) -> None:
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()

    def _record(self, current: str | None) -> None:
        with self._lock:
            write_json_atomic(state_file(self.job_dir, self.attempt), {"current": current, "done": self._done})

    def _last_line(self) -> str | None:
        """The log's last line that is not one of ours: the step's own last word, for a failure message."""
        try:
            with open(self.job_dir / "log.txt", "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - _TAIL_BYTES))
                lines = log.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return None
        mine = [ln for ln in lines if ln.strip() and not ln.startswith(MARK)]
        return mine[-1][:_LAST_LINE_CHARS] if mine else None


def run_job(job_dir: Path, attempt: int, trainer: list[str], stop: threading.Event) -> Outcome:
    """The supervisor's entry: the job's pipeline as the backend launched it (job.json, run-<attempt>.json)."""
    job = json.loads((job_dir / "job.json").read_text())
    launch = json.loads((job_dir / f"run-{attempt}.json").read_text())
    run = PipelineRun(
        job_dir,
        {**job, "attempt": attempt},
        trainer,
        gpu=launch.get("gpu"),
        parallel_trials=int(launch.get("parallel_trials", 1)),
        stop=stop,
    )
    return run.run()
