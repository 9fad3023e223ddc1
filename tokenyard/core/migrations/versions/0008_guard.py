"""guard: per-team safety policies and the audit log of flags and blocks

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "guard_policy",
        sa.Column("team", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("policy", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("updated_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("team"),
    )
    op.create_table(
        "guard_audit",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("request_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("team", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("direction", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("action", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("categories", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("scores", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("model", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("text", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_guard_audit_created_at", "guard_audit", ["created_at"])
    op.create_index("ix_guard_audit_request_id", "guard_audit", ["request_id"])
    op.create_index("ix_guard_audit_team", "guard_audit", ["team"])


def downgrade() -> None:
    op.drop_index("ix_guard_audit_team", "guard_audit")
    op.drop_index("ix_guard_audit_request_id", "guard_audit")
    op.drop_index("ix_guard_audit_created_at", "guard_audit")
    op.drop_table("guard_audit")
    op.drop_table("guard_policy")
