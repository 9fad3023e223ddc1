"""POST /v1/responses and its input-token count (gateway/responses/service.py), and the stored
responses' routes (retrieve, delete, input_items). Stored responses are read by (team, id), so
another team's id is a 404 exactly like a missing one.
"""

from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter

from tokenyard.core.openapi import json_body
from tokenyard.gateway.paging import page
from tokenyard.gateway.responses.service import ResponsesService, stored
from tokenyard.gateway.responses.store import ResponseStore
from tokenyard.gateway.responses.translate import CreateResponse
from tokenyard.tenancy.policy import TeamPolicy


def _json(data: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(data), media_type="application/json")


class ResponsesController(Controller):
    path = "/v1/responses"

    @post("", status_code=200, operation_class=json_body(CreateResponse))
    async def create(
        self, request: Request, responses_api: NamedDependency[ResponsesService]
    ) -> Response:
        return await responses_api.create(request)

    @post("/input_tokens", status_code=200, operation_class=json_body(CreateResponse))
    async def input_tokens(
        self, request: Request, responses_api: NamedDependency[ResponsesService]
    ) -> Response[bytes]:
        return await responses_api.input_tokens(request)

    @get("/{response_id:str}")
    async def retrieve(
        self,
        responses: NamedDependency[ResponseStore],
        caller: NamedDependency[TeamPolicy],
        response_id: FromPath[str],
    ) -> Response[bytes]:
        return _json((await stored(responses, caller.team, response_id)).response)

    @delete("/{response_id:str}", status_code=200)
    async def remove(
        self,
        responses: NamedDependency[ResponseStore],
        caller: NamedDependency[TeamPolicy],
        response_id: FromPath[str],
    ) -> Response[bytes]:
        if not await responses.delete(caller.team, response_id):
            await stored(responses, caller.team, response_id)  # the same 404 as a retrieve
        return _json({"id": response_id, "object": "response", "deleted": True})

    @get("/{response_id:str}/input_items")
    async def input_items(
        self,
        responses: NamedDependency[ResponseStore],
        caller: NamedDependency[TeamPolicy],
        response_id: FromPath[str],
        limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        after: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        items = (await stored(responses, caller.team, response_id)).context
        missing = f"no input item {after!r} in this response"
        return _json(page(items, limit, order, after, missing))
