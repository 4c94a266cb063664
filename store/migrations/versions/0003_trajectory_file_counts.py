"""The sampler's per-file counts of a run's finished trajectories (`FileCount`).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "trajectory_file_counts",
        sa.Column("run_id", sa.String(200), primary_key=True),
        sa.Column("path", sa.String(500), primary_key=True),
        sa.Column("finished", sa.BigInteger(), nullable=False),
        sa.Column("system_failures", sa.BigInteger(), nullable=False),
        sa.Column("no_reward", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("trajectory_file_counts")
