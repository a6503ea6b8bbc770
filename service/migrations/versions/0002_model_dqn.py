"""jobs.model: the old API default `c51-branching` becomes `dqn`, the name the trainer now checks

Until issue 28 nothing read a job's `model`, and the API's default was `c51-branching`. The job
pipeline's compile step now refuses any model but `dqn` (trainer.config.MODELS), so a stored job with
the old default, retried or still queued after an upgrade, would fail there: it names the same
network, so it is renamed. Other values are left as they were submitted (compile refuses them).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06 12:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE jobs SET model = 'dqn' WHERE model = 'c51-branching'")


def downgrade() -> None:
    """Nothing to undo: `dqn` is as good a name for the network under 0001, where nothing reads it."""
