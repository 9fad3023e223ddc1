"""tenancy: the kinds of endpoint a team, and a key within it, may call (restricted keys)

Revision ID: 0032
Revises: 0031
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("team", "apikey"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("scopes", sa.String(), nullable=True))


def downgrade() -> None:
    for table in ("team", "apikey"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("scopes")
