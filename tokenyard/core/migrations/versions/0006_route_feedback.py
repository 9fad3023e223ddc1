"""router: feedback on served requests, and the router's view of auto-routed prompts

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_record") as table:
        table.add_column(
            sa.Column("route_features", sqlmodel.sql.sqltypes.AutoString(), nullable=True)
        )
    op.create_table(
        "route_feedback",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("request_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("team", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("comment", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("request_id"),
    )
    op.create_index("ix_route_feedback_team", "route_feedback", ["team"])


def downgrade() -> None:
    op.drop_index("ix_route_feedback_team", "route_feedback")
    op.drop_table("route_feedback")
    with op.batch_alter_table("usage_record") as table:
        table.drop_column("route_features")
