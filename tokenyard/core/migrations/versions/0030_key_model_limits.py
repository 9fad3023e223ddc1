"""tenancy: a key's own requests and tokens per minute on single models, beside its team's

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("apikey") as batch:
        batch.add_column(sa.Column("model_limits", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("apikey") as batch:
        batch.drop_column("model_limits")
