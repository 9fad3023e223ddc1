"""billing: the client's own request id beside the gateway's

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_record") as table:
        table.add_column(
            sa.Column("client_request_id", sqlmodel.sql.sqltypes.AutoString(), nullable=True)
        )
        table.create_index("ix_usage_record_client_request_id", ["client_request_id"])


def downgrade() -> None:
    with op.batch_alter_table("usage_record") as table:
        table.drop_index("ix_usage_record_client_request_id")
        table.drop_column("client_request_id")
