"""jobs: index (tenant, pool, state, gpus) for the quota's GPU-use query

Every admitting transaction sums the GPUs of the tenant's active jobs on the pool while it holds the
admission lock. With only single-column indexes that read every job the tenant ever ran (terminal ones
included), so a submission slowed as the history grew; this index answers it from the active jobs'
index entries alone.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06 04:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_admission", "jobs", ["tenant", "pool", "state", "gpus"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_admission", table_name="jobs")
