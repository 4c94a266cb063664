"""Initial catalog: runs, policy_versions, sampler_leases.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(200), primary_key=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(40), nullable=False),
    )
    op.create_table(
        "policy_versions",
        sa.Column("run_id", sa.String(200), primary_key=True),
        sa.Column("version", sa.BigInteger(), primary_key=True),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint", sa.String(2000), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "sampler_leases",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(200), nullable=False),
        sa.Column("trajectory_id", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("trainer_version", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("leased_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("consumed", sa.Boolean(), nullable=False),
        sa.Column("consumed_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("run_id", "trajectory_id", name="uq_sampler_leases_run_trajectory"),
    )
    op.create_index("ix_sampler_leases_run_id", "sampler_leases", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_sampler_leases_run_id", table_name="sampler_leases")
    op.drop_table("sampler_leases")
    op.drop_table("policy_versions")
    op.drop_table("runs")
