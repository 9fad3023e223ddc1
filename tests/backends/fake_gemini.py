"""A fake Google Gemini API, as the official `google-genai` SDK expects it, at Google's two doors:
- Google AI Studio: POST /v1beta/models/{model}:generateContent, :streamGenerateContent?alt=sse
  and :countTokens, the key in `x-goog-api-key` (without one, 403 PERMISSION_DENIED, as Google
  answers an unregistered caller);
- Vertex AI: POST /v1/projects/{project}/locations/{region}/publishers/google/models/{model}:
  the same three verbs, a Google Cloud access token in `Authorization: Bearer` (without one, 401).

Bodies are read as strictly as Google's proto JSON parser reads them, in camelCase: an unknown
field anywhere is refused ("Unknown name"), as is a value of the wrong type, a part with none or
two of its data fields, a role other than user/model, a functionResponse that answers no
functionCall of the closest previous model turn, `parameters` together with `parametersJsonSchema`,
a schema key OpenAPI's subset lacks (`$schema`, `oneOf`, …) or a numeric enum, a function name
Google's rule refuses, responseSchema with responseJsonSchema or without a JSON mime type,
thinkingBudget with thinkingLevel, more than five stop sequences. For models named gemini-3…,
every functionCall of the history must carry back the thoughtSignature the fake issued (or one of
the placeholders Google documents for histories from elsewhere). `streamGenerateContent` without
`alt=sse` is refused: Google would answer a JSON array, which the fake does not speak. Errors are
Google's `{"error": {"code", "message", "status"}}`; unknown routes 404.

Replies are GenerateContentResponse as Google writes them (camelCase, zero counts omitted, as
proto JSON omits them); streams are `data: {…}\\r\\n\\r\\n` events, one text piece or one whole
functionCall each, every one with the usage so far, the last with the finish reasons.

Directives, besides fake_common's (#status, #retry_after, #times, #first_byte_delay, #delay,
#chunks, #cut, #cached, #tool, #stream_error):
  #thoughts=K   a first thought part ("thought": true) and thoughtsTokenCount K
  #finish=NAME  that finishReason (SAFETY, MAX_TOKENS, …) instead of STOP
  #blocked      no candidates: promptFeedback.blockReason SAFETY, status 200 (one event streamed)
#tool calls the first declared function with {"city": "Paris"}, its thoughtSignature the base64 of
"sig-<name>" (no id: the Gemini API gives none; finishReason stays STOP). #stream_error=K: after K
events, an error event (503 UNAVAILABLE) ends the stream. generationConfig.responseLogprobs: each
candidate carries logprobsResult (top `logprobs` alternatives, default 1) and avgLogprobs.

GET /stats adds `cloud` ("studio"/"vertex"), `model`, `verb`, `key`, `token`, `project`, `region`
and `query` (the last request's) to fake_common's figures.

Run: python tests/backends/fake_gemini.py --port P
"""

import asyncio
import base64
import binascii
import re
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import msgspec

if not __package__:  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.backends.fake_common import (
    Directives,
    Send,
    main,
    make_asgi,
    pace,
    send_json,
    stats_with,
)

STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}
STATUSES |= {404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
STATUSES |= {504: "DEADLINE_EXCEEDED"}
ARGS = {"city": "Paris"}
RESPONSE_ID = "fake-response"
VERBS = "generateContent|streamGenerateContent|countTokens|batchEmbedContents|predict"
_STUDIO = re.compile(rf"^/v1beta/models/([^/:]+):({VERBS})$")
_VERTEX = re.compile(
    rf"^/v1/projects/([^/]+)/locations/([^/]+)/publishers/google/models/([^/:]+):({VERBS})$"
)
_MORE = re.compile(r"#thoughts=(\d+)|#finish=([A-Za-z_]+)|#(blocked)\b")
# Google's rule for function names (the API refuses others)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")
# what Google's docs offer for a history whose calls no Gemini 3 model signed
PLACEHOLDERS = {"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"}

# the make_asgi handler sees only the path: the wrapping app hands it the query string this way
# (a context variable: one per request's task, so concurrent requests do not mix them up)
_QUERY: ContextVar[str] = ContextVar("query", default="")

# GenerateContentRequest's fields (Vertex's also takes `labels`)
REQUEST = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"}
REQUEST |= {"safetySettings", "cachedContent"}
DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse")
PART = {*DATA, "thought", "thoughtSignature"}
# generationConfig's fields: the proto JSON type each must have
GENERATION = {
    "temperature": "TYPE_FLOAT",
    "topP": "TYPE_FLOAT",
    "topK": "TYPE_INT32",
    "maxOutputTokens": "TYPE_INT32",
    "candidateCount": "TYPE_INT32",
    "stopSequences": "TYPE_STRING[]",
    "seed": "TYPE_INT32",
    "presencePenalty": "TYPE_FLOAT",
    "frequencyPenalty": "TYPE_FLOAT",
    "responseMimeType": "TYPE_STRING",
    "responseSchema": "TYPE_MESSAGE",
    "responseJsonSchema": "TYPE_VALUE",
    "responseLogprobs": "TYPE_BOOL",
    "logprobs": "TYPE_INT32",
    "thinkingConfig": "TYPE_MESSAGE",
}
THINKING = {"thinkingBudget": "TYPE_INT32", "thinkingLevel": "TYPE_ENUM"}
THINKING |= {"includeThoughts": "TYPE_BOOL"}
# enum values: Google reads them in any case (its own docs write "type": "object", "low")
LEVELS = {"MINIMAL", "LOW", "MEDIUM", "HIGH"}
MODES = {"AUTO", "ANY", "NONE", "VALIDATED"}
# the OpenAPI subset Google's Schema message holds (the SDK's types.Schema): JSON Schema's other
# keywords belong in parametersJsonSchema / responseJsonSchema
SCHEMA = {"type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems"}
SCHEMA |= {"properties", "required", "minProperties", "maxProperties", "minLength", "maxLength"}
SCHEMA |= {"pattern", "example", "anyOf", "propertyOrdering", "default", "items", "minimum"}
SCHEMA |= {"maximum", "additionalProperties", "defs", "ref"}
# the Schema fields of a fixed type (an OpenAI schema's `"enum": [1, 2]` fails here, as at Google)
SCHEMA_TYPES = {"format": "TYPE_STRING", "title": "TYPE_STRING", "description": "TYPE_STRING"}
SCHEMA_TYPES |= {"nullable": "TYPE_BOOL", "pattern": "TYPE_STRING", "enum": "TYPE_STRING[]"}
SCHEMA_TYPES |= {"required": "TYPE_STRING[]", "propertyOrdering": "TYPE_STRING[]"}
SCHEMA_TYPES |= {"properties": "TYPE_MESSAGE", "defs": "TYPE_MESSAGE", "items": "TYPE_MESSAGE"}
SCHEMA_TYPES |= {"anyOf": "TYPE_MESSAGE[]", "ref": "TYPE_STRING"}
TYPES = {"TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}
SAFETY = {"category", "threshold"}
JSON_TYPES = {"application/json", "text/x.enum"}  # the mime types a response schema allows


AFTER_CALL = (
    "Please ensure that function response turn comes immediately after a function call turn."
)


class Invalid(Exception):
    """Why Google would refuse the body (400 INVALID_ARGUMENT)."""


def _bad(at: str, kind: str, value: Any) -> Invalid:
    """proto JSON's refusal of a value of the wrong type."""
    return Invalid(f"Invalid value at '{at}' ({kind}), {msgspec.json.encode(value).decode()}")


def error(status: int, message: str) -> dict[str, Any]:
    kind = STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
    return {"error": {"code": status, "message": message, "status": kind}}


def _texts(content: Any) -> list[str]:
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return []
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]


def prompt_text(body: Any) -> str:
    """All text of the system instruction and the contents (a countTokens body's too); it never
    raises, as it reads bodies before they are checked."""
    if not isinstance(body, dict):
        return ""
    if isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    if isinstance(body.get("requests"), list) or isinstance(body.get("instances"), list):
        return " ".join(embedded_texts(body))
    texts = _texts(body.get("systemInstruction"))
    contents = body.get("contents")
    for content in contents if isinstance(contents, list) else []:
        texts += _texts(content)
    return " ".join(texts)


def embedded_texts(body: dict[str, Any]) -> list[str]:
    """The texts of an embedding request: AI Studio's batchEmbedContents (`requests[].content`)
    or Vertex AI's predict (`instances[].content`)."""
    if isinstance(body.get("instances"), list):
        return [str(i.get("content", "")) for i in body["instances"] if isinstance(i, dict)]
    asks = [r for r in body.get("requests") or [] if isinstance(r, dict)]
    return [" ".join(_texts(r.get("content"))) for r in asks]


def vector(text: str, size: int) -> list[float]:
    """A made-up embedding, the same for the same text: its words' lengths, cycled and scaled."""
    lengths = [len(w) for w in text.split()] or [0]
    return [round(lengths[i % len(lengths)] / 10 + i / 1000, 4) for i in range(size)]


EMBEDDING_SIZE = 8  # the fake's default outputDimensionality


def embed(body: dict[str, Any], cloud: str, model: str) -> dict[str, Any]:
    """batchEmbedContents (AI Studio) or predict (Vertex AI), checked as Google checks them."""
    if cloud == "vertex":
        _fields(body, {"instances", "parameters"}, "")
        parameters = _fields(
            body.get("parameters") or {}, {"outputDimensionality", "autoTruncate"}, "parameters"
        )
        size = int(parameters.get("outputDimensionality") or EMBEDDING_SIZE)
        instances = body.get("instances")
        if not isinstance(instances, list) or not instances:
            raise Invalid("instances must be a non-empty list")
        predictions = []
        for i, instance in enumerate(instances):
            fields = _fields(instance, {"content", "task_type", "title"}, f"instances[{i}]")
            text = fields.get("content")
            if not isinstance(text, str):
                raise Invalid(f"instances[{i}].content must be a string")
            statistics = {"token_count": len(text.split()), "truncated": False}
            predictions.append(
                {"embeddings": {"values": vector(text, size), "statistics": statistics}}
            )
        return {
            "predictions": predictions,
            "metadata": {"billableCharacterCount": sum(len(t) for t in embedded_texts(body))},
        }
    _fields(body, {"requests"}, "")
    asks = body.get("requests")
    if not isinstance(asks, list) or not asks:
        raise Invalid("requests must be a non-empty list")
    vectors = []
    for i, ask in enumerate(asks):
        known = {"model", "content", "taskType", "title", "outputDimensionality"}
        fields = _fields(ask, known, f"requests[{i}]")
        if fields.get("model") != f"models/{model}":
            raise Invalid(f"requests[{i}].model must be the model of the URL (models/{model})")
        _system(fields.get("content"))  # a Content of text parts
        size = int(fields.get("outputDimensionality") or EMBEDDING_SIZE)
        vectors.append({"values": vector(embedded_texts({"requests": [ask]})[0], size)})
    return {"embeddings": vectors}


@dataclass
class Extra:
    """The directives only this fake reads."""

    thoughts: int = 0
    finish: str = "STOP"
    blocked: bool = False


def extra(text: str) -> Extra:
    found = Extra()
    for thoughts, finish, blocked in _MORE.findall(text):
        if thoughts:
            found.thoughts = int(thoughts)
        if finish:
            found.finish = finish.upper()
        if blocked:
            found.blocked = True
    return found


# ---- reading a request as Google does -----------------------------------------------------------


def _snake(name: str) -> str:
    """A field as Google's error messages name it (the proto's snake_case)."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _unknown(name: str, at: str) -> Invalid:
    where = f" at '{at}'" if at else ""
    return Invalid(
        f'Invalid JSON payload received. Unknown name "{name}"{where}: Cannot find field.'
    )


def _fields(value: Any, known: set[str] | dict[str, str], at: str) -> dict[str, Any]:
    """`value` as a message of the fields `known`: an object naming no others."""
    if not isinstance(value, dict):
        raise _bad(at, "TYPE_MESSAGE", value)
    for name in value:
        if name not in known:
            raise _unknown(name, at)
    return value


def _typed(value: Any, kind: str, at: str) -> None:
    """`value` as proto JSON's `kind` (a whole float counts as an integer, as proto JSON has it)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = {
        "TYPE_FLOAT": number,
        "TYPE_INT32": number and float(value).is_integer(),
        "TYPE_BOOL": isinstance(value, bool),
        "TYPE_STRING": isinstance(value, str),
        "TYPE_ENUM": isinstance(value, str),
        "TYPE_MESSAGE": isinstance(value, dict),
        "TYPE_VALUE": True,
        "TYPE_STRING[]": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "TYPE_MESSAGE[]": isinstance(value, list) and all(isinstance(v, dict) for v in value),
    }[kind]
    if not ok:
        raise _bad(at, kind.removesuffix("[]"), value)


