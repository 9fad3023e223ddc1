"""billing: usage records and daily rollups

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TEXT = sqlmodel.sql.sqltypes.AutoString
_TIME = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    op.create_table(
        "usage_record",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("request_id", _TEXT(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("team", _TEXT(), nullable=False),
        sa.Column("key_prefix", _TEXT(), nullable=False),
        sa.Column("model", _TEXT(), nullable=False),
        sa.Column("model_served", _TEXT(), nullable=False),
        sa.Column("provider", _TEXT(), nullable=False),
        sa.Column("tier", _TEXT(), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("finish_reason", _TEXT(), nullable=True),
        sa.Column("error", _TEXT(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("usage_reported", sa.Boolean(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("list_cost_usd", sa.Float(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("queue_s", sa.Float(), nullable=True),
        sa.Column("compute_s", sa.Float(), nullable=True),
        sa.Column("started_at", _TIME(), nullable=False),
        sa.Column("finished_at", _TIME(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("request_id"),
    )
    op.create_index(op.f("ix_usage_record_day"), "usage_record", ["day"], unique=False)
    op.create_index(op.f("ix_usage_record_team"), "usage_record", ["team"], unique=False)
    op.create_table(
        "usage_daily",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("team", _TEXT(), nullable=False),
        sa.Column("model", _TEXT(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("list_cost_usd", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "team", "model"),
    )


def downgrade() -> None:
    op.drop_table("usage_daily")
    op.drop_table("usage_record")
