"""POST /v1/responses and its input-token count (gateway/responses/service.py), and the stored
responses' routes (retrieve, or stream a background one's events again; cancel a background one;
delete; input_items). Stored responses are
read by (team, id), so another team's id is a 404 exactly like a missing one.
"""

from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter

from tokenyard.core.openapi import json_body
from tokenyard.gateway.paging import page
from tokenyard.gateway.responses.service import ResponsesService
from tokenyard.gateway.responses.translate import CreateResponse


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
        request: Request,
        responses_api: NamedDependency[ResponsesService],
        response_id: FromPath[str],
        stream: FromQuery[bool] = False,
        starting_after: Annotated[int | None, QueryParameter(ge=0)] = None,
    ) -> Response:
        if stream:  # a streamed background response's events, from where the client left off
            return await responses_api.events(request, response_id, starting_after)
        return _json(await responses_api.retrieve(request, response_id))

    @post("/{response_id:str}/cancel", status_code=200)
    async def cancel(
        self,
        request: Request,
        responses_api: NamedDependency[ResponsesService],
        response_id: FromPath[str],
    ) -> Response[bytes]:
        return _json(await responses_api.cancel(request, response_id))

    @delete("/{response_id:str}", status_code=200)
    async def remove(
        self,
        request: Request,
        responses_api: NamedDependency[ResponsesService],
        response_id: FromPath[str],
    ) -> Response[bytes]:
        await responses_api.delete(request, response_id)
        return _json({"id": response_id, "object": "response", "deleted": True})

    @get("/{response_id:str}/input_items")
    async def input_items(
        self,
        request: Request,
        responses_api: NamedDependency[ResponsesService],
        response_id: FromPath[str],
        limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        after: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        items = await responses_api.context(request, response_id)
        missing = f"no input item {after!r} in this response"
        return _json(page(items, limit, order, after, missing))
