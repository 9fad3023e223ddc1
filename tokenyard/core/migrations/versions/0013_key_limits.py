"""tenancy: an API key may have rate limits and a daily budget of its own, beside its team's; a
team's counts become 64-bit (PostgreSQL's INTEGER is 32-bit: a limit over 2**31 was a 500)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TEAM_COUNTS = (
    "rpm",
    "tpm",
    "tokens_per_day",
    "concurrency",
    "kv_pages",
    "max_tokens",
    "max_context",
    "batch_tokens_per_day",
)


def upgrade() -> None:
    with op.batch_alter_table("team") as batch:
        for name in TEAM_COUNTS:
            batch.alter_column(name, type_=sa.BigInteger(), existing_type=sa.Integer())
    with op.batch_alter_table("apikey") as batch:
        batch.add_column(sa.Column("rpm", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("tpm", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("usd_per_day", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("apikey") as batch:
        batch.drop_column("usd_per_day")
        batch.drop_column("tpm")
        batch.drop_column("rpm")
    with op.batch_alter_table("team") as batch:
        for name in TEAM_COUNTS:
            batch.alter_column(name, type_=sa.Integer(), existing_type=sa.BigInteger())
