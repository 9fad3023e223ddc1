"""gateway: a team's quality bar for model="auto" (the cheapest model predicted to clear it)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.add_column(sa.Column("auto_quality", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.drop_column("auto_quality")
