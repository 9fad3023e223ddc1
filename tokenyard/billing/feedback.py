"""Feedback on served requests: `POST /v1/feedback`, stored beside the usage records.

A team rates one of its own requests by the gateway's request id (the `x-request-id` header) with a
score in [0, 1] and an optional comment. A request of another team is answered exactly as a missing
one (404), so a team learns nothing about others' ids. The rating is stored in SQL
(`route_feedback`) beside the usage record, which for model="auto" holds the router's view of the
prompt (`route_features`: the artifact version, the decision, the prompt's projected embedding and
length; never its text).

`tokenyard router train --feedback` reads the rated rows here (`feedback_rows`) and turns them into
training rows and per-model quality curves (router/features.py).
"""

import asyncio
import math
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec
from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, select

from tokenyard.billing.models import RouteFeedback, UsageRecord
from tokenyard.core.db import database_url, get_engine, matchable
from tokenyard.core.errors import GatewayError
from tokenyard.core.settings import Settings
from tokenyard.tenancy.policy import TeamPolicy

MAX_REQUEST_ID = 200
MAX_COMMENT = 2000


class _Body(msgspec.Struct, forbid_unknown_fields=True):
    request_id: str
    score: float
    comment: str | None = None


def _parse(raw: bytes) -> _Body:
    try:
        body = msgspec.json.decode(raw, type=_Body)
    except msgspec.DecodeError as e:
        raise GatewayError(400, f"invalid feedback: {e}") from None
    if not (0 < len(body.request_id) <= MAX_REQUEST_ID and matchable(body.request_id)):
        raise GatewayError(400, "request_id must be a request's x-request-id", param="request_id")
    if not (math.isfinite(body.score) and 0.0 <= body.score <= 1.0):
        raise GatewayError(400, "score must be a number in [0, 1]", param="score")
    if body.comment is not None and len(body.comment) > MAX_COMMENT:
        raise GatewayError(400, f"comment is longer than {MAX_COMMENT} characters", param="comment")
    if body.comment is not None and "\x00" in body.comment:  # PostgreSQL's text refuses it (a 503)
        raise GatewayError(400, "comment must not contain NUL characters", param="comment")
    return body


def _store(engine: Engine, team: str, body: _Body) -> bool:
    """False when the team has no such request (another team's counts as none)."""
    with Session(engine) as session:
        found = session.exec(
            select(UsageRecord.id).where(
                UsageRecord.request_id == body.request_id, UsageRecord.team == team
            )
        ).first()
        if found is None:
            return False
        row = session.exec(
            select(RouteFeedback).where(RouteFeedback.request_id == body.request_id)
        ).first()
        row = row or RouteFeedback(request_id=body.request_id, team=team)
        row.score, row.comment = body.score, body.comment
        row.created_at = datetime.now(UTC)
        session.add(row)
        session.commit()
        return True


class FeedbackController(Controller):
    path = "/v1"

    @post("/feedback", status_code=200)
    async def feedback(
        self,
        request: Request,
        settings: NamedDependency[Settings],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        body = _parse(await request.body())
        engine = get_engine(database_url(settings))
        try:  # a thread: SQL must never block the event loop that serves completions
            stored = await asyncio.to_thread(_store, engine, caller.team, body)
        except SQLAlchemyError:
            raise GatewayError(
                503, "feedback store unavailable", code="feedback_store_unavailable", retry_after=1
            ) from None
        if not stored:
            raise GatewayError(
                404, f"no request {body.request_id!r}", code="request_not_found", param="request_id"
            )
        answer: dict[str, Any] = {"object": "feedback", "request_id": body.request_id}
        answer |= {"score": body.score, "comment": body.comment}
        return Response(msgspec.json.encode(answer), media_type="application/json")


class Rated(NamedTuple):
    features: str  # the usage record's route_features
    model: str  # the model that served the request
    score: float


def feedback_rows(engine: Engine) -> list[Rated]:
    """Every rated auto-routed request: the router's view of it, what served it, the rating."""
    with Session(engine) as session:
        rows = session.exec(
            select(UsageRecord.route_features, UsageRecord.model_served, RouteFeedback.score)
            .join(RouteFeedback, RouteFeedback.request_id == UsageRecord.request_id)
            .where(UsageRecord.route_features.is_not(None))  # type: ignore[union-attr]
        ).all()
    return [Rated(f, m, s) for f, m, s in rows]
