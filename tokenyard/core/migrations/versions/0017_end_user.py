"""billing: a usage record names the team's end user its request was for (`safety_identifier` or
`user`), indexed for a team's usage by end user over a range of days

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_usage_record_team_day_end_user"


def upgrade() -> None:
    with op.batch_alter_table("usage_record") as batch:
        batch.add_column(sa.Column("end_user", sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch.create_index(INDEX, ["team", "day", "end_user"])


def downgrade() -> None:
    with op.batch_alter_table("usage_record") as batch:
        batch.drop_index(INDEX)
        batch.drop_column("end_user")
