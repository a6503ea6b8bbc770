"""The controller's one configuration object, read from FOXHUNT_* variables and passed to create_app."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.datasets import DEFAULT_MAX_BYTES, DatasetAccess

DEFAULT_LOCAL_COMMAND: tuple[str, ...] = (sys.executable, "-m", "trainer")


class Settings(BaseSettings):
    """Everything the controller needs; built by the caller (CLI, tests), never at import."""

    model_config = SettingsConfigDict(env_prefix="FOXHUNT_", extra="ignore")

    database_url: str = Field("sqlite:///./foxhunt.db", description="SQLAlchemy URL (SQLite or PostgreSQL).")
    backend: Literal["local", "argo"] = Field("local", description="Where jobs run.")
    pools_file: Path | None = Field(None, description="YAML file of GPU pools; none means one 'local' pool.")
    jobs_dir: Path = Field(Path("./foxhunt-jobs"), description="Working directory of the local backend.")
    local_command: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LOCAL_COMMAND),
        description=(
            "The trainer program the local backend runs; each step of the job pipeline (contracts/pipeline.py) "
            "appends its own subcommand and options, as on Argo."
        ),
    )
    local_parallel_trials: int = Field(
        1, ge=1, le=64, description="Trial steps (each a pack of trials) a local job runs at once (its one GPU or CPU)."
    )
    local_gpus: int | None = Field(None, ge=0, description="GPUs the local backend may use (None: detect).")
    auth_disabled: bool = Field(False, description="Dev mode: no tokens, every caller is tenant 'default'.")
    default_tenant: str = Field("default", description="The tenant of every caller when auth is disabled.")
    cancel_grace_seconds: float = Field(30.0, ge=0.0, description="Graceful stop time before a forced one.")
    image_pull_grace_seconds: float = Field(
        120.0, ge=0.0, description="How long a step's pod may wait for an image it cannot pull before the job fails."
    )
    reconcile_interval_seconds: float = Field(5.0, gt=0.0, description="Period of the full list reconcile.")
    run_reconciler: bool = Field(True, description="Start the reconciler threads with the app.")
    token_cache_seconds: float = Field(
        5.0,
        ge=0.0,
        le=300.0,
        description=(
            "How long a live bearer token is taken from the process's cache instead of the database: a revoked "
            "token keeps working for at most this long. 0: every request asks the database."
        ),
    )
    migrate_on_start: bool = Field(True, description="Run `alembic upgrade head` when the app is created.")
    argo_namespace: str = Field("foxhunt", description="Namespace of the Workflows (argo backend).")
    argo_workflow_template: str = Field("compile-and-train", description="WorkflowTemplate jobs reference.")
    kubeconfig: Path | None = Field(None, description="kubeconfig file; None means in-cluster config.")
    progress_secret: SecretStr | None = Field(
        None,
        min_length=32,
        description=(
            "Key of the attempt-scoped progress tokens (HMAC-SHA256 of the job id and attempt) that trainer "
            "pods send to PUT /v1/jobs/{id}/progress. Required with the argo backend; every replica must share it, and "
            "changing it invalidates the tokens of running Workflows. Unset: progress reports are refused."
        ),
    )
    leader_election: bool | None = Field(
        None,
        description=(
            "Take a coordination.k8s.io/v1 Lease before reconciling, so that of several controller replicas only "
            "the holder runs reconcile passes (all serve the API). None: on with the argo backend, off otherwise."
        ),
    )
    leader_election_lease: str = Field("foxhunt-controller", description="Name of the Lease, in argo_namespace.")
    leader_election_lease_seconds: int = Field(
        15, ge=1, le=3600, description="How long a Lease not renewed stays its holder's (leaseDurationSeconds)."
    )
    leader_election_renew_deadline_seconds: float = Field(
        10.0, gt=0.0, description="A holder that could not renew for this long stops reconciling (< lease)."
    )
    leader_election_retry_seconds: float = Field(
        2.0, gt=0.0, description="Period of the renewals, and of the other replicas' tries (< renew deadline)."
    )
    max_body_bytes: int = Field(
        1 << 20,
        ge=1,
        le=1 << 30,
        description="Longest request body the API reads; a longer one is refused (413) before it is read.",
    )
    body_timeout_seconds: float = Field(
        15.0,
        gt=0.0,
        le=3600.0,
        description="Time the whole body may take to arrive; a stalled one is refused (408), its connection closed.",
    )
    dataset_roots: list[str] = Field(
        default_factory=list,
        description=(
            "Where jobs' offline datasets (data.dataset) may come from: absolute local directories, or URL prefixes "
            "(s3://bucket/datasets/). Empty, with dataset_schemes empty too: no job may name a dataset."
        ),
    )
    dataset_schemes: list[str] = Field(
        default_factory=list, description="URL schemes any URL of which a job may name as its dataset (s3, gs)."
    )
    dataset_max_bytes: int = Field(
        DEFAULT_MAX_BYTES, ge=1, le=1 << 40, description="Largest dataset file a job may read (checked before reading)."
    )
    workers: int = Field(
        1, ge=1, le=64, description="API processes `foxhunt serve` starts (`--workers`); the reconciler runs in one."
    )
    reconciler_lock_file: Path | None = Field(
        None, description="Only the process holding this file's lock reconciles (set by `serve --workers`); None: this."
    )
    host: str = Field("127.0.0.1", description="Address `foxhunt serve` binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port `foxhunt serve` binds.")

    @property
    def dataset_access(self) -> DatasetAccess:
        """The dataset rules every job's trainer gets (in data.dataset_access) and every submission is checked by."""
        return DatasetAccess(
            roots=tuple(self.dataset_roots), schemes=tuple(self.dataset_schemes), max_bytes=self.dataset_max_bytes
        )

    @model_validator(mode="after")
    def _valid_dataset_access(self) -> Settings:
        """A bad root or scheme stops the controller at start, not the first submission."""
        _ = self.dataset_access
        return self

    @property
    def leader_election_enabled(self) -> bool:
        return self.backend == "argo" if self.leader_election is None else self.leader_election

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str) -> str:
        """Plain postgres URLs get the psycopg 3 driver we ship."""
        for prefix in ("postgres://", "postgresql://"):
            if value.startswith(prefix):
                return "postgresql+psycopg://" + value[len(prefix) :]
        return value