def _bytes(value: Any, at: str) -> bytes:
    """A bytes field: base64, standard or URL-safe, padded or not (proto JSON takes all four)."""
    if isinstance(value, str):
        try:
            normal = value.replace("-", "+").replace("_", "/")
            return base64.b64decode(normal + "=" * (-len(normal) % 4), validate=True)
        except (binascii.Error, ValueError):
            pass
    shown = msgspec.json.encode(value).decode()
    raise Invalid(f"Invalid value at '{at}' (TYPE_BYTES), Base64 decoding failed for {shown}")


def signature(name: str) -> str:
    """The thoughtSignature the fake issues with a call of `name` (Google sends bytes as base64)."""
    return base64.b64encode(f"sig-{name}".encode()).decode()


def _part(part: Any, at: str) -> dict[str, Any]:
    part = _fields(part, PART, at)
    data = [k for k in DATA if k in part]
    if not data or part.get("text") == "":  # an empty string is proto3's unset
        raise Invalid(
            f"* GenerateContentRequest.{at}.data: required oneof field 'data' must have one "
            "initialized field"
        )
    if len(data) > 1:
        raise Invalid(
            f"Invalid value at '{at}.data' (oneof), oneof field 'data' is already set. "
            f"Cannot overwrite with '{_snake(data[1])}'"
        )
    if "text" in part:
        _typed(part["text"], "TYPE_STRING", f"{at}.text")
    if "thought" in part:
        _typed(part["thought"], "TYPE_BOOL", f"{at}.thought")
    if "thoughtSignature" in part:
        _bytes(part["thoughtSignature"], f"{at}.thought_signature")
    if "inlineData" in part:
        inline = _fields(part["inlineData"], {"mimeType", "data"}, f"{at}.inline_data")
        _typed(inline.get("mimeType"), "TYPE_STRING", f"{at}.inline_data.mime_type")
        _bytes(inline.get("data"), f"{at}.inline_data.data")
    if "fileData" in part:
        file = _fields(part["fileData"], {"mimeType", "fileUri"}, f"{at}.file_data")
        _typed(file.get("fileUri"), "TYPE_STRING", f"{at}.file_data.file_uri")
        _typed(file.get("mimeType", ""), "TYPE_STRING", f"{at}.file_data.mime_type")
    for kind, body in (("functionCall", "args"), ("functionResponse", "response")):
        if kind in part:
            where = f"{at}.{_snake(kind)}"
            call = _fields(part[kind], {"name", "id", body}, where)
            if not isinstance(call.get("name"), str) or not call["name"]:
                raise Invalid(f"* GenerateContentRequest.{where}.name: Name cannot be empty.")
            _typed(call.get("id", ""), "TYPE_STRING", f"{where}.id")
            # a response is required; a call's args may be left out (a call of no arguments)
            _typed(
                call.get(body, {} if body == "args" else None), "TYPE_MESSAGE", f"{where}.{body}"
            )
    return part


