"""billing: budget alerts, one per dollar budget, period and percent crossed

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TEXT = sqlmodel.sql.sqltypes.AutoString
_TIME = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    op.create_table(
        "budget_alert",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team", _TEXT(), nullable=False),
        sa.Column("key_prefix", _TEXT(), nullable=False),
        sa.Column("budget", _TEXT(), nullable=False),
        sa.Column("period", _TEXT(), nullable=False),
        sa.Column("percent", sa.Integer(), nullable=False),
        sa.Column("spent_usd", sa.Float(), nullable=False),
        sa.Column("limit_usd", sa.Float(), nullable=False),
        sa.Column("request_id", _TEXT(), nullable=False),
        sa.Column("created_at", _TIME(), nullable=False),
        sa.Column("delivered_at", _TIME(), nullable=True),
        sa.Column("claims", sa.Integer(), nullable=False),
        sa.Column("retry_at", _TIME(), nullable=True),
        sa.Column("last_error", _TEXT(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("team", "key_prefix", "budget", "period", "percent"),
    )
    op.create_index("ix_budget_alert_team", "budget_alert", ["team"])
    op.create_index("ix_budget_alert_created_at", "budget_alert", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_budget_alert_created_at", table_name="budget_alert")
    op.drop_index("ix_budget_alert_team", table_name="budget_alert")
    op.drop_table("budget_alert")
