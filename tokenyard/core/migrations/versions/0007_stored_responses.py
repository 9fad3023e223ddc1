"""gateway: the Responses API's stored responses (team-scoped, with an expiry)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TEXT = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "storedresponse",
        sa.Column("id", _TEXT(), nullable=False),
        sa.Column("team", _TEXT(), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.Integer(), nullable=False),
        sa.Column("response", sa.LargeBinary(), nullable=False),
        sa.Column("context", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_storedresponse_team"), "storedresponse", ["team"])
    op.create_index(op.f("ix_storedresponse_expires_at"), "storedresponse", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_storedresponse_expires_at"), "storedresponse")
    op.drop_index(op.f("ix_storedresponse_team"), "storedresponse")
    op.drop_table("storedresponse")
