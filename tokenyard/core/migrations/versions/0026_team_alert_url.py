"""tenancy: a team's own receiver of its budget alerts

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.add_column(sa.Column("alert_url", sqlmodel.sql.sqltypes.AutoString(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.drop_column("alert_url")
