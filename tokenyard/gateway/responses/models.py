"""The Responses API's state: stored responses (`store: true`, OpenAI's default), one row per
response, team-scoped, kept for TOKENYARD_RESPONSES_RETENTION_DAYS; conversations with their
items, kept until deleted; and teams' reusable prompts, every version kept until deleted."""

from sqlalchemy import JSON, Column, LargeBinary, UniqueConstraint
from sqlmodel import Field, SQLModel


class StoredResponse(SQLModel, table=True):
    id: str = Field(primary_key=True)  # resp_…
    team: str = Field(index=True)
    created_at: int  # unix seconds
    expires_at: int = Field(index=True)  # past it, the response is gone (and purged)
    # the Response object as returned (JSON)
    response: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    # the items the response was generated from, with ids: earlier turns' inputs and outputs
    # (by previous_response_id), then this turn's input (JSON list); instructions are not items
    context: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class Conversation(SQLModel, table=True):
    """OpenAI's Conversations API: a conversation's items outlive any one response; a response
    made with `conversation` reads them all and adds its input and output to them."""

    id: str = Field(primary_key=True)  # conv_…
    team: str = Field(index=True)
    created_at: int  # unix seconds
    # its `metadata` (up to 16 string pairs); `metadata` itself is SQLModel's attribute
    labels: dict[str, str] | None = Field(default=None, sa_column=Column(JSON))


class ConversationItem(SQLModel, table=True):
    # the order items were added in: a conversation reads back in it
    seq: int | None = Field(default=None, primary_key=True)
    conversation_id: str = Field(index=True)
    item_id: str  # msg_…, fc_…, fco_…: unique within its conversation
    item: bytes = Field(sa_column=Column(LargeBinary, nullable=False))  # as listed (JSON)


class PromptVersion(SQLModel, table=True):
    """One version of a team's reusable prompt (gateway/responses/prompts.py)."""

    __tablename__ = "prompt_version"
    __table_args__ = (UniqueConstraint("prompt_id", "version"),)
    seq: int | None = Field(default=None, primary_key=True)
    prompt_id: str = Field(index=True)  # pmpt_…
    team: str = Field(index=True)
    version: int  # 1, 2, …: a new version is the latest
    messages: bytes = Field(sa_column=Column(LargeBinary, nullable=False))  # [{role, content}]
    description: str | None = None
    created_at: int  # unix seconds
