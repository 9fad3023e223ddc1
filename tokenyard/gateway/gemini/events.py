"""A chat stream as Gemini's streamGenerateContent (`alt=sse`): each text delta a
GenerateContentResponse of its own; function calls, which Gemini sends whole, gathered and sent
with the finish reason and the usage in the last one."""

from typing import Any

from tokenyard.backends import sse
from tokenyard.gateway.chats.assemble import Assembly
from tokenyard.gateway.gemini.translate import (
    FINISH,
    error_body,
    function_call,
    logprobs_result,
    usage_metadata,
)


class StreamWriter:
    def __init__(self, model: str) -> None:
        self.model = model  # the catalog model that serves it (auto's pick)
        self.whole = Assembly()  # the reply so far: its calls, finish reasons and usage
        self.id = ""

    def _event(self, candidates: list[dict[str, Any]], **more: Any) -> bytes:
        data = {"candidates": candidates, "modelVersion": self.model, "responseId": self.id}
        return sse.data({**data, **more})

    def chunk(self, data: dict[str, Any]) -> bytes:
        """The events for one chat chunk (b"" for none)."""
        self.whole.add(data)
        self.id = self.whole.head.get("id", "")
        texts = []
        for c in data.get("choices") or ():
            if delta := (c.get("delta") or {}).get("content"):
                text = {"content": {"role": "model", "parts": [{"text": delta}]}}
                if tokens := (c.get("logprobs") or {}).get("content"):  # this chunk's tokens'
                    text["logprobsResult"] = logprobs_result(tokens)
                texts.append({**text, "index": c.get("index", 0)})
        return self._event(texts) if texts else b""

    def finish(self) -> bytes:
        """The last event: each candidate's function calls, its finish reason, and the usage."""
        done = self.whole.completion()
        candidates = []
        for choice in done["choices"]:
            reason = FINISH.get(choice["finish_reason"] or "stop", "OTHER")
            last: dict[str, Any] = {"finishReason": reason, "index": choice["index"]}
            if calls := [function_call(c) for c in choice["message"].get("tool_calls") or ()]:
                last["content"] = {"role": "model", "parts": calls}
            candidates.append(last)
        return self._event(candidates, usageMetadata=usage_metadata(done["usage"]))

    def failed(self, status: int, message: str) -> bytes:
        return sse.data(error_body(status, message))
