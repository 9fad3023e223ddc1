"""Amazon Bedrock's Converse API, for any model id, as botocore's `bedrock-runtime` client
(`converse`, `converse_stream`) speaks it. fake_bedrock.py routes POST /model/{modelId}/converse
and /model/{modelId}/converse-stream here once the request's signature holds; this module also
holds what both speak of Bedrock's wire: its refusals and the AWS event-stream frame.

Bodies are read as Bedrock reads them, camelCase: a top-level key the API lacks is refused
(`model`, `stream`, `anthropic_version`), as are a role other than user/assistant, a conversation
that does not start with the user or does not alternate (the strict reading, so a translation that
forgets to merge two turns of one role fails here), empty content, a block setting none or two of
its kinds, blank text, an image that is not base64, a toolUse outside the assistant's turns, a
toolResult outside the user's or answering no toolUse of the turn just before, tool blocks without
`toolConfig`, inferenceConfig's unknown keys or values out of range (more than 4 stopSequences), a
toolChoice naming no tool. Refusals are `{"message"}` with `x-amzn-errortype`.

A reply is `{"output": {"message"}, "stopReason", "usage", "metrics"}`: the text "w0 w1 … " and
with #tool (or a toolChoice of `tool` or `any`) a toolUse of the first tool (or the one named).
A stream is event-stream frames, each payload the event's JSON as is: messageStart,
contentBlockDelta per text piece, contentBlockStop, (#tool: contentBlockStart, toolUse input
deltas, contentBlockStop), messageStop, metadata.

Directives: fake_common's (#status, #retry_after, #times, #first_byte_delay, #delay, #chunks,
#cut, #cached, #written, #tool, #stream_error), from the text blocks of system and messages, and
  #stop=NAME   that stopReason (max_tokens, guardrail_intervened, …) instead of end_turn/tool_use
#cached=K: cacheReadInputTokens K, out of inputTokens (Bedrock's inputTokens leave cache reads
out, as Anthropic's do); #written=K likewise cacheWriteInputTokens. #stream_error=K: after K
events an exception frame (serviceUnavailableException) ends the stream.

Extended thinking, for Anthropic's models alone (a model id naming `anthropic.`), as
`additionalModelRequestFields.thinking`, with fake_anthropic.py's rules and signatures: the reply
starts with a reasoningContent block (streamed as its text deltas, then its signature), and a
reasoningText sent back must carry the signature given for its text.
"""

import asyncio
import base64
import binascii
import re
from typing import Any

import msgspec

from tests.backends.fake_anthropic import THOUGHT, signature
from tests.backends.fake_common import Directives, Send, pace, send_json

EXCEPTIONS = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    429: "ThrottlingException",
    503: "ServiceUnavailableException",
}
INPUT = {"city": "Paris"}
TOOL_USE_ID = "tooluse_fake1"
REQUEST_ID = "fake-request-id"
METRICS = {"latencyMs": 5}
STREAM_TYPE = "application/vnd.amazon.eventstream"

# ConverseRequest's body fields; the last three are newer ones botocore's model also sends
TOP = {"messages", "system", "inferenceConfig", "toolConfig", "guardrailConfig"}
TOP |= {"additionalModelRequestFields", "additionalModelResponseFieldPaths", "promptVariables"}
TOP |= {"requestMetadata", "performanceConfig", "serviceTier", "outputConfig", "projectIdentifier"}
BLOCKS = ("text", "image", "document", "toolUse", "toolResult", "reasoningContent", "cachePoint")
RESULT_BLOCKS = ("text", "json", "image")
SYSTEM_BLOCKS = ("text", "cachePoint")
INFERENCE = {"maxTokens", "temperature", "topP", "stopSequences"}
IMAGE_FORMATS = {"png", "jpeg", "gif", "webp"}
# Bedrock's patterns for tool names and toolUse ids
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_.:-]{1,64}$")
_STOP = re.compile(r"#stop=([a-z_]+)")

