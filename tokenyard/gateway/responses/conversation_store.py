"""Conversations in SQL, always read by (team, id): another team's conversation is a missing one.
A conversation's items are kept in the order they were added; deleting a conversation deletes
them too."""

import asyncio
import time
from typing import Any

import msgspec
from sqlalchemy import Engine, delete
from sqlmodel import Session, col, select

from tokenyard.core.db import matchable
from tokenyard.core.errors import GatewayError
from tokenyard.core.ids import new_id
from tokenyard.gateway.responses.models import Conversation, ConversationItem


def missing_conversation(conversation_id: str, param: str = "conversation_id") -> GatewayError:
    """Another team's conversation is answered exactly like one that does not exist."""
    return GatewayError(
        404, f"no conversation with id {conversation_id!r}", code="not_found", param=param
    )


def conversation_object(row: Conversation) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "conversation",
        "created_at": row.created_at,
        "metadata": row.labels or {},
    }


class ConversationStore:
    def __init__(self, sql: Engine) -> None:
        self.sql = sql

    async def create(
        self, team: str, labels: dict[str, str] | None, items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self._create, team, labels, items)

    async def get(self, team: str, conversation_id: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._get, team, conversation_id)

    async def relabel(
        self, team: str, conversation_id: str, labels: dict[str, str]
    ) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._relabel, team, conversation_id, labels)

    async def delete(self, team: str, conversation_id: str) -> bool:
        return await asyncio.to_thread(self._delete, team, conversation_id)

    async def add(self, team: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """Append `items` (ids set); False when the team has no such conversation."""
        return await asyncio.to_thread(self._add, team, conversation_id, items)

    async def items(self, team: str, conversation_id: str) -> list[dict[str, Any]] | None:
        """Every item, oldest first; None when the team has no such conversation."""
        return await asyncio.to_thread(self._items, team, conversation_id)

    async def item(
        self, team: str, conversation_id: str, item_id: str
    ) -> tuple[bool, dict[str, Any] | None]:
        """(whether the team has the conversation, the item or None)."""
        return await asyncio.to_thread(self._item, team, conversation_id, item_id)

    async def delete_item(
        self, team: str, conversation_id: str, item_id: str
    ) -> tuple[dict[str, Any] | None, bool]:
        """(the conversation, whether the item was there to delete)."""
        return await asyncio.to_thread(self._delete_item, team, conversation_id, item_id)

    def _row(self, session: Session, team: str, conversation_id: str) -> Conversation | None:
        if not matchable(conversation_id):
            return None
        query = select(Conversation).where(
            Conversation.id == conversation_id, Conversation.team == team
        )
        return session.exec(query).first()

    @staticmethod
    def _append(session: Session, conversation_id: str, items: list[dict[str, Any]]) -> None:
        for item in items:
            kept = ConversationItem(
                conversation_id=conversation_id, item_id=item["id"], item=msgspec.json.encode(item)
            )
            session.add(kept)

    def _create(
        self, team: str, labels: dict[str, str] | None, items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        row = Conversation(
            id=new_id("conv"), team=team, created_at=int(time.time()), labels=labels or None
        )
        with Session(self.sql) as session:
            session.add(row)
            self._append(session, row.id, items)
            session.commit()
            return conversation_object(row)

    def _get(self, team: str, conversation_id: str) -> dict[str, Any] | None:
        with Session(self.sql) as session:
            row = self._row(session, team, conversation_id)
            return None if row is None else conversation_object(row)

    def _relabel(
        self, team: str, conversation_id: str, labels: dict[str, str]
    ) -> dict[str, Any] | None:
        with Session(self.sql) as session:
            row = self._row(session, team, conversation_id)
            if row is None:
                return None
            row.labels = labels or None
            session.add(row)
            session.commit()
            session.refresh(row)
            return conversation_object(row)

    def _delete(self, team: str, conversation_id: str) -> bool:
        with Session(self.sql) as session:
            row = self._row(session, team, conversation_id)
            if row is None:
                return False
            session.exec(
                delete(ConversationItem).where(  # type: ignore[call-overload]
                    col(ConversationItem.conversation_id) == conversation_id
                )
            )
            session.delete(row)
            session.commit()
            return True

    def _add(self, team: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        with Session(self.sql) as session:
            if self._row(session, team, conversation_id) is None:
                return False
            self._append(session, conversation_id, items)
            session.commit()
            return True

    def _items(self, team: str, conversation_id: str) -> list[dict[str, Any]] | None:
        with Session(self.sql) as session:
            if self._row(session, team, conversation_id) is None:
                return None
            query = (
                select(ConversationItem)
                .where(ConversationItem.conversation_id == conversation_id)
                .order_by(col(ConversationItem.seq))
            )
            return [msgspec.json.decode(row.item) for row in session.exec(query)]

    def _item(
        self, team: str, conversation_id: str, item_id: str
    ) -> tuple[bool, dict[str, Any] | None]:
        with Session(self.sql) as session:
            if self._row(session, team, conversation_id) is None:
                return False, None
            if not matchable(item_id):
                return True, None
            query = select(ConversationItem).where(
                ConversationItem.conversation_id == conversation_id,
                ConversationItem.item_id == item_id,
            )
            row = session.exec(query).first()
            return True, None if row is None else msgspec.json.decode(row.item)

    def _delete_item(
        self, team: str, conversation_id: str, item_id: str
    ) -> tuple[dict[str, Any] | None, bool]:
        with Session(self.sql) as session:
            row = self._row(session, team, conversation_id)
            if row is None:
                return None, False
            gone = False
            if matchable(item_id):
                query = select(ConversationItem).where(
                    ConversationItem.conversation_id == conversation_id,
                    ConversationItem.item_id == item_id,
                )
                for item in session.exec(query):
                    session.delete(item)
                    gone = True
            session.commit()
            return conversation_object(row), gone
