"""A team's events, sent to its `webhook_url` as OpenAI's webhook events: `response.completed`,
`.incomplete`, `.failed` and `.cancelled` when a background response ends, `batch.completed`,
`.expired` and `.cancelled` when a batch does. The body is OpenAI's (`{"id": "evt_…",
"object": "event", "created_at", "type", "data": {"id": …}}`), signed per Standard Webhooks with
the team's webhook secret, as OpenAI signs its own: the `openai` SDK's `webhooks.unwrap` checks and
reads it.

An event is a row in SQL, written only where its team has a receiver, and sent at least once
(core/outbox.py): every gateway runs a sender; a retry keeps the event's id as its webhook-id, so
a receiver can drop a repeat. Given up after MAX_CLAIMS claims or three days, as OpenAI gives up.
"""

import asyncio
from datetime import timedelta
from typing import Any

import msgspec
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from tokenyard.core import outbox
from tokenyard.core.destinations import ANYWHERE
from tokenyard.core.ids import new_id
from tokenyard.core.settings import Settings
from tokenyard.core.webhooks import deliver
from tokenyard.tenancy.models import Team, TeamEvent
from tokenyard.tenancy.webhook_secrets import team_secret

MAX_CLAIMS = 20
MAX_AGE = timedelta(days=3)


def add(session: Session, team: str, kind: str, subject: str) -> None:
    """`kind` happened to `subject` (a response's or a batch's id): kept to be sent, where the
    team has a receiver, in the session's transaction (with what it reports, where it has one)."""
    if not session.exec(select(Team.webhook_url).where(Team.name == team)).first():
        return
    session.add(TeamEvent(id=new_id("evt"), team=team, type=kind, data={"id": subject}))


def record(engine: Engine, team: str, kind: str, subject: str) -> None:
    """`add`, in a transaction of its own."""
    with Session(engine) as session:
        add(session, team, kind, subject)
        session.commit()


def payload(event: TeamEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "object": "event",
        "created_at": int(event.created_at.timestamp()),
        "type": event.type,
        "data": event.data,
    }


def claim(engine: Engine, lease_s: float) -> tuple[TeamEvent, str] | None:
    """One due event, claimed for `lease_s`, with its team's receiver now."""
    query = select(TeamEvent, Team.webhook_url).join(Team, col(Team.name) == col(TeamEvent.team))
    query = query.where(col(Team.webhook_url).is_not(None))
    found = outbox.claim(engine, TeamEvent, query, lease_s, MAX_CLAIMS, MAX_AGE)
    return None if found is None else (found[0], found[1])


class EventSender(outbox.Sender):
    what = "team event"

    def __init__(self, sql: Engine, settings: Settings) -> None:
        poll_s, attempts = settings.events_poll_s, settings.events_attempts
        super().__init__(sql, poll_s, attempts, settings.events_retry_s)

    async def send_one(self, client: Any) -> bool:
        """Claim and send one event; False when none was due."""
        claimed = await asyncio.to_thread(claim, self.sql, self.lease_s)
        if claimed is None:
            return False
        event, url = claimed
        secret = await asyncio.to_thread(team_secret, self.sql, event.team)
        ok = await deliver(
            client,
            url,
            message_id=event.id,
            body=msgspec.json.encode(payload(event)),
            secret=secret,
            allow=ANYWHERE,  # the operator set the URL: any address may be one
            attempts=self.attempts,
            backoff_s=1.0,
        )
        await asyncio.to_thread(
            outbox.finish, self.sql, TeamEvent, event.id, ok, self.retry_s, "webhook failed"
        )
        return True
