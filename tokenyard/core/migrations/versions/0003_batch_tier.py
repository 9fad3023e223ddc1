"""batch: files, jobs and per-request state of the batch tier

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TEXT = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "batchfile",
        sa.Column("id", _TEXT(), nullable=False),
        sa.Column("team", _TEXT(), nullable=False),
        sa.Column("filename", _TEXT(), nullable=False),
        sa.Column("purpose", _TEXT(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_batchfile_team"), "batchfile", ["team"], unique=False)
    op.create_table(
        "batchjob",
        sa.Column("id", _TEXT(), nullable=False),
        sa.Column("team", _TEXT(), nullable=False),
        sa.Column("key_prefix", _TEXT(), nullable=False),
        sa.Column("endpoint", _TEXT(), nullable=False),
        sa.Column("input_file_id", _TEXT(), nullable=True),
        sa.Column("completion_window", _TEXT(), nullable=False),
        sa.Column("status", _TEXT(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("metadata_json", _TEXT(), nullable=False),
        sa.Column("output_file_id", _TEXT(), nullable=True),
        sa.Column("error_file_id", _TEXT(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.Column("in_progress_at", sa.Integer(), nullable=True),
        sa.Column("expires_at", sa.Integer(), nullable=False),
        sa.Column("finalizing_at", sa.Integer(), nullable=True),
        sa.Column("completed_at", sa.Integer(), nullable=True),
        sa.Column("failed_at", sa.Integer(), nullable=True),
        sa.Column("expired_at", sa.Integer(), nullable=True),
        sa.Column("cancelling_at", sa.Integer(), nullable=True),
        sa.Column("cancelled_at", sa.Integer(), nullable=True),
        sa.Column("callback_url", _TEXT(), nullable=True),
        sa.Column("callback_state", _TEXT(), nullable=False),
        sa.Column("callback_lease_until", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_batchjob_status"), "batchjob", ["status"], unique=False)
    op.create_index(op.f("ix_batchjob_team"), "batchjob", ["team"], unique=False)
    op.create_table(
        "batchrequest",
        sa.Column("id", _TEXT(), nullable=False),
        sa.Column("batch_id", _TEXT(), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", _TEXT(), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("state", _TEXT(), nullable=False),
        sa.Column("lease_owner", _TEXT(), nullable=True),
        sa.Column("lease_until", sa.Float(), nullable=False),
        sa.Column("not_before", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("request_id", _TEXT(), nullable=True),
        sa.Column("response", sa.LargeBinary(), nullable=True),
        sa.Column("error_code", _TEXT(), nullable=True),
        sa.Column("error_message", _TEXT(), nullable=True),
        sa.ForeignKeyConstraint(["batch_id"], ["batchjob.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_batchrequest_batch_id"), "batchrequest", ["batch_id"], unique=False)
    op.create_index(op.f("ix_batchrequest_state"), "batchrequest", ["state"], unique=False)


def downgrade() -> None:
    op.drop_table("batchrequest")
    op.drop_table("batchjob")
    op.drop_table("batchfile")
