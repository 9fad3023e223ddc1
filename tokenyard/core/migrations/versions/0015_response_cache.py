"""the response cache: a usage record says whether it answered the request; a team may have a time
of its own for it

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_record") as batch:
        batch.add_column(
            sa.Column("cache_hit", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("team") as batch:
        batch.add_column(sa.Column("cache_ttl_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.drop_column("cache_ttl_s")
    with op.batch_alter_table("usage_record") as batch:
        batch.drop_column("cache_hit")
