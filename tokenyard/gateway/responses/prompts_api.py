"""`/v1/prompts`: a team's reusable prompts for the Responses API's `prompt` (create, new version,
list, retrieve by version, delete). OpenAI manages prompts in its dashboard only; this API is the
gateway's own, in OpenAI's shapes (an object with `id`, `object`, lists under `data`)."""

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery

from tokenyard.core.openapi import json_body
from tokenyard.gateway.responses.prompts import (
    Message,
    PromptStore,
    checked,
    missing_prompt,
    prompt_object,
)
from tokenyard.gateway.validation import convert, decode_json
from tokenyard.tenancy.policy import TeamPolicy


class SavePrompt(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    messages: list[Message]
    description: Annotated[str, msgspec.Meta(max_length=512)] | None = None


def _json(data: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(data), media_type="application/json")


async def _template(request: Request) -> tuple[list[dict[str, str]], str | None]:
    asked = convert(decode_json(await request.body()), SavePrompt)
    return checked(asked.messages), asked.description


class PromptsController(Controller):
    path = "/v1/prompts"

    @post("", status_code=200, operation_class=json_body(SavePrompt))
    async def create(
        self,
        request: Request,
        prompts: NamedDependency[PromptStore],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        messages, description = await _template(request)
        return _json(await prompts.create(caller.team, messages, description))

    @post("/{prompt_id:str}", status_code=200, operation_class=json_body(SavePrompt))
    async def add_version(
        self,
        request: Request,
        prompts: NamedDependency[PromptStore],
        caller: NamedDependency[TeamPolicy],
        prompt_id: FromPath[str],
    ) -> Response[bytes]:
        """A new version, the prompt's latest from now on (earlier ones stay, by number)."""
        messages, description = await _template(request)
        saved = await prompts.add_version(caller.team, prompt_id, messages, description)
        if saved is None:
            raise missing_prompt(prompt_id)
        return _json(saved)

    @get("")
    async def list_prompts(
        self, prompts: NamedDependency[PromptStore], caller: NamedDependency[TeamPolicy]
    ) -> Response[bytes]:
        rows = await prompts.latest(caller.team)
        return _json({"object": "list", "data": [prompt_object(r) for r in rows]})

    @get("/{prompt_id:str}")
    async def retrieve(
        self,
        prompts: NamedDependency[PromptStore],
        caller: NamedDependency[TeamPolicy],
        prompt_id: FromPath[str],
        version: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        row = await prompts.get(caller.team, prompt_id, version)
        if row is None:
            raise missing_prompt(prompt_id)
        return _json(prompt_object(row))

    @get("/{prompt_id:str}/versions")
    async def versions(
        self,
        prompts: NamedDependency[PromptStore],
        caller: NamedDependency[TeamPolicy],
        prompt_id: FromPath[str],
    ) -> Response[bytes]:
        rows = await prompts.versions(caller.team, prompt_id)
        if not rows:
            raise missing_prompt(prompt_id)
        return _json({"object": "list", "data": [prompt_object(r) for r in rows]})

    @delete("/{prompt_id:str}", status_code=200)
    async def remove(
        self,
        prompts: NamedDependency[PromptStore],
        caller: NamedDependency[TeamPolicy],
        prompt_id: FromPath[str],
    ) -> Response[bytes]:
        if not await prompts.delete(caller.team, prompt_id):
            raise missing_prompt(prompt_id)
        return _json({"id": prompt_id, "object": "prompt.deleted", "deleted": True})
