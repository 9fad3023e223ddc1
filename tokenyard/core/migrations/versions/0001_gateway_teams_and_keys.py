"""gateway: teams and API keys

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TEXT = sqlmodel.sql.sqltypes.AutoString
_TIME = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    op.create_table(
        "team",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", _TEXT(), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("tokens_per_day", sa.Integer(), nullable=True),
        sa.Column("usd_per_day", sa.Float(), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("kv_pages", sa.Integer(), nullable=True),
        sa.Column("max_tokens", sa.Integer(), nullable=True),
        sa.Column("max_context", sa.Integer(), nullable=True),
        sa.Column("models", _TEXT(), nullable=False),
        sa.Column("default_tier", _TEXT(), nullable=False),
        sa.Column("auto_threshold", sa.Float(), nullable=True),
        sa.Column("strong_share", sa.Float(), nullable=True),
        sa.Column("batch_tokens_per_day", sa.Integer(), nullable=True),
        sa.Column("created_at", _TIME(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_team_name"), "team", ["name"], unique=True)
    op.create_table(
        "apikey",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("prefix", _TEXT(), nullable=False),
        sa.Column("key_hash", _TEXT(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.Column("created_at", _TIME(), nullable=False),
        sa.Column("last_used_at", _TIME(), nullable=True),
        sa.ForeignKeyConstraint(["team_id"], ["team.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_apikey_key_hash"), "apikey", ["key_hash"], unique=True)
    op.create_index(op.f("ix_apikey_prefix"), "apikey", ["prefix"], unique=True)
    op.create_index(op.f("ix_apikey_team_id"), "apikey", ["team_id"], unique=False)


def downgrade() -> None:
    op.drop_table("apikey")
    op.drop_table("team")
