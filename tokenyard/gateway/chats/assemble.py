"""A streamed chat completion put back together: its chunks folded into the chat.completion object
the same request unstreamed would have returned, so a stored stream reads like a stored reply."""

from typing import Any


class Assembly:
    def __init__(self) -> None:
        self.head: dict[str, Any] = {}  # id, created, model, system_fingerprint, service_tier
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        for name in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if chunk.get(name) is not None:
                self.head.setdefault(name, chunk[name])
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for part in chunk.get("choices") or ():
            self._fold(part)

    def _fold(self, part: dict[str, Any]) -> None:
        index = part.get("index", 0)
        choice = self.choices.setdefault(
            index,
            {
                "index": index,
                "message": {"role": "assistant", "content": None, "refusal": None},
                "finish_reason": None,
                "logprobs": None,
            },
        )
        message, delta = choice["message"], part.get("delta") or {}
        for name in ("content", "refusal"):
            if delta.get(name) is not None:
                message[name] = (message.get(name) or "") + delta[name]
        for call in delta.get("tool_calls") or ():
            calls = message.setdefault("tool_calls", [])
            at = call.get("index", len(calls))
            while len(calls) <= at:
                empty = {"name": "", "arguments": ""}
                calls.append({"id": None, "type": "function", "function": empty})
            into, function = calls[at], call.get("function") or {}
            into["id"] = call.get("id") or into["id"]
            into["type"] = call.get("type") or into["type"]
            into["function"]["name"] += function.get("name") or ""
            into["function"]["arguments"] += function.get("arguments") or ""
        if part.get("finish_reason") is not None:
            choice["finish_reason"] = part["finish_reason"]
        if (logprobs := part.get("logprobs")) is not None:
            kept = choice["logprobs"] = choice["logprobs"] or {"content": [], "refusal": None}
            kept["content"].extend(logprobs.get("content") or ())

    def completion(self) -> dict[str, Any]:
        return {
            "id": self.head.get("id", ""),
            "object": "chat.completion",
            "created": self.head.get("created", 0),
            "model": self.head.get("model", ""),
            "choices": [self.choices[i] for i in sorted(self.choices)],
            "usage": self.usage,
            "system_fingerprint": self.head.get("system_fingerprint"),
            "service_tier": self.head.get("service_tier"),
        }
