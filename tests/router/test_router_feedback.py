"""`POST /v1/feedback` against a real gateway: team-scoped, stored beside the usage record with
the router's view of the prompt and the model that served it; the route's confidence in a header
and a metric; the stored rows read back at the score the router gave."""

from typing import Any

import httpx
import sqlmodel

from tests.gateway.conftest import MODEL, wait_until
from tokenyard.billing.feedback import feedback_rows
from tokenyard.billing.models import RouteFeedback, UsageRecord
from tokenyard.router.classifier import ComplexityClassifier
from tokenyard.router.features import decode_features, ratings


def _chat(gateway: Any, key: str, model: str, text: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {key}"}
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply


def _rate(gateway: Any, key: str, body: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(gateway.url + "/v1/feedback", json=body, headers=headers)


def _recorded(sql: Any, request_id: str) -> UsageRecord | None:
    with sqlmodel.Session(sql) as session:
        return session.exec(
            sqlmodel.select(UsageRecord).where(UsageRecord.request_id == request_id)
        ).first()


def test_feedback_is_team_scoped_and_stored_with_the_route(
    gateway: Any, team: Any, sql: Any
) -> None:
    _, key = team()
    _, other_key = team()
    prompt = "Prove that the square root of 2 is irrational, step by step."
    auto = _chat(gateway, key, "auto", prompt)
    confidence = float(auto.headers["x-tokenyard-route-confidence"])
    assert 0.0 <= confidence <= 1.0
    request_id = auto.headers["x-request-id"]
    wait_until(lambda: _recorded(sql, request_id) is not None, 10, "usage recorded")
    record = _recorded(sql, request_id)
    assert record is not None and record.route_features is not None
    clf = ComplexityClassifier.load()
    version, decision, projected, _, code = decode_features(record.route_features)
    assert version == clf.version and decision == auto.headers["x-tokenyard-route"]
    assert abs(projected - clf.route_score(prompt).projected).max() < 1e-2 and code == 0.0

    # another team's request is answered exactly as a missing one
    missing = _rate(gateway, other_key, {"request_id": "nope", "score": 0.5})
    foreign = _rate(gateway, other_key, {"request_id": request_id, "score": 0.5})
    assert missing.status_code == foreign.status_code == 404
    assert missing.json()["error"]["code"] == foreign.json()["error"]["code"]
    for bad in (
        {"request_id": request_id, "score": 1.5},
        {"request_id": request_id, "score": "high"},
        {"request_id": request_id},
        {"request_id": "", "score": 0.5},
        {"request_id": request_id, "score": 0.5, "extra": 1},
        {"request_id": request_id, "score": 0.5, "comment": "nul\u0000byte"},  # 503 on PostgreSQL
    ):
        assert _rate(gateway, key, bad).status_code == 400, bad
    assert _rate(gateway, "sk-wrong", {"request_id": request_id, "score": 0.5}).status_code == 401

    ok = _rate(gateway, key, {"request_id": request_id, "score": 0.2, "comment": "wrong"})
    assert ok.status_code == 200 and ok.json()["score"] == 0.2
    again = _rate(gateway, key, {"request_id": request_id, "score": 0.9})  # replaces the first
    assert again.status_code == 200
    with sqlmodel.Session(sql) as session:
        rows = session.exec(
            sqlmodel.select(RouteFeedback).where(RouteFeedback.request_id == request_id)
        ).all()
    assert [(r.score, r.comment) for r in rows] == [(0.9, None)]
    served = auto.headers["x-tokenyard-model"]
    rows = feedback_rows(sql)
    assert (record.route_features, served, 0.9) in rows
    # what training reads back: the rated request at the score the router gave it
    rated = ratings(rows, clf)
    mine = [i for i, r in enumerate(rows) if r.features == record.route_features]
    assert rated.model[mine[0]] == served and rated.rating[mine[0]] == 0.9
    again_scored = clf.scorer.score_raw(rated.raw[mine[0]], rated.log_chars[mine[0]], 0.0)
    assert abs(again_scored - float(auto.headers["x-tokenyard-score"])) < 0.02

    # a named model's request has no route features, but can still be rated
    direct = _chat(gateway, key, MODEL, prompt)
    assert "x-tokenyard-route-confidence" not in direct.headers
    metrics = httpx.get(gateway.url + "/metrics").text
    assert "tokenyard_router_confidence_count" in metrics
