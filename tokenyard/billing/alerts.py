"""Budget alerts: the crossings billing records (store.write, from the quota script's settle) sent
to the operator's webhook (TOKENYARD_ALERT_WEBHOOK_URL) and to the team's own (its `alert_url`,
signed with the team's webhook secret), at least once.

Every gateway runs a sender. Each poll it claims one due alert in SQL (a conditional UPDATE on the
claim it read, so two gateways never send the same one at once), POSTs it (Standard Webhooks'
headers, `webhook-id` the alert's id on every try, signed when TOKENYARD_ALERT_WEBHOOK_SECRET is
set), and marks it delivered, or due again after `alert_retry_s`. A gateway that dies mid-send
leaves the claim to lapse. An alert is given up after MAX_CLAIMS claims or once a day old: a late
"80% of today's budget" helps no one.
"""

import asyncio
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import msgspec
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from tokenyard.billing import metrics
from tokenyard.billing.models import BudgetAlert
from tokenyard.core import outbox
from tokenyard.core.destinations import ANYWHERE
from tokenyard.core.settings import Settings
from tokenyard.core.webhooks import deliver
from tokenyard.tenancy.models import Team
from tokenyard.tenancy.webhook_secrets import team_secret

MAX_CLAIMS = 12
MAX_AGE = timedelta(days=1)
_SPANS = {"usd_per_day": "daily", "usd_per_month": "monthly"}


def text_of(alert: BudgetAlert) -> str:
    """One line for a chat channel (Slack's incoming webhooks show `text`)."""
    who = f"key {alert.key_prefix}… of team {alert.team}" if alert.key_prefix else alert.team
    span = _SPANS[alert.budget.removeprefix("key_")]
    return (
        f"Budget alert: {who} has spent ${alert.spent_usd:,.2f} of its {span} budget of "
        f"${alert.limit_usd:,.2f} ({alert.percent}% reached, {alert.period})."
    )


def payload(alert: BudgetAlert) -> dict[str, Any]:
    return {
        "type": "budget.threshold",
        "id": f"alert_{alert.id}",
        "team": alert.team,
        "key_prefix": alert.key_prefix or None,
        "budget": alert.budget,
        "period": alert.period,
        "percent": alert.percent,
        "spent_usd": round(alert.spent_usd, 6),
        "limit_usd": round(alert.limit_usd, 6),
        "request_id": alert.request_id,
        "created_at": int(alert.created_at.timestamp()),
        "text": text_of(alert),
    }


def listed(
    engine: Engine, start: date, end: date, team: str | None, limit: int
) -> list[dict[str, Any]]:
    """The alerts recorded from `start` to `end` inclusive (UTC days), newest first, at most
    `limit`; each as the webhook sends it, with when it was delivered (None: not yet, or no
    receiver is configured)."""
    since = datetime.combine(start, time(), UTC)
    until = datetime.combine(end + timedelta(days=1), time(), UTC)
    query = select(BudgetAlert).where(
        BudgetAlert.created_at >= since, BudgetAlert.created_at < until
    )
    if team is not None:
        query = query.where(BudgetAlert.team == team)
    query = query.order_by(col(BudgetAlert.created_at).desc(), col(BudgetAlert.id).desc())
    with Session(engine) as session:
        found = session.exec(query.limit(limit)).all()
    return [
        payload(a) | {"delivered_at": int(a.delivered_at.timestamp()) if a.delivered_at else None}
        for a in found
    ]


def claim(
    engine: Engine, lease_s: float, every_team: bool
) -> tuple[BudgetAlert, str | None] | None:
    """One due alert, claimed for `lease_s`, with its team's own receiver (None: none); None:
    nothing due (or others claimed it first). `every_team`: the operator receives every alert;
    else only those of teams with a receiver of their own are due."""
    query = select(BudgetAlert, Team.alert_url).join(
        Team, col(Team.name) == col(BudgetAlert.team), isouter=True
    )
    if not every_team:
        query = query.where(col(Team.alert_url).is_not(None))
    found = outbox.claim(engine, BudgetAlert, query, lease_s, MAX_CLAIMS, MAX_AGE)
    return None if found is None else (found[0], found[1])


class AlertSender(outbox.Sender):
    what = "budget alert"

    def __init__(self, sql: Engine, settings: Settings) -> None:
        poll_s, attempts = settings.alert_poll_s, settings.alert_attempts
        super().__init__(sql, poll_s, attempts, settings.alert_retry_s)
        self.url = settings.alert_webhook_url.get_secret_value()
        self.secret = settings.alert_webhook_secret.get_secret_value() or None

    async def send_one(self, client: Any) -> bool:
        """Claim and send one alert to the operator's receiver and the team's own (each signed
        with its own secret); False when none was due. Delivered once every receiver took it;
        a retry goes to both again, under the same webhook-id, so a receiver can drop a repeat."""
        claimed = await asyncio.to_thread(claim, self.sql, self.lease_s, bool(self.url))
        if claimed is None:
            return False
        alert, team_url = claimed
        assert alert.id is not None
        receivers = [(self.url, self.secret)] if self.url else []
        if team_url:
            secret = await asyncio.to_thread(team_secret, self.sql, alert.team)
            receivers.append((team_url, secret))
        body = msgspec.json.encode(payload(alert))
        ok = True
        for url, secret in receivers:  # both are the operator's choice: any address may be one
            ok &= await deliver(
                client,
                url,
                message_id=f"alert_{alert.id}",
                body=body,
                secret=secret,
                allow=ANYWHERE,
                attempts=self.attempts,
                backoff_s=1.0,
            )
        metrics.ALERT_DELIVERIES.labels("delivered" if ok else "failed").inc()
        await asyncio.to_thread(
            outbox.finish, self.sql, BudgetAlert, alert.id, ok, self.retry_s, "webhook failed"
        )
        return True
