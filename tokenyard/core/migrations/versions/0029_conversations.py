"""gateway: OpenAI's Conversations (team-scoped) and their items

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TEXT = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "conversation",
        sa.Column("id", _TEXT(), nullable=False),
        sa.Column("team", _TEXT(), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_conversation_team"), "conversation", ["team"])
    op.create_table(
        "conversationitem",
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("conversation_id", _TEXT(), nullable=False),
        sa.Column("item_id", _TEXT(), nullable=False),
        sa.Column("item", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )
    op.create_index(
        op.f("ix_conversationitem_conversation_id"), "conversationitem", ["conversation_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_conversationitem_conversation_id"), "conversationitem")
    op.drop_table("conversationitem")
    op.drop_index(op.f("ix_conversation_team"), "conversation")
    op.drop_table("conversation")
