"""The controller's domain objects, shared by the API, the store and every backend."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from contracts.config import INT32_MAX


class JobState(enum.StrEnum):
    QUEUED = "QUEUED"  # accepted by us, not yet accepted by a backend
    PENDING = "PENDING"  # the backend has it; not running yet (Argo phase "" or Pending)
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # the job's own failure (Argo phase Failed, non-zero trainer exit)
    CANCELLED = "CANCELLED"
    ERROR = "ERROR"  # an infrastructure failure (Argo phase Error)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.ERROR})


class JobFields(BaseModel):
    """What a job is, as submitted and resolved: the fields a stored job (`service.store.NewJob`) and a
    listed one (`service.api.schemas.JobPublic`) share, declared once."""

    id: str
    name: str | None
    tenant: str
    submitter: str
    pool: str
    model: str
    plan: str
    commit_sha: str
    epochs: int
    hyperopt_trials: int
    priority: int
    deadline: datetime | None
    labels: dict[str, str]


class Placement(BaseModel):
    """Where a job's GPU steps run, from its pool's config: node selector, tolerations, GPU resource."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, str]] = Field(
        default_factory=list, description="Kubernetes tolerations (key, operator, value, effect; unset ones left out)."
    )
    gpu_resource: str = Field("nvidia.com/gpu", description="Extended resource name of the pool's GPUs.")
    gpus: int = Field(0, ge=0, description="GPUs of that resource each GPU step requests (the pool's gpus_per_node).")


class JobSpec(BaseModel):
    """What a backend needs to run one job; built by the API from a validated submission."""

    job_id: str = Field(description="Our id; also the deterministic backend object name.")
    tenant: str
    pool: str
    queue_name: str | None = Field(None, description="Kueue LocalQueue of the pool, if it names one.")
    placement: Placement = Field(default_factory=Placement, description="The pool's placement of GPU steps.")
    plan: str
    model: str
    commit_sha: str
    epochs: int
    train_epochs: int | None = Field(
        None,
        ge=1,
        description=(
            "Epochs the pipeline's resolve step turns into run.steps (then `config` leaves run.steps out); "
            "None: the config's run.steps."
        ),
    )
    hyperopt_trials: int = 0
    config: dict[str, Any] = Field(description="The job's TrainConfig, as JSON-compatible data.")
    labels: dict[str, str] = Field(default_factory=dict)
    priority: int = Field(0, description="Higher starts first among this backend's waiting jobs.")
    attempt: int = Field(0, description="Retry number; the checkpoint location does not depend on it.")


MAX_RUNS = 64
"""The most runs one progress report describes: a pack's bound (trainer/execution/pack.py MAX_PACK), which
also bounds what one job row keeps."""


class RunProgress(BaseModel):
    """One run of a pack (a seed of a sweep, a trial of a search) as its trainer last reported it.

    Strict as the rest of a progress report (`"5"` is no step, `1` no flag), and bounded: a pod reports it."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    run: int = Field(ge=0, lt=MAX_RUNS, description="The run's index in its pack (the metrics' `run` label).")
    seed: int | None = Field(None, ge=0, le=INT32_MAX, description="The run's run.seed.")
    trial: int | None = Field(None, ge=0, le=INT32_MAX, description="The Optuna trial it trains, in a search.")
    step: int = Field(ge=0, le=INT32_MAX, description="Training steps the run has done.")
    train_return: float | None = Field(None, description="Mean return of its last 20 training episodes.")
    eval_return: float | None = Field(None, description="Mean return of its last greedy evaluation.")
    diverged: bool = Field(False, description="The guard skipped an update: the run is frozen, the others go on.")


def _distinct_runs(runs: list[RunProgress] | None) -> list[RunProgress] | None:
    if runs is not None and len({r.run for r in runs}) != len(runs):
        raise ValueError("each run appears once (its index `run` is unique in the report)")
    return runs


PackRuns = Annotated[list[RunProgress] | None, AfterValidator(_distinct_runs)]
"""A pack's per-run progress: at most MAX_RUNS entries, one per run index."""


class BackendStatus(BaseModel):
    """A backend's view of one job at one moment."""

    job_id: str
    state: JobState
    reason: str | None = Field(None, description="Machine-readable cause, kept apart from the state.")
    phase: str | None = Field(None, description="The backend's own phase string, verbatim.")
    message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    breakdown_ms: dict[str, float] | None = Field(None, description="Last per-step breakdown, if known.")
    epoch_seconds: float | None = None
    step: int | None = None
    runs: PackRuns = Field(None, max_length=MAX_RUNS, description="Per-run progress of a pack, if known.")
    attempt: int | None = Field(None, description="Which attempt (JobSpec.attempt) this status describes, if known.")