def _contents(contents: Any, model: str) -> None:
    if not isinstance(contents, list) or not contents:
        raise Invalid("* GenerateContentRequest.contents: contents is not specified")
    calls: list[dict[str, Any]] | None = None  # the functionCalls of the closest model turn
    for i, content in enumerate(contents):
        content = _fields(content, {"role", "parts"}, f"contents[{i}]")
        role = content.get("role", "user")
        if role not in ("user", "model"):
            raise Invalid("Please use a valid role: user, model.")
        parts = content.get("parts", [])
        if not isinstance(parts, list):
            raise _bad(f"contents[{i}].parts", "TYPE_MESSAGE", parts)
        if not parts:
            raise Invalid(
                f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            )
        parts = [_part(p, f"contents[{i}].parts[{j}]") for j, p in enumerate(parts)]
        if role == "model":
            calls = [p["functionCall"] for p in parts if "functionCall" in p]
            if model.startswith("gemini-3"):
                _signed(parts)
            if any("functionResponse" in p for p in parts):
                raise Invalid(f"{AFTER_CALL} (contents[{i}] is the model's)")
            continue
        if any("functionCall" in p for p in parts):
            raise Invalid("Please ensure that function call turns come from the model role.")
        for p in parts:
            if "functionResponse" in p and not _answers(p["functionResponse"], calls or []):
                name = p["functionResponse"]["name"]
                raise Invalid(f"{AFTER_CALL} (contents[{i}] answers `{name}`, never called)")


