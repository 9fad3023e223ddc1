"""Reusable prompts (the Responses API's `prompt`: an id, a version, variables): a team's templates
in SQL, each version kept, always read by (team, id) so another team's prompt is a missing one.

OpenAI keeps prompts in its dashboard; here a team manages its own through `/v1/prompts`
(gateway/responses/prompts_api.py). A template is a list of messages whose text may hold
`{{name}}` placeholders; a response that names the prompt gets them filled with its `variables`
and placed before its input, as instructions are: not stored with its context, so a follow-up names
the prompt again.
"""

import asyncio
import re
import time
from typing import Any

import msgspec
from sqlalchemy import Engine, delete, func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from tokenyard.core.db import matchable
from tokenyard.core.errors import GatewayError
from tokenyard.core.ids import new_id
from tokenyard.gateway.responses.models import PromptVersion

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
ROLES = ("system", "developer", "user", "assistant")
MAX_MESSAGES = 100
MAX_TEXT = 100_000  # characters of template text in one version
# a save that loses the race for a number lost it to a save that won, so among N saves of one
# prompt at once each needs at most N tries: 5 let the 6th of 8 at once fail on a slow machine
_SAVE_TRIES = 32


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str


def _bad(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, param=param)


def missing_prompt(prompt_id: str, param: str = "prompt_id") -> GatewayError:
    return GatewayError(404, f"no prompt with id {prompt_id!r}", code="not_found", param=param)


def checked(messages: list[Message]) -> list[dict[str, str]]:
    """A template's messages as stored, or a 400 naming the message at fault."""
    if not 1 <= len(messages) <= MAX_MESSAGES:
        raise _bad(f"a prompt has 1 to {MAX_MESSAGES} messages", "messages")
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise _bad(
                f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role"
            )
    if sum(len(m.content) for m in messages) > MAX_TEXT:
        raise _bad(f"a prompt's text is at most {MAX_TEXT} characters", "messages")
    return [{"role": m.role, "content": m.content} for m in messages]


def variables_of(messages: list[dict[str, str]]) -> list[str]:
    """The placeholders a template's messages name, in order of first use."""
    return list(dict.fromkeys(n for m in messages for n in PLACEHOLDER.findall(m["content"])))


def _value(name: str, value: Any) -> str:
    """A variable's text: a string, or an input_text part (other parts have no place in text)."""
    if isinstance(value, str):
        return value
    part = value if isinstance(value, dict) else {}
    if part.get("type") == "input_text" and isinstance(text := part.get("text"), str):
        return text
    raise GatewayError(
        400,
        f"variable {name!r} must be a string or an input_text part",
        code="unsupported_parameter",
        param=f"prompt.variables.{name}",
    )


