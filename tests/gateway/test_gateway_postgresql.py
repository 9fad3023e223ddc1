"""A gateway on PostgreSQL, given identifiers holding NUL (a character PostgreSQL's text can
neither store nor compare, so each such lookup was a failed query: a 500 or a 503): every one is
answered as a thing that does not exist, or refused as bad input, never a 5xx."""

import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.conftest import Gateway
from tokenyard.core.db import get_engine
from tokenyard.tenancy import keys, teams

ADMIN_KEY = "admin-" + uuid.uuid4().hex


def test_identifiers_holding_nul_are_not_found_or_refused(
    postgres: Any, base_env: dict[str, str], tmp_path: Path
) -> None:
    url = postgres.new_database()
    gw = Gateway(
        {**base_env, "TOKENYARD_ADMIN_KEY": ADMIN_KEY, "TOKENYARD_DATABASE_URL": url},
        tmp_path / "gateway.log",
    )
    try:
        sql = get_engine(url)
        teams.create_team(sql, "nul")
        key = keys.create_key(sql, "nul").key
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        team = {"authorization": f"Bearer {key}"}
        expected = [
            ("GET", "/v1/admin/teams/a%00b", admin, None, 404),
            ("PATCH", "/v1/admin/teams/a%00b", admin, {"rpm": 1}, 404),
            ("GET", "/v1/admin/keys/ty-%00", admin, None, 404),
            ("PATCH", "/v1/admin/keys/ty-%00", admin, {"name": "x"}, 404),
            ("POST", "/v1/admin/keys/ty-%00/revoke", admin, None, 404),
            ("POST", "/v1/admin/keys/ty-%00/rotate", admin, None, 404),
            ("POST", "/v1/admin/keys", admin, {"team": "a\u0000"}, 404),
            ("GET", "/v1/admin/keys?team=a%00", admin, None, 200),
            ("GET", "/v1/admin/usage?team=a%00", admin, None, 200),
            ("GET", "/v1/responses/resp_%00", team, None, 404),
            ("DELETE", "/v1/responses/resp_%00", team, None, 404),
            ("GET", "/v1/chat/completions/c%00", team, None, 404),
            ("DELETE", "/v1/chat/completions/c%00", team, None, 404),
            ("GET", "/v1/chat/completions/c%00/messages", team, None, 404),
            ("POST", "/v1/chat/completions/c", team, {"metadata": {"k": "\u0000"}}, 400),
            ("GET", "/v1/chat/completions?metadata[k]=%00&model=m%00", team, None, 200),
            ("GET", "/v1/chat/completions?after=c%00", team, None, 400),
            ("GET", "/v1/conversations/c%00", team, None, 404),
            ("GET", "/v1/conversations/c%00/items", team, None, 404),
            ("DELETE", "/v1/conversations/c%00/items/i%00", team, None, 404),
            (
                "POST",
                "/v1/responses",
                team,
                {"model": "fake", "input": "x", "conversation": "c\u0000"},
                404,
            ),
            ("POST", "/v1/feedback", team, {"request_id": "r\u0000", "score": 0.5}, 400),
            (
                "POST",
                "/v1/feedback",
                team,
                {"request_id": "r", "score": 0.5, "comment": "\u0000"},
                400,
            ),
        ]
        for method, path, headers, body, status in expected:
            reply = httpx.request(method, gw.url + path, headers=headers, json=body)
            assert reply.status_code == status, (method, path, reply.text)
            if status != 200:
                assert reply.json()["error"]["message"], (method, path)
        listed = httpx.get(gw.url + "/v1/admin/keys?team=a%00", headers=admin).json()
        assert listed["data"] == []
        # a stored chat completion found by its metadata: the JSON path query on PostgreSQL
        ask = {"model": "fake", "messages": [{"role": "user", "content": "hi #chunks=1"}]}
        for label in ("a", "b"):
            body = {**ask, "store": True, "metadata": {"set": label}}
            made = httpx.post(gw.url + "/v1/chat/completions", headers=team, json=body)
            assert made.status_code == 200, made.text
        found = httpx.get(gw.url + "/v1/chat/completions?metadata[set]=b", headers=team).json()
        assert [c["metadata"] for c in found["data"]] == [{"set": "b"}]
    finally:
        gw.stop()
