"""The Responses API's stored responses (`store: true`, OpenAI's default): one row per response,
team-scoped, kept for TOKENYARD_RESPONSES_RETENTION_DAYS."""

from sqlalchemy import Column, LargeBinary
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