def rendered(version: PromptVersion, variables: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The version's messages as input items, every placeholder filled; a placeholder without a
    value, or a value no placeholder names (a misspelt name), is a 400."""
    given = variables or {}
    messages = msgspec.json.decode(version.messages)
    needed = set(variables_of(messages))
    if missing := sorted(needed - set(given)):
        raise _bad(f"the prompt needs variables {', '.join(missing)}", "prompt.variables")
    if unknown := sorted(set(given) - needed):
        raise _bad(f"the prompt has no variables {', '.join(unknown)}", "prompt.variables")
    texts = {name: _value(name, value) for name, value in given.items()}
    return [
        {
            "type": "message",
            "role": m["role"],
            "content": [
                {
                    "type": "output_text" if m["role"] == "assistant" else "input_text",
                    "text": PLACEHOLDER.sub(lambda found: texts[found[1]], m["content"]),
                }
            ],
        }
        for m in messages
    ]


def prompt_object(row: PromptVersion) -> dict[str, Any]:
    messages = msgspec.json.decode(row.messages)
    return {
        "id": row.prompt_id,
        "object": "prompt",
        "version": str(row.version),
        "created_at": row.created_at,
        "description": row.description,
        "messages": messages,
        "variables": variables_of(messages),
    }


class PromptStore:
    def __init__(self, sql: Engine) -> None:
        self.sql = sql

    async def create(
        self, team: str, messages: list[dict[str, str]], description: str | None
    ) -> dict[str, Any]:
        saved = await asyncio.to_thread(
            self._save, team, new_id("pmpt"), messages, description, True
        )
        assert saved is not None  # a new prompt always has its first version
        return saved

    async def add_version(
        self, team: str, prompt_id: str, messages: list[dict[str, str]], description: str | None
    ) -> dict[str, Any] | None:
        """A new version of the team's prompt; None where it has none by that id."""
        if not matchable(prompt_id):
            return None
        return await asyncio.to_thread(self._save, team, prompt_id, messages, description, False)

    async def get(
        self, team: str, prompt_id: str, version: str | None = None
    ) -> PromptVersion | None:
        """A version of the team's prompt (its latest by default)."""
        return await asyncio.to_thread(self._get, team, prompt_id, version)

    async def versions(self, team: str, prompt_id: str) -> list[PromptVersion]:
        return await asyncio.to_thread(self._versions, team, prompt_id)

    async def latest(self, team: str) -> list[PromptVersion]:
        """Each of the team's prompts at its latest version, newest first."""
        return await asyncio.to_thread(self._latest, team)

    async def delete(self, team: str, prompt_id: str) -> bool:
        return await asyncio.to_thread(self._delete, team, prompt_id)

    def _save(
        self,
        team: str,
        prompt_id: str,
        messages: list[dict[str, str]],
        description: str | None,
        new: bool,
    ) -> dict[str, Any] | None:
        """Version 1 of a `new` prompt, else the next version of the team's prompt (None: it has
        none by that id), read and written in one transaction."""
        for _ in range(_SAVE_TRIES):
            with Session(self.sql) as session:
                last = session.exec(
                    select(func.max(PromptVersion.version)).where(
                        PromptVersion.team == team, PromptVersion.prompt_id == prompt_id
                    )
                ).one()
                if last is None and not new:
                    return None
                row = PromptVersion(
                    team=team,
                    prompt_id=prompt_id,
                    version=(last or 0) + 1,
                    messages=msgspec.json.encode(messages),
                    description=description,
                    created_at=int(time.time()),
                )
                session.add(row)
                try:
                    session.commit()
                except IntegrityError:  # another version saved at once took the number: the next
                    continue
                session.refresh(row)
                return prompt_object(row)
        raise GatewayError(409, "the prompt is being changed by other requests: try again")

    def _get(self, team: str, prompt_id: str, version: str | None) -> PromptVersion | None:
        if not matchable(prompt_id):
            return None
        query = select(PromptVersion).where(
            PromptVersion.team == team, PromptVersion.prompt_id == prompt_id
        )
        if version is not None:
            if not version.isdigit() or len(version) > 9:  # beyond any version, and SQL's integers
                return None
            query = query.where(PromptVersion.version == int(version))
        with Session(self.sql) as session:
            return session.exec(query.order_by(PromptVersion.version.desc()).limit(1)).first()  # type: ignore[attr-defined]

    def _versions(self, team: str, prompt_id: str) -> list[PromptVersion]:
        if not matchable(prompt_id):
            return []
        query = select(PromptVersion).where(
            PromptVersion.team == team, PromptVersion.prompt_id == prompt_id
        )
        with Session(self.sql) as session:
            return list(session.exec(query.order_by(PromptVersion.version)))  # type: ignore[arg-type]

    def _latest(self, team: str) -> list[PromptVersion]:
        newest = (
            select(PromptVersion.prompt_id, func.max(PromptVersion.version).label("version"))
            .where(PromptVersion.team == team)
            .group_by(PromptVersion.prompt_id)
            .subquery()
        )
        query = (
            select(PromptVersion)
            .join(
                newest,
                (PromptVersion.prompt_id == newest.c.prompt_id)
                & (PromptVersion.version == newest.c.version),
            )
            .where(PromptVersion.team == team)
            .order_by(PromptVersion.created_at.desc(), PromptVersion.prompt_id)  # type: ignore[attr-defined]
        )
        with Session(self.sql) as session:
            return list(session.exec(query))

    def _delete(self, team: str, prompt_id: str) -> bool:
        if not matchable(prompt_id):
            return False
        with Session(self.sql) as session:
            gone = session.exec(  # type: ignore[call-overload]
                delete(PromptVersion).where(
                    PromptVersion.team == team, PromptVersion.prompt_id == prompt_id
                )
            )
            session.commit()
            return bool(gone.rowcount)
