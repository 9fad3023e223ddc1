"""How many tokens a prompt is, asked before sending it: the walk behind Anthropic's
`POST /v1/messages/count_tokens` and OpenAI's `POST /v1/responses/input_tokens`, for any model of
the catalog a team may use (`auto` counts for the model it would route to).

The count is the upstream's own where it has a counting route (the engine's /tokenize, through
the model's chat template and tools; Anthropic's count_tokens; OpenAI's input_tokens for a
Responses request), else the gateway's estimate, the one its quotas reserve with (the prompt's
bytes and the overhead learned for the model and team); `x-tokenyard-token-count` says which.
Counting generates nothing: it is metered as a request (requests per minute, concurrency, a usage
record) with no tokens and no charge."""

from dataclasses import dataclass
from typing import Any

import msgspec

from tokenyard.backends.base import UpstreamCall
from tokenyard.core.errors import GatewayError
from tokenyard.gateway.exchange import RESPONSES_PATH
from tokenyard.gateway.metering import metered
from tokenyard.gateway.proxy import Proxy, refuse_blocked
from tokenyard.gateway.validation import parse
from tokenyard.tenancy.policy import TeamPolicy

SERVED = "tokenyard-token-count"  # what the usage record names as the service that answered


@dataclass
class Count:
    tokens: int
    headers: dict[str, str]  # x-tokenyard-token-count: the upstream's count (exact) or an estimate


def _refusal(status: int, body: bytes) -> GatewayError:
    """An upstream's refusal (OpenAI's error shape) as the gateway's own."""
    try:
        error = msgspec.json.decode(body)["error"]
        return GatewayError(
            status,
            str(error.get("message") or "the model refused to count the request"),
            code=error.get("code"),
            param=error.get("param"),
            kind=error.get("type"),
        )
    except (msgspec.DecodeError, KeyError, TypeError, AttributeError):
        return GatewayError(status, "the model refused to count the request")


async def count_tokens(
    proxy: Proxy,
    policy: TeamPolicy,
    request_id: str,
    chat: dict[str, Any],
    native: dict[str, Any] | None = None,
) -> Count:
    """`chat`: the request as a chat completion; `native`: a Responses request as OpenAI takes
    it, which OpenAI's models count instead."""
    parsed = parse(msgspec.json.encode(chat), "chat")
    refuse_blocked(policy, parsed)
    route, upstream = proxy.pick("chat", policy, parsed, "interactive")
    name = upstream.info.name
    headers = {"x-tenant": policy.team, "x-request-id": request_id}
    tags = policy.deployment_tags  # the prompt goes only where the team's requests may
    if native is not None and upstream.info.provider == "openai":
        encoded = msgspec.json.encode({**native, "model": name})
        call = UpstreamCall(RESPONSES_PATH, encoded, headers, tags=tags)
    else:
        body = {**parsed.body, "model": name}
        encoded = msgspec.json.encode(body)
        call = UpstreamCall("/v1/chat/completions", encoded, headers, tags=tags)
    async with metered(
        proxy.settlement,
        policy,
        request_id,
        model=route.asked,
        served=SERVED,
        end_user=parsed.end_user,
    ) as meter:
        reply = await upstream.count_tokens(call)
        if reply is not None and reply.status != 200:
            raise _refusal(reply.status, reply.body)
        if reply is None:
            tokens = parsed.prompt_tokens + proxy.overhead.extra(name, policy.team)
        else:
            tokens = msgspec.json.decode(reply.body)["input_tokens"]
        meter.status = 200
    headers = meter.headers | {
        "x-tokenyard-model": name,
        "x-tokenyard-token-count": "exact" if reply is not None else "estimate",
    }
    return Count(tokens, headers)
