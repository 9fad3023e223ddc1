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
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import msgspec
from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from tokenyard.core import outbox
from tokenyard.core.destinations import ANYWHERE, allow_list
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


def _unix(at: datetime | None) -> int | None:
    """A time SQL gave back (naive, in UTC) as unix seconds."""
    if at is None:
        return None
    return int((at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp())


def payload(event: TeamEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "object": "event",
        "created_at": _unix(event.created_at),
        "type": event.type,
        "data": event.data,
    }


def state(event: TeamEvent, now: datetime) -> str:
    """`delivered`; `given up` (after MAX_CLAIMS claims, or once MAX_AGE old); else `pending`."""
    if event.delivered_at is not None:
        return "delivered"
    if event.claims >= MAX_CLAIMS or _unix(event.created_at) < (now - MAX_AGE).timestamp():
        return "given up"
    return "pending"


def listed(
    engine: Engine, start: date, end: date, team: str | None, limit: int
) -> list[dict[str, Any]]:
    """The events recorded from `start` to `end` inclusive (UTC days), newest first, at most
    `limit`: each as its receiver gets it, with its team, state, tries so far, when it was
    delivered or is tried next (unix seconds), and the last try's error."""
    since = datetime.combine(start, time(), UTC)
    until = datetime.combine(end + timedelta(days=1), time(), UTC)
    query = select(TeamEvent).where(TeamEvent.created_at >= since, TeamEvent.created_at < until)
    if team is not None:
        query = query.where(TeamEvent.team == team)
    query = query.order_by(col(TeamEvent.created_at).desc(), col(TeamEvent.id).desc())
    with Session(engine) as session:
        found = session.exec(query.limit(limit)).all()
    now = datetime.now(UTC)
    return [
        payload(e)
        | {
            "team": e.team,
            "state": (shown := state(e, now)),
            "tries": e.claims,
            "delivered_at": _unix(e.delivered_at),
            "retry_at": _unix(e.retry_at) if shown == "pending" else None,
            "last_error": e.last_error,
        }
        for e in found
    ]


def send_again(engine: Engine, event_id: str) -> bool:
    """An event not delivered (pending, or given up after its tries, say while its receiver was
    down) due again at once, its tries counted from 0; False where there is no such event, it
    was delivered, or it is older than MAX_AGE (no sender takes an event that old)."""
    now = datetime.now(UTC)
    with Session(engine) as session:
        done = session.exec(
            update(TeamEvent)
            .where(
                col(TeamEvent.id) == event_id,
                col(TeamEvent.delivered_at).is_(None),
                col(TeamEvent.created_at) >= now - MAX_AGE,
            )
            .values(claims=0, retry_at=None)
        )
        session.commit()
    return done.rowcount == 1


def claim(engine: Engine, lease_s: float) -> tuple[TeamEvent, str, bool] | None:
    """One due event, claimed for `lease_s`, with its team's receiver now and whether the team
    set that itself."""
    query = select(TeamEvent, Team.webhook_url, Team.webhook_url_by_team)
    query = query.join(Team, col(Team.name) == col(TeamEvent.team))
    query = query.where(col(Team.webhook_url).is_not(None))
    found = outbox.claim(engine, TeamEvent, query, lease_s, MAX_CLAIMS, MAX_AGE)
    return None if found is None else (found[0], found[1], found[2])


class EventSender(outbox.Sender):
    what = "team event"

    def __init__(self, sql: Engine, settings: Settings) -> None:
        poll_s, attempts = settings.events_poll_s, settings.events_attempts
        super().__init__(sql, poll_s, attempts, settings.events_retry_s)
        # a receiver the team set: public addresses, or the networks the operator allows batch
        # callbacks (the same trust: the team chose it)
        self.team_allow = allow_list(settings.batch_callback_allow)

    async def send_one(self, client: Any) -> bool:
        """Claim and send one event; False when none was due."""
        claimed = await asyncio.to_thread(claim, self.sql, self.lease_s)
        if claimed is None:
            return False
        event, url, by_team = claimed
        secret = await asyncio.to_thread(team_secret, self.sql, event.team)
        ok = await deliver(
            client,
            url,
            message_id=event.id,
            body=msgspec.json.encode(payload(event)),
            secret=secret,
            allow=self.team_allow if by_team else ANYWHERE,  # the operator's: any address
            attempts=self.attempts,
            backoff_s=1.0,
        )
        await asyncio.to_thread(
            outbox.finish, self.sql, TeamEvent, event.id, ok, self.retry_s, "webhook failed"
        )
        return True
