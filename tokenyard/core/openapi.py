"""The OpenAPI documents of the gateway and the engine: Litestar generates them, served as JSON only
at /schema/openapi.json (no interactive docs page: those load their assets from the internet).

The completion and batch routes read their raw body (decoded once with msgspec, for speed), so
Litestar sees no body parameter to describe; `json_body` documents such a route's body with the
JSON schema of the msgspec struct the handler decodes it into.
"""

from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import msgspec
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, Operation, SecurityScheme

BEARER = "team_key"


def openapi_config(title: str, *, bearer: bool) -> OpenAPIConfig:
    """`bearer`: the API takes a team key as `Authorization: Bearer …`."""
    schemes = {BEARER: SecurityScheme(type="http", scheme="bearer")} if bearer else None
    return OpenAPIConfig(
        title=title,
        version=version("tokenyard"),
        path="/schema",
        render_plugins=[JsonRenderPlugin()],
        components=Components(security_schemes=schemes),
        security=[{BEARER: []}] if bearer else None,
    )


def body_operation(media_type: str, schema: dict[str, Any]) -> type[Operation]:
    """An operation class (Litestar's `operation_class=`) whose request body is `schema`."""
    body = {"required": True, "content": {media_type: {"schema": schema}}}

    @dataclass
    class BodyOperation(Operation):
        def to_schema(self) -> dict[str, Any]:
            return {**super().to_schema(), "requestBody": body}

    return BodyOperation


def json_body(struct: type[msgspec.Struct]) -> type[Operation]:
    """An operation class documenting a JSON body decoded into `struct`."""
    return body_operation("application/json", _inline(msgspec.json.schema(struct)))


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """msgspec's schema with each `$defs` reference replaced by its definition: within an OpenAPI
    document `#/…` points at the document's root, so an operation cannot carry its own `$defs`."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].removeprefix("#/$defs/")])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(value) for value in node]
        return node

    return resolve(schema)
