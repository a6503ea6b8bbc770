"""Request and response models of the API: input, storage and output kept apart."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from contracts.config import (
    INT32_MAX,
    MODELS,
    STEPS_PER_EPOCH,
    TrainConfig,
    check_model,
    check_search,
    check_steps_or_epochs,
)
from contracts.plans import PlanName
from service.domain import MAX_RUNS, JobFields, JobState, PackRuns

LabelKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_./]{0,61}[A-Za-z0-9])?$")]
LabelValue = Annotated[str, StringConstraints(pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")]
JobName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
POOL_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A pool's name as the pools file allows it (a DNS label); an empty name is an error, not "the default"."""
NO_NUL = r"^[^\x00]*$"
"""Strings the store keeps: PostgreSQL cannot hold a NUL character in text."""


def _aware(value: datetime | None) -> datetime | None:
    """A deadline with a timezone that is also a valid UTC time (the store keeps UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("deadline needs a timezone, e.g. 2030-01-01T00:00:00Z")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError("deadline is out of range: in UTC it must fall within the years 1 to 9999") from None
    return value


class JobCreate(BaseModel):
    """A job submission. Repeating it with the same Idempotency-Key (or name) returns the same job."""

    model_config = ConfigDict(extra="forbid")

    config: TrainConfig = Field(default_factory=TrainConfig, description="The trainer's TrainConfig.")
    model: str = Field(
        "dqn", min_length=1, max_length=128, pattern=NO_NUL, description=f"Model to train: {', '.join(MODELS)}."
    )
    plan: PlanName | None = Field(None, description="Execution plan; overrides config.run.plan when given.")
    commit_sha: str = Field(
        "HEAD", pattern=r"^([0-9a-f]{7,40}|HEAD)$", description="Commit of the trainer code to build and run."
    )
    pool: str | None = Field(
        None, max_length=63, pattern=POOL_NAME, description="GPU pool; the first configured pool if omitted."
    )
    epochs: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description=(
            f"The run's length in epochs of {STEPS_PER_EPOCH} steps (run.steps = epochs x {STEPS_PER_EPOCH}, set "
            "by the job's resolve step); a config that sets run.steps too is refused (422)."
        ),
    )
    hyperopt_trials: int = Field(0, ge=0, le=10_000, description="Hyper-parameter trials (0: a single run).")
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Labels to select jobs by (key=value)."
    )
    priority: int = Field(0, ge=-1000, le=1000, description="Higher runs first among waiting jobs.")
    deadline: Annotated[datetime | None, AfterValidator(_aware)] = Field(
        None, description="Cancel the job if it has not finished by then (RFC 3339 with timezone)."
    )
    name: JobName | None = Field(None, description="Client-chosen name; acts as the idempotency key if none is sent.")

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str) -> str:
        check_model(model)  # the trainer's own check, which the job's resolve step runs again
        return model

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> JobCreate:
        check_steps_or_epochs(self.config, self.epochs)
        return self

    @model_validator(mode="after")
    def _search(self) -> JobCreate:
        check_search(self.config, self.hyperopt_trials)  # the suggest step's own check, before anything runs
        return self


LABEL_SELECTOR = r"^[^,=\s\x00]+=[^,=\s\x00]*(,[^,=\s\x00]+=[^,=\s\x00]*)*$"


class JobQuery(BaseModel):
    """GET /v1/jobs's query: filters (all must match), then the page."""

    state: JobState | None = None
    pool: str | None = Field(None, max_length=63, pattern=POOL_NAME)
    label_selector: str | None = Field(
        None, max_length=1024, pattern=LABEL_SELECTOR, description="key=value[,key=value]"
    )
    submitter: str | None = Field(None, max_length=128, pattern=NO_NUL)
    limit: int = Field(50, ge=1, le=500)
    cursor: str | None = Field(None, max_length=1024)


class PhaseEvent(BaseModel):
    state: JobState
    reason: str | None = None
    message: str | None = None
    attempt: int
    at: datetime


class JobPublic(JobFields):
    """A job as listed: its fields (`service.domain.JobFields`) and where it stands."""

    state: JobState
    reason: str | None = Field(description="Machine-readable cause of the state, kept apart from it.")
    message: str | None
    phase: str | None = Field(description="The backend's own phase string.")
    attempt: int
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    step: int | None = Field(description="Last reported training step.")
    epoch_seconds: float | None = Field(
        description=(
            "A projection, not elapsed time: the wall seconds one epoch (2000 steps) would take at the last "
            "reported mean step time (step_ms x 2000 / 1000)."
        )
    )
    breakdown_ms: dict[str, float] | None = Field(description="Last per-step breakdown, milliseconds by component.")


class JobDetail(JobPublic):
    """A job with its resolved config and phase history."""

    config: dict[str, Any] = Field(description="The resolved TrainConfig the job runs.")
    history: list[PhaseEvent]
    runs: PackRuns = Field(
        description=(
            "Per-run progress of the last pack that reported (a search's trials packed into one process): "
            "each run's index, seed, trial, step, returns and whether it diverged. Kept once the pack ends."
        )
    )


class ProgressReport(BaseModel):
    """A trainer's progress report (its progress.json); fields the controller does not keep are ignored.

    Strict types: `"5"`, `true` and `5.0` are not a step, `"1"` is not a breakdown figure (422)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    step: int = Field(ge=0, le=INT32_MAX, description="Training steps done.")
    steps: int | None = Field(None, ge=0, le=INT32_MAX, description="Training steps of the whole run.")
    plan: str | None = Field(None, max_length=64, pattern=NO_NUL, description="The execution plan that runs.")
    step_ms: float | None = Field(None, ge=0, description="Mean milliseconds per step over the last window.")
    epoch_seconds: float | None = Field(None, ge=0, description="Seconds per epoch (2000 steps) at that pace.")
    breakdown_ms: (
        dict[Annotated[str, StringConstraints(max_length=64, pattern=NO_NUL)], Annotated[float, Field(ge=0)]] | None
    ) = Field(None, max_length=64, description="Mean milliseconds per step by component.")
    losses: dict[str, float | None] | None = Field(None, max_length=64, description="Last losses by name.")
    runs: PackRuns = Field(
        None, max_length=MAX_RUNS, description="A pack's trainer: each run's progress (at most 64, one per index)."
    )


class JobPage(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class TolerationPublic(BaseModel):
    key: str | None
    operator: str
    value: str | None
    effect: str | None


class PoolPublic(BaseModel):
    name: str
    gpu_type: str
    gpus_per_node: int
    gpu_resource: str = Field(description="Extended resource name of the pool's GPUs, requested per node.")
    node_selector: dict[str, str]
    tolerations: list[TolerationPublic]
    queue_name: str | None
    quota_gpus: int | None = Field(description="The caller's GPU quota on this pool; null means unlimited.")
    used_gpus: int = Field(description="GPUs the caller's active jobs hold on this pool.")


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = Field(None, description="Field errors of a 422.")


class Health(BaseModel):
    status: str