def _answers(response: dict[str, Any], calls: list[dict[str, Any]]) -> bool:
    """Whether a functionResponse answers one of `calls`: the same name, the same id if both
    carry one."""
    for call in calls:
        ids = (call.get("id"), response.get("id"))
        if call["name"] == response["name"] and (None in ids or ids[0] == ids[1]):
            return True
    return False


def _signed(parts: list[dict[str, Any]]) -> None:
    """Gemini 3 wants each call's thoughtSignature back as it issued it."""
    for p in parts:
        if "functionCall" not in p:
            continue
        given = p.get("thoughtSignature")
        if given is None:
            raise Invalid("Function call is missing a thought_signature in functionCall parts.")
        issued = f"sig-{p['functionCall']['name']}".encode()
        if given not in PLACEHOLDERS and _bytes(given, "thought_signature") != issued:
            raise Invalid("Corrupted thought signature.")


def _system(value: Any) -> None:
    content = _fields(value, {"role", "parts"}, "system_instruction")
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise Invalid("* GenerateContentRequest.system_instruction.parts: must not be empty.")
    for j, part in enumerate(parts):
        _typed(
            _fields(part, {"text"}, f"system_instruction.parts[{j}]").get("text"),
            "TYPE_STRING",
            f"system_instruction.parts[{j}].text",
        )


def _schema(value: Any, at: str) -> None:
    """A Schema message (OpenAPI's subset), its nested schemas too."""
    schema = _fields(value, SCHEMA, at)
    for name, kind in SCHEMA_TYPES.items():
        if name in schema:
            _typed(schema[name], kind, f"{at}.{_snake(name)}")
    kind = schema.get("type")
    if kind is not None and (not isinstance(kind, str) or kind.upper() not in TYPES):
        raise _bad(f"{at}.type", "TYPE_ENUM", kind)
    for name, nested in (schema.get("properties") or {}).items():
        _schema(nested, f"{at}.properties[{name}].value")
    for name, nested in (schema.get("defs") or {}).items():
        _schema(nested, f"{at}.defs[{name}].value")
    for k, nested in enumerate(schema.get("anyOf") or []):
        _schema(nested, f"{at}.any_of[{k}]")
    if "items" in schema:
        _schema(schema["items"], f"{at}.items")


def _tools(tools: Any) -> list[str]:
    """The functions declared, in order."""
    if not isinstance(tools, list):
        raise _bad("tools", "TYPE_MESSAGE", tools)
    names = []
    for i, tool in enumerate(tools):
        tool = _fields(tool, {"functionDeclarations"}, f"tools[{i}]")
        declarations = tool.get("functionDeclarations", [])
        if not isinstance(declarations, list):
            raise _bad(f"tools[{i}].function_declarations", "TYPE_MESSAGE", declarations)
        for j, declared in enumerate(declarations):
            at = f"tools[{i}].function_declarations[{j}]"
            declared = _fields(
                declared, {"name", "description", "parameters", "parametersJsonSchema"}, at
            )
            name = declared.get("name")
            if not isinstance(name, str) or not _NAME.match(name):
                raise Invalid(
                    f"* GenerateContentRequest.{at}.name: Invalid function name. Must start with a "
                    "letter or an underscore. Must be alphameric (a-z, A-Z, 0-9), underscores (_), "
                    "dots (.), colons (:), or dashes (-), with a maximum length of 64."
                )
            _typed(declared.get("description", ""), "TYPE_STRING", f"{at}.description")
            if "parameters" in declared and "parametersJsonSchema" in declared:
                raise Invalid(
                    f"* GenerateContentRequest.{at}.parameters_json_schema: parameters_json_schema "
                    "and parameters are mutually exclusive."
                )
            if "parameters" in declared:
                _schema(declared["parameters"], f"{at}.parameters")
            names.append(name)
    return names


