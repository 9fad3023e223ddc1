"""responses: teams' reusable prompts, one row per version

Revision ID: 0033
Revises: 0032
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "prompt_version",
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("prompt_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("team", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("messages", sa.LargeBinary(), nullable=False),
        sa.Column("description", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("prompt_id", "version"),
    )
    op.create_index(op.f("ix_prompt_version_prompt_id"), "prompt_version", ["prompt_id"])
    op.create_index(op.f("ix_prompt_version_team"), "prompt_version", ["team"])


def downgrade() -> None:
    op.drop_index(op.f("ix_prompt_version_team"), table_name="prompt_version")
    op.drop_index(op.f("ix_prompt_version_prompt_id"), table_name="prompt_version")
    op.drop_table("prompt_version")
