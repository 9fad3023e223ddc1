"""tenancy: the tags every deployment serving a team must carry (data residency, providers' terms)

Revision ID: 0036
Revises: 0035
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.add_column(sa.Column("deployment_tags", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.drop_column("deployment_tags")
