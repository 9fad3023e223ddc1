"""billing: a usage record keeps its request's `metadata` (the team's labels), for reports of spend
by any of its keys

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_record") as batch:
        batch.add_column(sa.Column("request_metadata", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_record") as batch:
        batch.drop_column("request_metadata")
