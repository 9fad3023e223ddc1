"""Stored chat completions (`store: true` on POST /v1/chat/completions): one row per completion,
team-scoped, kept for TOKENYARD_CHATS_RETENTION_DAYS."""

from sqlalchemy import JSON, Column, LargeBinary, UniqueConstraint
from sqlmodel import Field, SQLModel


class StoredChat(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("team", "completion_id"),)

    # the order completions were stored in: lists page by it (created is whole seconds, so
    # completions of one second would have no order of their own)
    seq: int | None = Field(default=None, primary_key=True)
    # the completion's own id (the upstream's chatcmpl-…); unique within a team, and a lookup is
    # always by (team, id), so another team's id is a missing one
    completion_id: str
    team: str = Field(index=True)
    model: str = Field(index=True)  # the catalog model that served it (what `auto` chose)
    created: int  # the completion's unix seconds
    expires_at: int = Field(index=True)  # past it, the completion is gone (and purged)
    # the request's `metadata`, changed by POST /v1/chat/completions/{id}; `metadata` itself is
    # SQLModel's attribute
    labels: dict[str, str] | None = Field(default=None, sa_column=Column(JSON))
    # the completion object as the client received it, with the request's echoed fields (JSON)
    completion: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    # the request's messages (JSON list), as the client sent them
    messages: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
