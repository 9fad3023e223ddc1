"""billing: a team's usage records newest first (the request log)

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-27
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_usage_record_team_id", "usage_record", ["team", "id"])


def downgrade() -> None:
    op.drop_index("ix_usage_record_team_id", table_name="usage_record")