def _tool_config(value: Any) -> None:
    config = _fields(value, {"functionCallingConfig"}, "tool_config")
    at = "tool_config.function_calling_config"
    calling = _fields(config.get("functionCallingConfig", {}), {"mode", "allowedFunctionNames"}, at)
    if str(calling.get("mode", "AUTO")).upper() not in MODES:
        raise _bad(f"{at}.mode", "TYPE_ENUM", calling["mode"])
    _typed(calling.get("allowedFunctionNames", []), "TYPE_STRING[]", f"{at}.allowed_function_names")


def _generation(value: Any) -> dict[str, Any]:
    config = _fields(value, GENERATION, "generation_config")
    for name, kind in GENERATION.items():
        if name in config:
            _typed(config[name], kind, f"generation_config.{_snake(name)}")
    if "responseSchema" in config and "responseJsonSchema" in config:
        raise Invalid(
            "* GenerateContentRequest.generation_config.response_json_schema: response_json_schema "
            "and response_schema are mutually exclusive."
        )
    if "responseSchema" in config:
        _schema(config["responseSchema"], "generation_config.response_schema")
    if ("responseSchema" in config or "responseJsonSchema" in config) and config.get(
        "responseMimeType"
    ) not in JSON_TYPES:
        raise Invalid(
            "* GenerateContentRequest.generation_config.response_mime_type: a response schema "
            "requires response_mime_type application/json or text/x.enum."
        )
    if len(config.get("stopSequences", [])) > 5:
        raise Invalid(
            "* GenerateContentRequest.generation_config.stop_sequences: at most 5 stop sequences "
            "are allowed."
        )
    if config.get("candidateCount", 1) < 1:
        raise Invalid(
            "* GenerateContentRequest.generation_config.candidate_count: must be positive."
        )
    if "thinkingConfig" in config:
        at = "generation_config.thinking_config"
        thinking = _fields(config["thinkingConfig"], THINKING, at)
        for name, kind in THINKING.items():
            if name in thinking:
                _typed(thinking[name], kind, f"{at}.{_snake(name)}")
        if str(thinking.get("thinkingLevel", "HIGH")).upper() not in LEVELS:
            raise _bad(f"{at}.thinking_level", "TYPE_ENUM", thinking["thinkingLevel"])
        if "thinkingBudget" in thinking and "thinkingLevel" in thinking:
            raise Invalid("You can only set only one of thinking budget and thinking level.")
    return config


def check(body: Any, cloud: str, model: str) -> list[str]:
    """Refuses (Invalid) what Google would in a generateContent body; the functions declared."""
    known = REQUEST | {"labels"} if cloud == "vertex" else REQUEST
    body = _fields(body, known, "")
    _contents(body.get("contents"), model)
    if "systemInstruction" in body:
        _system(body["systemInstruction"])
    declared = _tools(body["tools"]) if "tools" in body else []
    if "toolConfig" in body:
        _tool_config(body["toolConfig"])
    if "generationConfig" in body:
        _generation(body["generationConfig"])
    settings = body.get("safetySettings", [])
    if not isinstance(settings, list):
        raise _bad("safety_settings", "TYPE_MESSAGE", settings)
    for i, setting in enumerate(settings):
        for name, value in _fields(setting, SAFETY, f"safety_settings[{i}]").items():
            _typed(value, "TYPE_ENUM", f"safety_settings[{i}].{name}")
    _typed(body.get("cachedContent", ""), "TYPE_STRING", "cached_content")
    labels = body.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise _bad("labels", "TYPE_STRING", labels)
    return declared


def check_count(body: Any, cloud: str, model: str) -> None:
    """Refuses (Invalid) what Google would in a countTokens body."""
    if cloud == "vertex":  # Vertex's CountTokensRequest: the request's own fields, flat
        flat = _fields(body, {"contents", "systemInstruction", "tools", "generationConfig"}, "")
        check(flat, cloud, model)
        return
    body = _fields(body, {"contents", "generateContentRequest"}, "")
    if "contents" in body and "generateContentRequest" in body:
        raise Invalid("contents and generate_content_request are mutually exclusive.")
    if "generateContentRequest" not in body:
        _contents(body.get("contents"), model)
        return
    inner = _fields(body["generateContentRequest"], REQUEST | {"model"}, "generate_content_request")
    if inner.get("model") != f"models/{model}":
        raise Invalid("* GenerateContentRequest.model: unexpected model name format")
    check({k: v for k, v in inner.items() if k != "model"}, cloud, model)


# ---- answering ----------------------------------------------------------------------------------


