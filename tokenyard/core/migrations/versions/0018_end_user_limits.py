"""tenancy: a team may limit each of its end users (requests and tokens per minute, dollars per
day), beside its own limits

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.add_column(sa.Column("user_rpm", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("user_tpm", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("user_usd_per_day", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.drop_column("user_usd_per_day")
        batch.drop_column("user_tpm")
        batch.drop_column("user_rpm")
