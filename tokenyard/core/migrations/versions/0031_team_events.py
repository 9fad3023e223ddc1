"""tenancy: a team's receiver of its events (background responses and batches ended), and the
events waiting to be sent there

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.add_column(
            sa.Column("webhook_url", sqlmodel.sql.sqltypes.AutoString(), nullable=True)
        )
    op.create_table(
        "team_event",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("team", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("type", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("delivered_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("claims", sa.Integer(), nullable=False),
        sa.Column("retry_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("last_error", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_team_event_team"), "team_event", ["team"])
    op.create_index(op.f("ix_team_event_created_at"), "team_event", ["created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_team_event_created_at"), table_name="team_event")
    op.drop_index(op.f("ix_team_event_team"), table_name="team_event")
    op.drop_table("team_event")
    with op.batch_alter_table("team") as batch:
        batch.drop_column("webhook_url")
