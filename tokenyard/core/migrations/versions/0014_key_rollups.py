"""billing: a daily rollup per API key, built from the records already stored; the rollups' counts
become 64-bit (PostgreSQL's INTEGER is 32-bit: a busy team's tokens of one day pass 2**31)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTS = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens")


def upgrade() -> None:
    with op.batch_alter_table("usage_daily") as batch:
        for name in COUNTS:
            batch.alter_column(name, type_=sa.BigInteger(), existing_type=sa.Integer())
    op.create_table(
        "usage_key_daily",
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in COUNTS),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("list_cost_usd", sa.Float(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("team", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("key_prefix", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.PrimaryKeyConstraint("day", "team", "key_prefix"),
    )
    # the records are the rollup's source (billing keeps every one), so this is exact
    op.execute(
        "INSERT INTO usage_key_daily (day, team, key_prefix, requests, errors, prompt_tokens,"
        " cached_tokens, completion_tokens, cost_usd, list_cost_usd)"
        " SELECT day, team, key_prefix, count(*), sum(CASE WHEN status != 200 THEN 1 ELSE 0 END),"
        " sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens), sum(cost_usd),"
        " sum(list_cost_usd)"
        " FROM usage_record WHERE key_prefix != '' GROUP BY day, team, key_prefix"
    )


def downgrade() -> None:
    op.drop_table("usage_key_daily")
    with op.batch_alter_table("usage_daily") as batch:
        for name in COUNTS:
            batch.alter_column(name, type_=sa.Integer(), existing_type=sa.BigInteger())
