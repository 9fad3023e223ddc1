"""guard: an audit row names the end user its request was for (`safety_identifier` or `user`)

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("guard_audit") as batch:
        batch.add_column(sa.Column("end_user", sqlmodel.sql.sqltypes.AutoString(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("guard_audit") as batch:
        batch.drop_column("end_user")
