"""gateway: stored chat completions (`store: true`; team-scoped, with an expiry)

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TEXT = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "storedchat",
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("completion_id", _TEXT(), nullable=False),
        sa.Column("team", _TEXT(), nullable=False),
        sa.Column("model", _TEXT(), nullable=False),
        sa.Column("created", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.Integer(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=True),
        sa.Column("completion", sa.LargeBinary(), nullable=False),
        sa.Column("messages", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("team", "completion_id"),
    )
    op.create_index(op.f("ix_storedchat_team"), "storedchat", ["team"])
    op.create_index(op.f("ix_storedchat_model"), "storedchat", ["model"])
    op.create_index(op.f("ix_storedchat_expires_at"), "storedchat", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_storedchat_expires_at"), "storedchat")
    op.drop_index(op.f("ix_storedchat_model"), "storedchat")
    op.drop_index(op.f("ix_storedchat_team"), "storedchat")
    op.drop_table("storedchat")
