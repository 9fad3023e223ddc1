"""tenancy: an API key may cap its own requests in flight, beside its team's concurrency

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("apikey") as batch:
        batch.add_column(sa.Column("concurrency", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("apikey") as batch:
        batch.drop_column("concurrency")