def _usage(prompt: int, output: int, thoughts: int, cached: int, cloud: str) -> dict[str, Any]:
    counts = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output + thoughts,
        "cachedContentTokenCount": cached,
        "thoughtsTokenCount": thoughts,
    }
    usage: dict[str, Any] = {k: v for k, v in counts.items() if v}  # proto JSON omits zeros
    if prompt:
        usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
    if cloud == "vertex":
        usage["trafficType"] = "ON_DEMAND"
    return usage


def _logprobs(pieces: list[str], top: int) -> dict[str, Any]:
    chosen = [{"token": p, "logProbability": -0.1} for p in pieces]
    others = [{"token": f"x{k} ", "logProbability": -2.0 - k} for k in range(1, top)]
    return {
        "chosenCandidates": chosen,
        "topCandidates": [{"candidates": [c, *others]} for c in chosen],
    }


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\r\n\r\n"  # Google ends lines with CRLF


@dataclass
class Answer:
    """What a generateContent request is answered, whole or streamed."""

    model: str
    cloud: str
    prompt: int  # the prompt's words
    cached: int
    candidates: int
    top: int  # logprobs alternatives per token; 0: no logprobs
    finish: str
    blocked: bool
    # (a part, the output tokens it adds, the thought tokens it adds, its text piece)
    steps: list[tuple[dict[str, Any], int, int, str | None]]

    def frame(self, candidates: list[dict[str, Any]], output: int, thoughts: int) -> Any:
        usage = _usage(self.prompt, output, thoughts, self.cached, self.cloud)
        reply = {"candidates": candidates, "usageMetadata": usage, "modelVersion": self.model}
        reply["responseId"] = RESPONSE_ID
        if self.cloud == "vertex":
            reply["createTime"] = "2025-01-01T00:00:00.000000Z"
        return reply

    def whole(self) -> Any:
        """One reply: the thought, the text as one part, the call."""
        pieces = [piece for _, _, _, piece in self.steps if piece is not None]
        parts = [p for p, *_ in self.steps if "thought" in p]
        parts += [{"text": "".join(pieces)}] if pieces else []
        parts += [p for p, *_ in self.steps if "functionCall" in p]
        candidates = []
        for i in range(self.candidates):
            content = {"role": "model", "parts": parts} if parts else {"role": "model"}
            candidate = {"content": content, "finishReason": self.finish, "index": i}
            if self.top:
                candidate |= {"avgLogprobs": -0.1, "logprobsResult": _logprobs(pieces, self.top)}
            candidates.append(candidate)
        output = sum(tokens for _, tokens, _, _ in self.steps) * self.candidates
        return self.frame(candidates, output, sum(t for _, _, t, _ in self.steps))

    def streamed(self) -> list[Any]:
        """A reply per step, each with the usage so far; the last with the finish reasons."""
        replies, output, thoughts = [], 0, 0
        for k, (part, tokens, thought, piece) in enumerate(self.steps):
            output, thoughts = output + tokens, thoughts + thought
            candidates = []
            for i in range(self.candidates):
                candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}}
                if self.top and piece is not None:
                    candidate["logprobsResult"] = _logprobs([piece], self.top)
                if k == len(self.steps) - 1:
                    candidate["finishReason"] = self.finish
                    if self.top:
                        candidate["avgLogprobs"] = -0.1
                candidates.append({**candidate, "index": i})
            replies.append(self.frame(candidates, output * self.candidates, thoughts))
        if not replies:  # nothing to say: the finish reasons alone
            end = {"content": {"role": "model"}, "finishReason": self.finish}
            replies = [self.frame([{**end, "index": i} for i in range(self.candidates)], 0, 0)]
        return replies


def _answer(body: dict[str, Any], model: str, cloud: str, tools: list[str], d: Directives) -> Any:
    x = extra(prompt_text(body))
    config = body.get("generationConfig") or {}
    prompt = len(prompt_text(body).split())
    steps: list[tuple[dict[str, Any], int, int, str | None]] = []
    if x.thoughts:
        steps.append(({"text": "thinking…", "thought": True}, 0, x.thoughts, None))
    steps += [({"text": f"w{i} "}, 1, 0, f"w{i} ") for i in range(d.chunks)]
    if d.tool and tools:  # the first function declared; its call arrives whole
        name = tools[0]
        call = {"functionCall": {"name": name, "args": ARGS}, "thoughtSignature": signature(name)}
        steps.append((call, 0, 0, None))
    return Answer(
        model=model,
        cloud=cloud,
        prompt=prompt,
        cached=min(d.cached, prompt),
        candidates=int(config.get("candidateCount", 1)),
        top=int(config.get("logprobs", 1)) if config.get("responseLogprobs") else 0,
        finish=x.finish,
        blocked=x.blocked,
        steps=steps,
    )