NOT_STARTED_BY_USER = (
    "A conversation must start with a user message. Try again with a conversation that starts "
    "with a user message."
)
NOT_ALTERNATING = (
    "A conversation must alternate between user and assistant roles. Make sure the conversation "
    "alternates between user and assistant roles and try again."
)
NO_TOOL_CONFIG = (
    "The toolConfig field must be defined when using toolUse and toolResult content blocks."
)


# ---- Bedrock's wire -----------------------------------------------------------------------------


def refusal(status: int, message: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    """A refusal as Bedrock words it: the status, `{"message"}`, the exception's name."""
    return status, {"message": message}, {"x-amzn-errortype": exception_name(status)}


def exception_name(status: int) -> str:
    fallback = "InternalServerException" if status >= 500 else "AccessDeniedException"
    return EXCEPTIONS.get(status, fallback)


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: a prelude of lengths and its CRC, string headers, the payload,
    the CRC of all of it."""
    encoded = b"".join(
        bytes([len(k)]) + k.encode() + b"\x07" + len(v.encode()).to_bytes(2, "big") + v.encode()
        for k, v in headers.items()
    )
    prelude = (16 + len(encoded) + len(payload)).to_bytes(4, "big") + len(encoded).to_bytes(
        4, "big"
    )
    message = prelude + binascii.crc32(prelude).to_bytes(4, "big") + encoded + payload
    return message + binascii.crc32(message).to_bytes(4, "big")


def error(status: int, message: str) -> dict[str, Any]:
    """The body of a refusal (fake_common's error shape)."""
    return {"message": message}


# ---- reading a request as Bedrock does ----------------------------------------------------------


class Invalid(Exception):
    """Why Bedrock would refuse the body (400 ValidationException)."""


def _texts(blocks: Any) -> list[str]:
    if not isinstance(blocks, list):
        return []
    return [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]


def prompt_text(body: Any) -> str:
    """The text blocks of system and messages; it never raises, as it reads bodies before they
    are checked."""
    if not isinstance(body, dict):
        return ""
    texts = _texts(body.get("system"))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            texts += _texts(message.get("content"))
    return " ".join(texts)


def _constraint(at: str, what: str) -> Invalid:
    """AWS's wording of a value breaking the model's constraints."""
    return Invalid(
        f"1 validation error detected: Value at '{at}' failed to satisfy constraint: {what}"
    )


def _object(value: Any, at: str, known: set[str] | tuple[str, ...] | None = None) -> dict[str, Any]:
    """`value` as a structure: an object naming none but the fields `known`."""
    if not isinstance(value, dict):
        raise _constraint(at, "Member must be an object")
    for name in value:
        if known is not None and name not in known:
            where = f" at '{at}'" if at else ""
            raise Invalid(
                f"Malformed input request: extraneous key [{name}]{where} is not permitted, "
                "please reformat your input and try again."
            )
    return value


def _union(value: Any, at: str, kinds: tuple[str, ...]) -> str:
    """The one kind a union (a content block, a tool choice, …) sets."""
    block = _object(value, at, kinds)
    if len(block) != 1:
        raise _constraint(at, f"Member must set exactly one of [{', '.join(kinds)}]")
    return next(iter(block))


def _string(value: Any, at: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise _constraint(at, "Member must be a non-empty string")
    if pattern is not None and not pattern.match(value):
        raise _constraint(at, f"Member must satisfy regular expression pattern: {pattern.pattern}")
    return value


def _base64(value: Any, at: str) -> None:
    """A blob: botocore sends bytes as base64."""
    try:
        if isinstance(value, str) and value and base64.b64decode(value, validate=True):
            return
    except (binascii.Error, ValueError):
        pass
    raise Invalid(f"Invalid base64 at '{at}': the bytes must be base64-encoded")


def _image(value: Any, at: str) -> None:
    image = _object(value, at, {"format", "source"})
    if image.get("format") not in IMAGE_FORMATS:
        raise _constraint(
            f"{at}.format", "Member must satisfy enum value set: [png, jpeg, gif, webp]"
        )
    source = _object(image.get("source"), f"{at}.source", {"bytes"})
    _base64(source.get("bytes"), f"{at}.source.bytes")


def _document(value: Any, at: str) -> None:
    document = _object(value, at, {"format", "name", "source", "context", "citations"})
    _string(document.get("name"), f"{at}.name")
    kind = _union(
        document.get("source"), f"{at}.source", ("bytes", "s3Location", "text", "content")
    )
    if kind == "bytes":
        _base64(document["source"]["bytes"], f"{at}.source.bytes")


def _tool_result(value: Any, at: str) -> str:
    """A toolResult block's checks; its toolUseId."""
    result = _object(value, at, {"toolUseId", "content", "status"})
    tool_use_id = _string(result.get("toolUseId"), f"{at}.toolUseId", _TOOL_USE_ID)
    content = result.get("content")
    if not isinstance(content, list):
        raise _constraint(f"{at}.content", "Member must not be null")
    for k, part in enumerate(content):
        where = f"{at}.content.{k}"
        kind = _union(part, where, RESULT_BLOCKS)
        if kind == "text" and not isinstance(part["text"], str):
            raise _constraint(f"{where}.text", "Member must be a string")
        if kind == "image":
            _image(part["image"], f"{where}.image")
    if result.get("status", "success") not in ("success", "error"):
        raise _constraint(f"{at}.status", "Member must satisfy enum value set: [success, error]")
    return tool_use_id


def _block(value: Any, at: str, role: str) -> tuple[str, str | None]:
    """A content block's kind, and the toolUseId it uses or answers."""
    kind = _union(value, at, BLOCKS)
    inner = value[kind]
    if kind == "text" and (not isinstance(inner, str) or not inner.strip()):
        raise Invalid(
            f"The text field in the ContentBlock object at {at} is blank. Add text to the text "
            "field, and try again."
        )
    if kind == "image":
        _image(inner, f"{at}.image")
    if kind == "document":
        _document(inner, f"{at}.document")
    if kind == "reasoningContent":
        reasoning = _union(inner, f"{at}.reasoningContent", ("reasoningText", "redactedContent"))
        if reasoning == "reasoningText":
            text = _object(inner["reasoningText"], f"{at}.reasoningContent.reasoningText")
            _string(text.get("text"), f"{at}.reasoningContent.reasoningText.text")
        else:
            _base64(inner["redactedContent"], f"{at}.reasoningContent.redactedContent")
    if kind == "cachePoint":
        _cache_point(inner, f"{at}.cachePoint")
    if kind == "toolUse":
        if role != "assistant":
            raise Invalid(f"{at}: toolUse blocks are allowed in assistant turns only.")
        use = _object(inner, f"{at}.toolUse", {"toolUseId", "name", "input"})
        _string(use.get("name"), f"{at}.toolUse.name", _TOOL_NAME)
        if not isinstance(use.get("input"), dict):
            raise _constraint(f"{at}.toolUse.input", "Member must be an object")
        return kind, _string(use.get("toolUseId"), f"{at}.toolUse.toolUseId", _TOOL_USE_ID)
    if kind == "toolResult":
        if role != "user":
            raise Invalid(f"{at}: toolResult blocks are allowed in user turns only.")
        return kind, _tool_result(inner, f"{at}.toolResult")
    return kind, None


def _cache_point(value: Any, at: str) -> None:
    point = _object(value, at, {"type", "ttl"})
    if point.get("type") != "default":
        raise _constraint(f"{at}.type", "Member must satisfy enum value set: [default]")


def _messages(messages: Any) -> bool:
    """Refuses what Bedrock would in `messages`; whether they hold tool blocks."""
    if not isinstance(messages, list) or not messages:
        raise _constraint("messages", "Member must have length greater than or equal to 1")
    previous_role, tools = None, False
    used: set[str] = set()  # the toolUse ids of the turn just before
    for i, message in enumerate(messages):
        at = f"messages.{i}"
        message = _object(message, at, {"role", "content"})
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _constraint(f"{at}.role", "Member must satisfy enum value set: [user, assistant]")
        if previous_role is None and role != "user":
            raise Invalid(NOT_STARTED_BY_USER)
        if role == previous_role:
            raise Invalid(NOT_ALTERNATING)
        content = message.get("content")
        if not isinstance(content, list) or not content:
            raise Invalid(
                f"The content field in the Message object at {at} is empty. Add a ContentBlock "
                "object to the content field and try again."
            )
        uses: set[str] = set()
        for j, block in enumerate(content):
            kind, tool_use_id = _block(block, f"{at}.content.{j}", role)
            if tool_use_id is not None:
                tools = True
            if kind == "toolUse" and tool_use_id is not None:
                uses.add(tool_use_id)
            if kind == "toolResult" and tool_use_id not in used:
                raise Invalid(
                    f"{at}.content.{j}: the toolResult's toolUseId {tool_use_id} matches no "
                    f"toolUse block of the previous turn (messages.{i - 1})."
                )
        used, previous_role = uses, role
    return tools


def _system(system: Any) -> None:
    if not isinstance(system, list):
        raise _constraint("system", "Member must be a list")
    for j, block in enumerate(system):
        kind = _union(block, f"system.{j}", SYSTEM_BLOCKS)
        if kind == "text":
            _string(block["text"], f"system.{j}.text")
        else:
            _cache_point(block["cachePoint"], f"system.{j}.cachePoint")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _inference(value: Any) -> None:
    config = _object(value, "inferenceConfig", INFERENCE)
    if "maxTokens" in config:
        tokens = config["maxTokens"]
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise _constraint("inferenceConfig.maxTokens", "Member must be an integer >= 1")
    for name in ("temperature", "topP"):
        if name in config and not (_number(config[name]) and 0 <= config[name] <= 1):
            raise _constraint(f"inferenceConfig.{name}", "Member must be a number in [0, 1]")
    stops = config.get("stopSequences", [])
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _constraint("inferenceConfig.stopSequences", "Member must be non-empty strings")
    if len(stops) > 4:
        raise _constraint(
            "inferenceConfig.stopSequences", "Member must have length less than or equal to 4"
        )


def _tool_config(value: Any) -> list[str]:
    """Refuses what Bedrock would in `toolConfig`; the tool names, in order."""
    config = _object(value, "toolConfig", {"tools", "toolChoice"})
    tools = config.get("tools")
    if not isinstance(tools, list) or not tools:
        raise _constraint("toolConfig.tools", "Member must have length greater than or equal to 1")
    names = []
    for i, tool in enumerate(tools):
        at = f"toolConfig.tools.{i}"
        if _union(tool, at, ("toolSpec", "cachePoint")) == "cachePoint":
            _cache_point(tool["cachePoint"], f"{at}.cachePoint")
            continue
        spec = _object(tool["toolSpec"], f"{at}.toolSpec", {"name", "description", "inputSchema"})
        names.append(_string(spec.get("name"), f"{at}.toolSpec.name", _TOOL_NAME))
        if "description" in spec:
            _string(spec["description"], f"{at}.toolSpec.description")
        schema = _object(spec.get("inputSchema"), f"{at}.toolSpec.inputSchema", {"json"})
        if not isinstance(schema.get("json"), dict):
            raise _constraint(f"{at}.toolSpec.inputSchema.json", "Member must be an object")
    if "toolChoice" in config:
        choice = config["toolChoice"]
        kind = _union(choice, "toolConfig.toolChoice", ("auto", "any", "tool"))
        chosen = _object(choice[kind], f"toolConfig.toolChoice.{kind}")
        if kind == "tool" and chosen.get("name") not in names:
            raise Invalid(
                f"The tool {chosen.get('name')} named by toolConfig.toolChoice is not among "
                "toolConfig.tools."
            )
    return names


def check(body: Any) -> list[str]:
    """Refuses (Invalid) what Bedrock would in a Converse body; the tool names offered."""
    if not isinstance(body, dict):
        raise Invalid("Malformed input request, please reformat your input and try again.")
    _object(body, "", TOP)
    uses_tools = _messages(body.get("messages"))
    if "system" in body:
        _system(body["system"])
    if "inferenceConfig" in body:
        _inference(body["inferenceConfig"])
    tools = _tool_config(body["toolConfig"]) if "toolConfig" in body else []
    if uses_tools and "toolConfig" not in body:
        raise Invalid(NO_TOOL_CONFIG)
    for name in ("guardrailConfig", "additionalModelRequestFields", "promptVariables"):
        if name in body:
            _object(body[name], name)
    paths = body.get("additionalModelResponseFieldPaths", [])
    if not isinstance(paths, list) or len(paths) > 10 or not all(isinstance(p, str) for p in paths):
        raise _constraint("additionalModelResponseFieldPaths", "Member must be at most 10 strings")
    metadata = body.get("requestMetadata", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _constraint("requestMetadata", "Member must map strings to strings")
    if "performanceConfig" in body:
        latency = _object(body["performanceConfig"], "performanceConfig", {"latency"})
        if latency.get("latency", "standard") not in ("standard", "optimized"):
            raise _constraint(
                "performanceConfig.latency",
                "Member must satisfy enum value set: [standard, optimized]",
            )
    return tools


def _thinks(body: dict[str, Any], path: str) -> bool:
    """Whether the request asks Claude to think (refusing it as Bedrock would where the model is
    not Claude or Anthropic's rules are broken); a reasoning block sent back must be signed."""
    for i, message in enumerate(body["messages"]):
        for j, block in enumerate(message["content"]):
            text = (block.get("reasoningContent") or {}).get("reasoningText")
            if text is not None and text.get("signature") != signature(str(text.get("text"))):
                raise Invalid(f"messages.{i}.content.{j}: Invalid signature in reasoningContent")
    thinking = (body.get("additionalModelRequestFields") or {}).get("thinking")
    if thinking is None:
        return False
    if "anthropic." not in path:
        raise Invalid("The model returned the following errors: extraneous key [thinking]")
    config = body.get("inferenceConfig") or {}
    if thinking.get("type") != "adaptive":
        budget = thinking.get("budget_tokens")
        if thinking.get("type") != "enabled" or not isinstance(budget, int) or budget < 1024:
            raise Invalid("thinking.enabled.budget_tokens: Input should be at least 1024")
        if budget >= config.get("maxTokens", 0):
            raise Invalid("`max_tokens` must be greater than `thinking.budget_tokens`")
    if config.get("temperature", 1) != 1:
        raise Invalid("`temperature` may only be set to 1 when thinking is enabled")
    last = next((m for m in reversed(body["messages"]) if m["role"] == "assistant"), None)
    blocks = last["content"] if last is not None else []
    if any("toolUse" in b for b in blocks) and "reasoningContent" not in blocks[0]:
        raise Invalid(
            "Expected `thinking` or `redacted_thinking`: with thinking on, a final assistant "
            "turn that used a tool must start with its thinking block."
        )
    return True


# ---- answering ----------------------------------------------------------------------------------


def _usage(words: int, d: Directives, output: int) -> dict[str, Any]:
    cached = min(d.cached, words)
    written = min(d.written, words - cached)
    usage = {"inputTokens": words - cached - written, "outputTokens": output}
    usage["totalTokens"] = words + output  # Bedrock's total counts the cache's tokens too
    if cached or written:
        usage |= {"cacheReadInputTokens": cached, "cacheWriteInputTokens": written}
    return usage


def _event(name: str, payload: dict[str, Any]) -> bytes:
    """A Converse stream event: the payload is the event's JSON itself (not base64 in `bytes`, as
    invoke-with-response-stream wraps it)."""
    headers = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
    return frame(headers, msgspec.json.encode(payload))


def _exception(name: str, message: str) -> bytes:
    headers = {":exception-type": name, ":content-type": "application/json"}
    return frame(
        headers | {":message-type": "exception"}, msgspec.json.encode({"message": message})
    )


def _events(
    pieces: list[str], tool: str | None, stop: str, usage: dict[str, Any], thinks: bool
) -> list[bytes]:
    events = [_event("messageStart", {"role": "assistant"})]
    index = 0
    if thinks:  # opened by its first delta, as a text block is
        parts = [{"text": part} for part in THOUGHT.partition("; ")]
        for part in [*parts, {"signature": signature(THOUGHT)}]:
            delta = {"contentBlockIndex": index, "delta": {"reasoningContent": part}}
            events.append(_event("contentBlockDelta", delta))
        events.append(_event("contentBlockStop", {"contentBlockIndex": index}))
        index += 1
    if pieces:  # Bedrock opens a text block with its first delta: no contentBlockStart
        for piece in pieces:
            delta = {"contentBlockIndex": index, "delta": {"text": piece}}
            events.append(_event("contentBlockDelta", delta))
        events.append(_event("contentBlockStop", {"contentBlockIndex": index}))
        index += 1
    if tool is not None:
        start = {"toolUse": {"toolUseId": TOOL_USE_ID, "name": tool}}
        events.append(_event("contentBlockStart", {"contentBlockIndex": index, "start": start}))
        for part in ('{"city": ', '"Paris"}'):  # the input arrives as pieces of a JSON string
            delta = {"contentBlockIndex": index, "delta": {"toolUse": {"input": part}}}
            events.append(_event("contentBlockDelta", delta))
        events.append(_event("contentBlockStop", {"contentBlockIndex": index}))
    events.append(_event("messageStop", {"stopReason": stop}))
    events.append(_event("metadata", {"usage": usage, "metrics": METRICS}))
    return events


async def handle(path: str, body: Any, headers: dict[str, str], d: Directives, send: Send) -> None:
    """Answers a Converse request (`path` ends in /converse or /converse-stream)."""
    try:
        tools = check(body)
        thinks = _thinks(body, path)  # the path names the model
    except Invalid as why:
        return await send_json(send, *refusal(400, str(why)))
    text = prompt_text(body)
    named = _STOP.findall(text)
    # a toolChoice of `tool` or `any` makes the model call one, as Bedrock's models must
    choice = ((body.get("toolConfig") or {}).get("toolChoice")) or {}
    forced = (choice.get("tool") or {}).get("name") or (tools[0] if "any" in choice else None)
    tool = forced or (tools[0] if d.tool and tools else None)
    stop = named[-1] if named else "tool_use" if tool else "end_turn"
    pieces = [f"w{i} " for i in range(d.chunks)]
    usage = _usage(len(text.split()), d, d.chunks + (len(THOUGHT.split()) if thinks else 0))
    if not path.endswith("/converse-stream"):
        if d.delay:
            await asyncio.sleep(d.delay)
        content: list[dict[str, Any]] = [{"text": "".join(pieces)}] if pieces else []
        if thinks:
            thought = {"text": THOUGHT, "signature": signature(THOUGHT)}
            content.insert(0, {"reasoningContent": {"reasoningText": thought}})
        if tool is not None:
            content.append({"toolUse": {"toolUseId": TOOL_USE_ID, "name": tool, "input": INPUT}})
        reply = {"output": {"message": {"role": "assistant", "content": content}}}
        reply |= {"stopReason": stop, "usage": usage, "metrics": METRICS}
        return await send_json(send, 200, reply, {"x-amzn-requestid": REQUEST_ID})
    events = _events(pieces, tool, stop, usage, thinks)
    if d.stream_error is not None:
        failure = _exception("serviceUnavailableException", "The service is unavailable.")
        events = [*events[: d.stream_error], failure]
    kind = [(b"content-type", STREAM_TYPE.encode()), (b"x-amzn-requestid", REQUEST_ID.encode())]
    await send({"type": "http.response.start", "status": 200, "headers": kind})
    for sent, event in enumerate(events):
        await pace(d, sent)
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
