"""billing: what an audio model was priced by, per record: seconds of audio transcribed and
characters of text spoken; 0 for what came before

Revision ID: 0037
Revises: 0036
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0037"
down_revision: str | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_record") as batch:
        batch.add_column(sa.Column("audio_seconds", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("characters", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usage_record") as batch:
        batch.drop_column("characters")
        batch.drop_column("audio_seconds")