async def _generate(answer: Answer, stream: bool, d: Directives, send: Send) -> None:
    if answer.blocked:  # Google answers a blocked prompt 200, without candidates
        reply = answer.frame([], 0, 0)
        del reply["candidates"]
        replies = [{"promptFeedback": {"blockReason": "SAFETY"}, **reply}]
    else:
        replies = answer.streamed() if stream else [answer.whole()]
    if not stream:
        if d.delay:
            await asyncio.sleep(d.delay)
        return await send_json(send, 200, replies[0])
    events = [_event(r) for r in replies]
    if d.stream_error is not None:
        events = [*events[: d.stream_error], _event(error(503, "The model is overloaded."))]
    headers = [(b"content-type", b"text/event-stream"), (b"x-content-type-options", b"nosniff")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for sent, event in enumerate(events):
        await pace(d, sent)
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


UNREGISTERED = (
    "Method doesn't allow unregistered callers (callers without established identity). Please use "
    "API Key or other form of API consumer identity to call this API."
)
NO_TOKEN = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential."
)


def make_app() -> Any:
    seen = {"cloud": "", "model": "", "verb": "", "key": "", "token": "", "project": ""}
    seen |= {"region": "", "query": ""}

    async def handle(
        path: str, body: dict[str, Any], headers: dict[str, str], d: Directives, send: Send
    ) -> None:
        bearer = headers.get("authorization", "")
        token = bearer[7:] if bearer.lower().startswith("bearer ") else ""
        key, query = headers.get("x-goog-api-key", ""), _QUERY.get()
        studio, vertex = _STUDIO.match(path), _VERTEX.match(path)
        cloud = project = region = model = verb = ""
        if studio is not None:
            cloud, (model, verb) = "studio", studio.groups()
        elif vertex is not None:
            cloud, (project, region, model, verb) = "vertex", vertex.groups()
        seen.update(cloud=cloud, model=model, verb=verb, key=key, token=token, query=query)
        seen.update(project=project, region=region)
        if not cloud:
            return await send_json(send, 404, error(404, f"Method not found: {path}"))
        if cloud == "studio" and not key:
            return await send_json(send, 403, error(403, UNREGISTERED))
        if cloud == "vertex" and not token:
            return await send_json(send, 401, error(401, NO_TOKEN))
        stream = verb == "streamGenerateContent"
        if stream and parse_qs(query).get("alt") != ["sse"]:  # Google's default: a JSON array
            message = "the fake streams Server-Sent Events only: add ?alt=sse"
            return await send_json(send, 400, error(400, message))
        if verb in ("batchEmbedContents", "predict"):
            if (verb == "predict") != (cloud == "vertex"):  # each cloud embeds its own way
                return await send_json(send, 404, error(404, f"Method not found: {path}"))
            try:
                return await send_json(send, 200, embed(body, cloud, model))
            except Invalid as why:
                return await send_json(send, 400, error(400, str(why)))
        try:
            if verb == "countTokens":
                check_count(body, cloud, model)
                tools: list[str] = []
            else:
                tools = check(body, cloud, model)
        except Invalid as why:
            return await send_json(send, 400, error(400, str(why)))
        if verb == "countTokens":
            text = prompt_text(body)
            counted: dict[str, Any] = {"totalTokens": len(text.split())}
            if cloud == "vertex":
                counted["totalBillableCharacters"] = len("".join(text.split()))
            return await send_json(send, 200, counted)
        await _generate(_answer(body, model, cloud, tools, d), stream, d, send)

    inner = make_asgi(handle, error, prompt_text)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/stats":
            return await stats_with(inner, scope, receive, send, seen)
        if scope["type"] == "http":
            _QUERY.set(scope.get("query_string", b"").decode())
        await inner(scope, receive, send)

    return app


if __name__ == "__main__":
    main(make_app, "a fake Google Gemini API (AI Studio and Vertex AI) for tests")
