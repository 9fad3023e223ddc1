"""tenancy: a team's receiver of its events may be set by the team itself (then held to public
addresses), as well as by the operator

Revision ID: 0034
Revises: 0033
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.add_column(
            sa.Column(
                "webhook_url_by_team", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("team") as batch:
        batch.drop_column("webhook_url_by_team")
