"""POST /v1/moderations, OpenAI's moderation endpoint, answered by the same classifiers that screen
the gateway's traffic; metered like any request (gateway/metering.py: the team's rpm and tpm apply
through the quota script's reserve and settle, and a usage record is written, at no charge).
"""

import math
from typing import Any

import msgspec
from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency

from tokenyard.core.errors import GatewayError
from tokenyard.core.usage import Usage
from tokenyard.gateway import request_ids
from tokenyard.gateway.metering import metered
from tokenyard.gateway.proxy import Proxy
from tokenyard.guard.service import Guard
from tokenyard.guard.taxonomy import HARMFUL, OPENAI_CATEGORIES, PARENT

MAX_INPUTS = 256
MODEL = "tokenyard-guard"  # the name usage records and answers carry


class ModerationRequest(msgspec.Struct, kw_only=True):
    input: str | list[Any]  # a string, strings, or content parts ({"type": "text", "text": ...})
    model: str | None = None


_decoder = msgspec.json.Decoder(ModerationRequest)


def texts_of(request: ModerationRequest) -> list[str]:
    if isinstance(request.input, str):
        return [request.input]
    if not request.input:
        raise GatewayError(400, "input must not be empty", param="input")
    if len(request.input) > MAX_INPUTS:
        raise GatewayError(400, f"input takes at most {MAX_INPUTS} items", param="input")
    out: list[str] = []
    for i, item in enumerate(request.input):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and item.get("type") == "text":
            text = item.get("text")
            if not isinstance(text, str):
                raise GatewayError(400, f"input[{i}].text must be a string", param="input")
            out.append(text)
        elif isinstance(item, dict) and item.get("type") == "image_url":
            raise GatewayError(
                400, "images are not moderated here: text only", param="input", code="unsupported"
            )
        else:
            raise GatewayError(400, f"input[{i}] must be a string or a text part", param="input")
    return out


def result_of(scores: dict[str, float], thresholds: dict[str, float]) -> dict[str, Any]:
    """One input's result, in OpenAI's shape: every category of its taxonomy."""
    category_scores: dict[str, float] = {}
    categories: dict[str, bool] = {}
    harmful = scores.get(HARMFUL)
    gate = harmful is None or harmful >= thresholds.get(HARMFUL, 0.5)
    for name in OPENAI_CATEGORIES:
        head = name if name in scores else PARENT.get(name, name)
        score = float(scores.get(head, 0.0))
        categories[name] = gate and score >= thresholds.get(head, 0.5)
        if harmful is not None:  # at most the harmful head's: how sure it is there is any harm
            score = min(score, harmful)
        category_scores[name] = round(score, 6)
    return {
        "flagged": any(categories.values()),
        "categories": categories,
        "category_scores": category_scores,
        "category_applied_input_types": {name: ["text"] for name in OPENAI_CATEGORIES},
    }


class ModerationsController(Controller):
    path = "/v1"

    @post("/moderations", status_code=200)
    async def moderations(
        self, request: Request, proxy: NamedDependency[Proxy], guard: NamedDependency[Guard | None]
    ) -> Response[bytes]:
        if guard is None:
            raise GatewayError(404, "the safety layer is off on this gateway", code="not_found")
        policy = await proxy.auth.caller(request)
        try:
            parsed = _decoder.decode(await request.body())
        except msgspec.DecodeError as exc:
            raise GatewayError(400, f"invalid request body: {exc}") from None
        texts = texts_of(parsed)
        tokens = sum(math.ceil(len(t.encode("utf-8", "replace")) / 4) for t in texts) or 1
        request_id = request_ids.request_id(request.scope)
        async with metered(
            proxy.settlement,
            policy,
            request_id,
            model=parsed.model or MODEL,
            served=MODEL,
            tokens=tokens,
        ) as meter:
            scores = await guard.moderator.scores(texts)
            body = {
                "id": f"modr-{request_id}",
                "model": guard.moderator.name,
                "results": [result_of(s, guard.defaults) for s in scores],
            }
            meter.usage, meter.status = Usage(prompt_tokens=tokens), 200
        return Response(
            msgspec.json.encode(body), media_type="application/json", headers=meter.headers
        )
