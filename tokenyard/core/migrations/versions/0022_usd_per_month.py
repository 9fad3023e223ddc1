"""tenancy: a team and a key may have a dollar budget per calendar month (UTC), beside the day's

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("team", "apikey"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("usd_per_month", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("team", "apikey"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("usd_per_month")
