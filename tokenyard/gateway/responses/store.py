"""Stored responses in SQL, always read by (team, id): another team's id is a missing one."""

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import Engine, delete
from sqlmodel import Session, select

from tokenyard.core.db import matchable
from tokenyard.gateway.responses.models import StoredResponse


@dataclass
class Stored:
    response: dict[str, Any]
    context: list[dict[str, Any]]  # the items the response was generated from


class ResponseStore:
    def __init__(self, sql: Engine, retention_days: float) -> None:
        self.sql = sql
        self.retention_s = int(retention_days * 86400)

    async def save(
        self, team: str, response: dict[str, Any], context: list[dict[str, Any]]
    ) -> None:
        await asyncio.to_thread(self._save, team, response, context)

    async def get(self, team: str, response_id: str) -> Stored | None:
        return await asyncio.to_thread(self._get, team, response_id)

    async def delete(self, team: str, response_id: str) -> bool:
        return await asyncio.to_thread(self._delete, team, response_id)

    def _save(self, team: str, response: dict[str, Any], context: list[dict[str, Any]]) -> None:
        now = int(time.time())
        row = StoredResponse(
            id=response["id"],
            team=team,
            created_at=response["created_at"],
            expires_at=now + self.retention_s,
            response=msgspec.json.encode(response),
            context=msgspec.json.encode(context),
        )
        with Session(self.sql) as session:
            # expired rows go as new ones come: no sweeper to run, and the index makes it cheap
            session.exec(delete(StoredResponse).where(StoredResponse.expires_at < now))  # type: ignore[call-overload]
            session.merge(row)  # a background response is stored again as it progresses
            session.commit()

    def _row(self, session: Session, team: str, response_id: str) -> StoredResponse | None:
        if not matchable(response_id):
            return None
        query = select(StoredResponse).where(
            StoredResponse.id == response_id,
            StoredResponse.team == team,
            StoredResponse.expires_at >= int(time.time()),
        )
        return session.exec(query).first()

    def _get(self, team: str, response_id: str) -> Stored | None:
        with Session(self.sql) as session:
            row = self._row(session, team, response_id)
            if row is None:
                return None
            return Stored(msgspec.json.decode(row.response), msgspec.json.decode(row.context))

    def _delete(self, team: str, response_id: str) -> bool:
        with Session(self.sql) as session:
            row = self._row(session, team, response_id)
            if row is None:
                return False
            session.delete(row)
            session.commit()
            return True
