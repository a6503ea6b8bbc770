"""ORM tables. The schema is owned by the Alembic migrations in service/migrations/; keep them in step."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class JobRow(Base):
    """One job. The primary key is derived from tenant + idempotency key, so a duplicate insert fails."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    submitter: Mapped[str] = mapped_column(String(128), index=True)
    name: Mapped[str | None] = mapped_column(String(128))
    idempotency_key: Mapped[str] = mapped_column(String(256))
    request_hash: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str] = mapped_column(String(128), index=True)
    gpus: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(128))
    plan: Mapped[str] = mapped_column(String(32))
    commit_sha: Mapped[str] = mapped_column(String(64))
    epochs: Mapped[int] = mapped_column(Integer)
    hyperopt_trials: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer)
    deadline: Mapped[datetime | None] = mapped_column(DateTime)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    labels: Mapped[dict[str, str]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(128))
    message: Mapped[str | None] = mapped_column(Text)
    phase: Mapped[str | None] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    submitted_attempt: Mapped[int | None] = mapped_column(Integer)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime)
    cancel_forced: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    breakdown_ms: Mapped[dict[str, float] | None] = mapped_column(JSON)
    epoch_seconds: Mapped[float | None] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(Integer)
    runs: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # a pack's per-run progress (RunProgress)

    events: Mapped[list[JobEventRow]] = relationship(
        back_populates="job", order_by="JobEventRow.id", cascade="all, delete-orphan"
    )

    __table_args__ = (
        Index("ix_jobs_created_at_id", "created_at", "id"),
        # the quota's GPU use of a tenant on a pool, read in every admitting transaction (covering: gpus too)
        Index("ix_jobs_admission", "tenant", "pool", "state", "gpus"),
    )


class JobLabelRow(Base):
    """Labels as rows, so label selectors are plain SQL on SQLite and PostgreSQL alike."""

    __tablename__ = "job_labels"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))

    __table_args__ = (Index("ix_job_labels_key_value", "key", "value"),)


class JobEventRow(Base):
    """Phase history: one row per state change."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(128))
    message: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime)

    job: Mapped[JobRow] = relationship(back_populates="events")


class TokenRow(Base):
    """A bearer token, stored as the sha256 of its secret."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    tenant: Mapped[str] = mapped_column(String(128))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime)
