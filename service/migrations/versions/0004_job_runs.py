"""jobs.runs: a pack's per-run progress (issue 31)

A pack trains several runs (a search's trials) in one process; its progress report lists each run's
step, returns and whether it diverged (`service.domain.RunProgress`, at most 64). The job keeps the last
list beside its step and breakdown, as JSON; null for a job no pack reported on.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06 07:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("runs", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "runs")
