"""Stored chat completions in SQL, always read by (team, id): another team's id is a missing one."""

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from sqlalchemy import Engine, delete
from sqlmodel import Session, col, select

from tokenyard.core.db import matchable
from tokenyard.gateway.chats.models import StoredChat

Order = Literal["asc", "desc"]
# request fields a stored completion repeats, as OpenAI's stored completions do (null: not sent)
ECHOED = (
    "seed",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "tools",
    "tool_choice",
    "response_format",
)


@dataclass
class Query:
    """A list's filters and page: `labels` are metadata pairs that must all match; `after` the id
    of the last completion of the previous page."""

    model: str | None = None
    labels: dict[str, str] | None = None
    after: str | None = None
    limit: int = 20
    order: Order = "asc"


class UnknownAfter(Exception):
    """A page asked after a completion the team does not have."""


def message_items(completion_id: str, messages: list[Any]) -> list[dict[str, Any]]:
    """The request's messages as the messages list gives them: each with an id; a message of
    content parts has its text as `content` and the parts themselves as `content_parts`."""
    items = []
    for i, message in enumerate(messages):
        content = message.get("content")
        parts = content if isinstance(content, list) else None
        if parts is not None:
            texts = [p.get("text") or "" for p in parts if p.get("type") == "text"]
            content = "".join(texts) if texts else None
        item = {
            "id": f"{completion_id}-{i}",
            "role": message.get("role"),
            "content": content,
            "name": message.get("name"),
            "content_parts": parts,
            "refusal": message.get("refusal"),
        }
        for name in ("tool_calls", "tool_call_id"):
            if message.get(name) is not None:
                item[name] = message[name]
        items.append(item)
    return items


def stored_ask(raw: bytes) -> dict[str, Any] | None:
    """The request's body when it asks to be stored, else None (a body that is not a JSON
    object is the walk's to refuse). Only a body that names `store` is decoded here."""
    if b'"store"' not in raw:
        return None
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    return body if isinstance(body, dict) and body.get("store") is True else None


class ChatStore:
    def __init__(self, sql: Engine, retention_days: float) -> None:
        self.sql = sql
        self.retention_s = int(retention_days * 86400)

    async def save(
        self,
        team: str,
        request: dict[str, Any],
        completion: dict[str, Any],
        model: str,
        request_id: str,
    ) -> None:
        """Keep `completion`, made for `request` (the body as the client sent it) by the catalog
        model `model`. A completion already stored under its id (a cached answer replayed) is
        replaced: the id names one completion."""
        labels = request.get("metadata") or None
        kept = {
            **completion,
            "request_id": request_id,
            **{name: request.get(name) for name in ECHOED},
            "input_user": request.get("user"),
        }
        kept.pop("metadata", None)  # the row's labels are the metadata, as updates change them
        for choice in kept.get("choices") or ():  # fields OpenAI always sends, null or not
            choice.setdefault("logprobs", None)
            if isinstance(choice.get("message"), dict):
                choice["message"].setdefault("refusal", None)
        row = StoredChat(
            completion_id=completion["id"],
            team=team,
            model=model,
            created=int(completion.get("created") or time.time()),
            expires_at=int(time.time()) + self.retention_s,
            labels=labels,
            completion=msgspec.json.encode(kept),
            messages=msgspec.json.encode(request.get("messages") or []),
        )
        await asyncio.to_thread(self._save, row)

    async def get(self, team: str, completion_id: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._get, team, completion_id)

    async def page(self, team: str, query: Query) -> tuple[list[dict[str, Any]], bool]:
        """A page of the team's completions, and whether more follow it."""
        return await asyncio.to_thread(self._page, team, query)

    async def relabel(
        self, team: str, completion_id: str, labels: dict[str, str] | None
    ) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._relabel, team, completion_id, labels)

    async def delete(self, team: str, completion_id: str) -> bool:
        return await asyncio.to_thread(self._delete, team, completion_id)

    async def messages(self, team: str, completion_id: str) -> list[dict[str, Any]] | None:
        return await asyncio.to_thread(self._messages, team, completion_id)

    def _save(self, row: StoredChat) -> None:
        with Session(self.sql) as session:
            # expired rows go as new ones come: no sweeper to run, and the index makes it cheap
            session.exec(delete(StoredChat).where(col(StoredChat.expires_at) < int(time.time())))  # type: ignore[call-overload]
            session.exec(
                delete(StoredChat).where(  # type: ignore[call-overload]
                    col(StoredChat.team) == row.team,
                    col(StoredChat.completion_id) == row.completion_id,
                )
            )
            session.add(row)
            session.commit()

    def _row(self, session: Session, team: str, completion_id: str) -> StoredChat | None:
        if not matchable(completion_id):
            return None
        query = select(StoredChat).where(
            StoredChat.team == team,
            StoredChat.completion_id == completion_id,
            StoredChat.expires_at >= int(time.time()),
        )
        return session.exec(query).first()

    def _get(self, team: str, completion_id: str) -> dict[str, Any] | None:
        with Session(self.sql) as session:
            row = self._row(session, team, completion_id)
            return None if row is None else _completion(row)

    def _page(self, team: str, query: Query) -> tuple[list[dict[str, Any]], bool]:
        labels = query.labels or {}
        if not matchable(query.model, *labels, *labels.values()):
            return [], False  # no stored completion holds NUL (see matchable)
        seq = col(StoredChat.seq)
        found = select(StoredChat).where(
            StoredChat.team == team, StoredChat.expires_at >= int(time.time())
        )
        if query.model is not None:
            found = found.where(StoredChat.model == query.model)
        for key, value in labels.items():
            found = found.where(col(StoredChat.labels)[key].as_string() == value)
        with Session(self.sql) as session:
            if query.after is not None:
                anchor = self._row(session, team, query.after)
                if anchor is None:
                    raise UnknownAfter(query.after)
                found = found.where(seq > anchor.seq if query.order == "asc" else seq < anchor.seq)
            found = found.order_by(seq.asc() if query.order == "asc" else seq.desc())
            rows = session.exec(found.limit(query.limit + 1)).all()
            return [_completion(row) for row in rows[: query.limit]], len(rows) > query.limit

    def _relabel(
        self, team: str, completion_id: str, labels: dict[str, str] | None
    ) -> dict[str, Any] | None:
        with Session(self.sql) as session:
            row = self._row(session, team, completion_id)
            if row is None:
                return None
            row.labels = labels or None
            session.add(row)
            session.commit()
            session.refresh(row)
            return _completion(row)

    def _delete(self, team: str, completion_id: str) -> bool:
        with Session(self.sql) as session:
            row = self._row(session, team, completion_id)
            if row is None:
                return False
            session.delete(row)
            session.commit()
            return True

    def _messages(self, team: str, completion_id: str) -> list[dict[str, Any]] | None:
        with Session(self.sql) as session:
            row = self._row(session, team, completion_id)
            if row is None:
                return None
            return message_items(completion_id, msgspec.json.decode(row.messages))


def _completion(row: StoredChat) -> dict[str, Any]:
    completion: dict[str, Any] = msgspec.json.decode(row.completion)
    completion["metadata"] = row.labels or {}
    return completion
