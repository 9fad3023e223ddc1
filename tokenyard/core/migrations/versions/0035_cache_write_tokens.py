"""billing: the prompt tokens written to a provider's prompt cache (Anthropic's premium), per
record and in the daily rollups; 0 for what came before

Revision ID: 0035
Revises: 0034
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the rollups' counts are 64-bit (migration 0014); a record's are not
TABLES = {"usage_record": sa.Integer(), "usage_daily": sa.BigInteger()}
TABLES["usage_key_daily"] = sa.BigInteger()


def upgrade() -> None:
    for table, kind in TABLES.items():
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("cache_write_tokens", kind, nullable=False, server_default="0")
            )


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("cache_write_tokens")
