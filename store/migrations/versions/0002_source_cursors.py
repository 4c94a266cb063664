"""Import cursors: how far a poller has read an external log, per run and source.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "source_cursors",
        sa.Column("run_id", sa.String(200), primary_key=True),
        sa.Column("source", sa.String(500), primary_key=True),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("last_key", sa.String(500), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("source_cursors")
