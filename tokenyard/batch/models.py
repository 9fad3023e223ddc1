"""The batch tier's SQL tables: uploaded and produced files, jobs, and one row per request line.

Everything a job needs to resume lives here, so a restarted gateway picks up where a dead one
stopped: a request row is `pending` until a worker claims it (`running`, with a lease), then
`done` with its response or error; a row whose lease ran out is claimed again.
"""

from sqlalchemy import Column, LargeBinary
from sqlmodel import Field, SQLModel


class BatchFile(SQLModel, table=True):
    """An uploaded input file or a produced output/error file. The content is in SQL, not on disk:
    every gateway process (on any host) reads the same database, and files are bounded by the
    gateway's request body limit."""

    id: str = Field(primary_key=True)  # file-…
    team: str = Field(index=True)
    filename: str
    purpose: str  # batch (uploaded), batch_output (produced)
    bytes: int
    created_at: int  # unix seconds, as OpenAI's objects carry them
    content: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class BatchJob(SQLModel, table=True):
    id: str = Field(primary_key=True)  # batch_…
    team: str = Field(index=True)
    key_prefix: str  # the creating key's visible prefix, for billing attribution
    endpoint: str  # /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/rerank
    input_file_id: str | None = None  # None: the inline form (POST /v1/batch)
    completion_window: str = "24h"
    status: str = Field(index=True)  # OpenAI's batch states
    priority: int = 0  # among a team's batch jobs: higher is claimed first (inline form)
    metadata_json: str = "null"  # OpenAI's `metadata` (up to 16 string pairs), JSON
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    created_at: int
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    # inline form: POSTed the batch object when it ends; state none|pending|delivered|failed
    callback_url: str | None = None
    callback_state: str = "none"
    callback_lease_until: float = 0.0


class BatchRequest(SQLModel, table=True):
    id: str = Field(primary_key=True)  # batch_req_…
    batch_id: str = Field(foreign_key="batchjob.id", index=True)
    line: int  # position in the input: output files keep the input's order
    custom_id: str | None = None  # None: a malformed line that had none
    body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    # pending → running (leased) → done; malformed lines are created done, with an error
    state: str = Field(index=True)
    lease_owner: str | None = None
    lease_until: float = 0.0  # unix seconds
    not_before: float = 0.0  # refused by a quota: not retried before this
    attempts: int = 0
    status_code: int | None = None  # the response's (None: no response, see error_code)
    request_id: str | None = None
    response: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    error_code: str | None = None
    error_message: str | None = None
