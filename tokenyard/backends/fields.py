"""Every request field OpenAI defines for chat and legacy completions, and how each kind of backend
treats it: the one table the router and the gateway read, so that no field is silently dropped.

A field is *honoured* (the backend acts on it), *passed* through unchanged to a provider that acts
on it itself (OpenAI), or *refused*: a 400 `unsupported_parameter` naming it. Some fields also need
a capability the catalog declares per model (`Supports`): `tools` on a model without the flag is
refused even where the backend kind could carry it. A field set to a value that asks for nothing
(`n: 1`, `logprobs: false`, `service_tier: "auto"`) is never refused. vLLM's fields that shape the
answer (its structured outputs, prompt logprobs) are in the table too: the engine honours them and
the commercial APIs would drop them unread, so they are refused there. Other fields OpenAI does not
define (vLLM's sampling extras, the gateway's own) are outside this table.
"""

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

Provider = Literal["self-hosted", "openai", "anthropic", "gemini", "converse"]
Endpoint = Literal["chat", "completion"]
Treatment = Literal["honoured", "passed", "refused"]
PROVIDERS: tuple[Provider, ...] = ("self-hosted", "openai", "anthropic", "gemini", "converse")


class Supports(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a model can do, declared in the catalog (context length is `max_context` there)."""

    tools: bool = False  # function tools, tool_choice, parallel_tool_calls
    structured_outputs: bool = False  # response_format json_schema / json_object
    logprobs: bool = False
    image_input: bool = False  # image parts in messages
    reasoning: bool = False  # reasoning_effort (the Responses API's `reasoning`)


Capability = Literal["tools", "structured_outputs", "logprobs", "image_input", "reasoning"]

H: Treatment = "honoured"
P: Treatment = "passed"
R: Treatment = "refused"


@dataclass(frozen=True)
class Rule:
    endpoints: tuple[Endpoint, ...]
    # per provider: self-hosted (the engine), openai, anthropic, gemini, converse (Bedrock's)
    treatment: tuple[Treatment, Treatment, Treatment, Treatment, Treatment]
    needs: Capability | None = None
    inert: tuple[Any, ...] = ()  # values that ask for nothing (besides null and false)
    note: str = ""

    def by(self, provider: Provider) -> Treatment:
        return self.treatment[PROVIDERS.index(provider)]


BOTH: tuple[Endpoint, ...] = ("chat", "completion")
CHAT: tuple[Endpoint, ...] = ("chat",)
LEGACY: tuple[Endpoint, ...] = ("completion",)

FIELDS: dict[str, Rule] = {
    "model": Rule(BOTH, (H, H, H, H, H)),
    "messages": Rule(
        CHAT,
        (H, H, H, H, H),
        note="image parts need image_input; audio and file parts pass to OpenAI only",
    ),
    "prompt": Rule(
        LEGACY, (H, P, R, R, R), note="only OpenAI's API and the engine have text completions"
    ),
    "max_tokens": Rule(BOTH, (H, H, H, H, H), note="sent under the name each model takes"),
    "max_completion_tokens": Rule(CHAT, (H, H, H, H, H)),
    "stream": Rule(BOTH, (H, H, H, H, H)),
    "stream_options": Rule(BOTH, (H, H, H, H, H)),
    "temperature": Rule(BOTH, (H, P, H, H, H), note="Anthropic: capped at 1"),
    "top_p": Rule(BOTH, (H, P, H, H, H)),
    "stop": Rule(BOTH, (H, P, H, H, H)),
    "n": Rule(BOTH, (H, P, R, H, R), inert=(1,)),
    "seed": Rule(BOTH, (H, P, R, H, R)),
    "presence_penalty": Rule(BOTH, (H, P, R, H, R), inert=(0,)),
    "frequency_penalty": Rule(BOTH, (H, P, R, H, R), inert=(0,)),
    "logit_bias": Rule(BOTH, (H, P, R, R, R), inert=({},)),
    "logprobs": Rule(BOTH, (H, P, R, H, R), needs="logprobs"),
    "top_logprobs": Rule(CHAT, (H, P, R, H, R), needs="logprobs"),
    "response_format": Rule(
        CHAT,
        (H, P, H, H, H),
        needs="structured_outputs",
        inert=({"type": "text"},),
        note="Anthropic, Converse: a forced answer tool whose input is the JSON, not with tools",
    ),
    "tools": Rule(CHAT, (H, P, H, H, H), needs="tools", inert=([],)),
    "tool_choice": Rule(
        CHAT, (H, P, H, H, H), needs="tools", note="Bedrock's Converse: none is a 400"
    ),
    "parallel_tool_calls": Rule(CHAT, (H, P, H, R, R), needs="tools", inert=(True,)),
    "user": Rule(
        BOTH,
        (H, P, H, H, H),
        note="an end-user id, no effect on the output (Anthropic: metadata.user_id; Gemini, "
        "Converse: the gateway's per-user limits only)",
    ),
    "safety_identifier": Rule(
        CHAT, (H, P, H, H, H), note="as user (Anthropic: its metadata.user_id)"
    ),
    "cache_salt": Rule(
        BOTH,
        (H, H, H, H, H),
        note="vLLM's: the engine's cached prompts shared only within the team, and with this "
        "salt; the gateway's own (gateway/isolation.py), never sent to a provider",
    ),
    "prompt_cache_key": Rule(
        CHAT,
        (H, P, R, R, R),
        note="engine: picks the replica (prefix affinity), as OpenAI routes by it",
    ),
    "reasoning_effort": Rule(
        CHAT,
        (R, P, H, H, H),
        needs="reasoning",
        note="Anthropic (Converse: its models on Bedrock): extended thinking (budget minimal and "
        "low 1,024, medium 2,048, high 4,096 tokens), its text as reasoning_content and its "
        "blocks as thinking_blocks, sent back on the assistant turn; Gemini: a thinking budget "
        "(none 0, low 1,024, medium 8,192, high 24,576 tokens)",
    ),
    "thinking": Rule(
        CHAT,
        (R, R, H, H, H),
        needs="reasoning",
        inert=({"type": "disabled"},),
        note="Anthropic's extended thinking as its Messages API takes it ({type: enabled, "
        "budget_tokens ≥ 1,024} or {type: adaptive}; LiteLLM's field, and what /v1/messages "
        "sends): Anthropic as asked (on Bedrock's Converse too), Gemini as its thinking budget "
        "(adaptive: dynamic); not beside reasoning_effort",
    ),
    "output_config": Rule(
        CHAT,
        (R, R, H, R, H),
        needs="reasoning",
        note="Anthropic's ({effort: low … max}, what /v1/messages sends): Anthropic, and Claude "
        "on Converse; a model the catalog says thinks adaptively takes reasoning_effort as it",
    ),
    "store": Rule(
        CHAT,
        (H, H, H, H, H),
        note="stored by the gateway, for the team (GET /v1/chat/completions); never sent upstream",
    ),
    "metadata": Rule(
        CHAT, (H, P, H, H, H), note="the team's labels, recorded with the usage (billing)"
    ),
    "service_tier": Rule(BOTH, (R, P, R, R, R), inert=("auto", "default")),
    "modalities": Rule(CHAT, (R, P, R, R, R), inert=(["text"],)),
    "audio": Rule(CHAT, (R, P, R, R, R)),
    "prediction": Rule(
        CHAT,
        (H, P, R, R, R),
        note="engine: the predicted output's tokens are its speculative drafts",
    ),
    "web_search_options": Rule(CHAT, (R, P, R, R, R)),
    "verbosity": Rule(CHAT, (R, P, R, R, R)),
    "moderation": Rule(CHAT, (R, P, R, R, R)),
    "prompt_cache_retention": Rule(CHAT, (R, P, R, R, R)),
    "prompt_cache_options": Rule(CHAT, (R, P, R, R, R)),
    "functions": Rule(
        CHAT,
        (H, P, R, R, R),
        needs="tools",
        note="deprecated: use tools (engine: as tools, one call)",
    ),
    "function_call": Rule(
        CHAT,
        (H, P, R, R, R),
        needs="tools",
        note="deprecated: use tool_choice (engine: answered as function_call)",
    ),
    "echo": Rule(
        LEGACY,
        (H, P, R, R, R),
        note="engine: the prompt opens the text, with logprobs its tokens scored; max_tokens 0: "
        "nothing generated",
    ),
    "suffix": Rule(LEGACY, (R, P, R, R, R), inert=("",)),
    "best_of": Rule(
        LEGACY,
        (H, P, R, R, R),
        inert=(1,),
        note="engine: the n candidates of highest mean token logprob; every candidate billed",
    ),
    # vLLM's
    "continue_final_message": Rule(
        CHAT,
        (H, R, H, R, R),
        note="vLLM's: the answer goes on from the last, assistant message (Anthropic: its prefill)",
    ),
    "allowed_token_ids": Rule(
        BOTH, (H, R, R, R, R), note="vLLM's: only these token ids are sampled"
    ),
    "bad_words": Rule(BOTH, (H, R, R, R, R), inert=([],), note="vLLM's: words never generated"),
    "include_stop_str_in_output": Rule(
        BOTH,
        (H, R, R, R, R),
        inert=(False,),
        note="vLLM's: the stop string stays at the text's end",
    ),
    "truncate_prompt_tokens": Rule(
        BOTH, (H, R, R, R, R), note="vLLM's: only the prompt's last k tokens are read"
    ),
    "return_tokens_as_token_ids": Rule(
        BOTH, (H, R, R, R, R), inert=(False,), note='vLLM\'s: logprobs name tokens "token_id:N"'
    ),
    "add_generation_prompt": Rule(
        CHAT,
        (H, R, R, R, R),
        inert=(True,),
        note="vLLM's: false leaves the assistant's turn unopened",
    ),
    "prompt_logprobs": Rule(
        BOTH,
        (H, R, R, R, R),
        needs="logprobs",
        note="vLLM's: each prompt token's logprob, rank, top k",
    ),
    "structured_outputs": Rule(
        BOTH,
        (H, R, R, R, R),
        needs="structured_outputs",
        note="vLLM's: json, regex, choice, grammar (EBNF) or json_object",
    ),
    **{
        name: Rule(BOTH, (H, R, R, R, R), needs="structured_outputs", note=f"vLLM's older {what}")
        for name, what in (
            ("guided_json", "structured_outputs.json"),
            ("guided_regex", "structured_outputs.regex"),
            ("guided_choice", "structured_outputs.choice"),
            ("guided_grammar", "structured_outputs.grammar"),
        )
    },
}

# content part types of chat messages: what each needs
PART_NEEDS: dict[str, Capability | None] = {"text": None, "image_url": "image_input"}


def _asks(value: Any, rule: Rule) -> bool:
    """Whether a value asks for something (`0 is not False`: legacy logprobs=0 asks)."""
    if value is None or value is False:
        return False
    return not any(
        value == v and isinstance(value, bool) == isinstance(v, bool) for v in rule.inert
    )


@dataclass(frozen=True)
class Ask:
    """What a request asks of a model: the OpenAI fields it sets, and its message part types."""

    endpoint: Endpoint
    fields: tuple[str, ...]
    parts: frozenset[str]


def ask_of(body: dict[str, Any]) -> Ask:
    endpoint: Endpoint = "chat" if "messages" in body else "completion"
    fields = tuple(
        name
        for name, value in body.items()
        if (rule := FIELDS.get(name)) and endpoint in rule.endpoints and _asks(value, rule)
    )
    parts: set[str] = set()
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            parts.update(str(p.get("type")) for p in content if isinstance(p, dict))
    return Ask(endpoint, fields, frozenset(parts))


@dataclass(frozen=True)
class Refusal:
    param: str
    message: str
    code: str = "unsupported_parameter"


def refusal(ask: Ask, model: str, provider: Provider, supports: Supports) -> Refusal | None:
    """Why `model` cannot honour the request (None: it can)."""
    if ask.endpoint == "completion" and provider in ("anthropic", "gemini", "converse"):
        return Refusal(
            "model", f"model {model!r} serves only /v1/chat/completions", "unsupported_endpoint"
        )
    for name in ask.fields:
        rule = FIELDS[name]
        if rule.by(provider) == "refused":
            return Refusal(name, f"{name!r} is not supported by the model {model!r}")
        if rule.needs and not getattr(supports, rule.needs):
            return Refusal(name, f"{name!r} is not supported by the model {model!r}")
    for part in sorted(ask.parts):
        needs = PART_NEEDS.get(part, "")
        if needs == "" and provider != "openai":
            return Refusal("messages", f"{part!r} content parts are not supported by {model!r}")
        if needs and not getattr(supports, needs):
            return Refusal("messages", f"{part!r} content parts are not supported by {model!r}")
    return None


def markdown_table() -> str:
    """The table as docs/gateway.md shows it (a test keeps the two equal)."""
    head = "| field | endpoints | needs | engine | OpenAI | Anthropic | Gemini | Converse | note |"
    rows = [head, "|---|---|---|---|---|---|---|---|---|"]
    for name, rule in FIELDS.items():
        endpoints = ", ".join("chat" if e == "chat" else "completions" for e in rule.endpoints)
        cells = [f"`{name}`", endpoints, rule.needs or "", *rule.treatment, rule.note]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
