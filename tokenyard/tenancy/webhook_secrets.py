"""Each team's key for signing the webhooks it receives, batch callbacks and budget alerts
(Standard Webhooks: `whsec_` + base64 of 32 random bytes), in the team's SQL row. Made on first
use; rotating replaces it at once."""

import base64
import secrets

from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from tokenyard.tenancy.models import Team


def _new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def team_secret(engine: Engine, team: str) -> str | None:
    """The team's secret, made if it has none; None: no such team."""
    with Session(engine) as session:
        secret = session.exec(select(Team.webhook_secret).where(Team.name == team)).first()
        if secret is None:
            # only where none is set yet: two first uses at once end up with the same one
            session.exec(
                update(Team)  # type: ignore[call-overload]
                .where(col(Team.name) == team, col(Team.webhook_secret).is_(None))
                .values(webhook_secret=_new_secret())
            )
            session.commit()
            secret = session.exec(select(Team.webhook_secret).where(Team.name == team)).first()
        return secret


def rotate_secret(engine: Engine, team: str) -> str | None:
    """A new secret for the team, in force for every callback from now on; None: no such team."""
    secret = _new_secret()
    with Session(engine) as session:
        took = session.exec(
            update(Team)  # type: ignore[call-overload]
            .where(col(Team.name) == team)
            .values(webhook_secret=secret)
        )
        session.commit()
        return secret if took.rowcount == 1 else None
