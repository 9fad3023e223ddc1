"""Personal data the guard masked in a prompt, put back where the reply repeats it.

The model saw `[EMAIL_1]` where the client wrote an address (core/safety.py PLACEHOLDER); a reply
that says "I wrote to [EMAIL_1]" reaches the client as "I wrote to ada@example.com". In a stream a
placeholder can arrive split across chunks ("[EMA", "IL_1]"), so a choice's text that ends in what
could still become one is held back until the next chunk shows, or the choice finishes. Inside a
tool call's arguments (JSON text) the value is written JSON-escaped. Chat and legacy completions,
and OpenAI's own Responses API (a request for one of its models goes there as it is), whole and
streamed.
"""

import json
import re
from collections.abc import Mapping

import msgspec

from tokenyard.core.safety import PLACEHOLDER

# what may still grow into a placeholder at the end of a piece of text
_OPEN = re.compile(r"\[(?:[A-Z][A-Z_]*[0-9]*)?$")
# a Responses stream's texts: the event's kind → the field its `.done` event holds whole
_STREAMED = {
    "response.output_text": "text",
    "response.refusal": "refusal",
    "response.function_call_arguments": "arguments",
}


class Unmasker:
    def __init__(self, masked: Mapping[str, str]) -> None:
        self.masked = masked
        self.longest = max(map(len, masked))
        self.held: dict[tuple[int, str], str] = {}  # (choice, field) → text not yet sent
        self.inserted = 0  # events added to a Responses stream: later sequence numbers move up

    def _put_back(self, text: str, escaped: bool) -> str:
        def value(found: re.Match[str]) -> str:
            original = self.masked.get(found.group())
            if original is None:  # not one of this request's: the model's own text
                return found.group()
            return json.dumps(original)[1:-1] if escaped else original

        return PLACEHOLDER.sub(value, text)

    def _piece(self, key: tuple[int, str], text: str, escaped: bool) -> str:
        """The next piece of one text: what can be sent of it, put back."""
        text = self.held.pop(key, "") + text
        tail = _OPEN.search(text[-self.longest :])
        if tail is not None:
            cut = len(text) - (len(text[-self.longest :]) - tail.start())
            text, self.held[key] = text[:cut], text[cut:]
        return self._put_back(text, escaped)

    def _rest(self, index: int) -> dict[str, str]:
        """A finished choice's held text, by field."""
        rest = {}
        for key in [k for k in self.held if k[0] == index]:
            rest[key[1]] = self._put_back(self.held.pop(key), key[1].startswith("args"))
        return rest

    def _output(self, items: object) -> None:
        """A Responses object's output items, the values put back in place: messages' text and
        refusals, function calls' arguments."""
        for item in items if isinstance(items, list) else ():
            self._item(item)

    def _item(self, item: object) -> None:
        if not isinstance(item, dict):
            return
        if isinstance(item.get("arguments"), str):
            item["arguments"] = self._put_back(item["arguments"], escaped=True)
        for part in item.get("content") or () if item.get("type") == "message" else ():
            self._part(part)

    def _part(self, part: object) -> None:
        for name in ("text", "refusal"):
            if isinstance(part, dict) and isinstance(part.get(name), str):
                part[name] = self._put_back(part[name], escaped=False)

    def reply(self, body: bytes) -> bytes:
        """A whole reply (a chat or legacy completion, or a Responses object) with the values put
        back."""
        try:
            data = msgspec.json.decode(body)
        except msgspec.DecodeError:
            return body
        if isinstance(data, dict):
            self._output(data.get("output"))
        for choice in data.get("choices") or () if isinstance(data, dict) else ():
            message = choice.get("message") or {}
            for holder, name in ((message, "content"), (message, "refusal"), (choice, "text")):
                if isinstance(holder.get(name), str):
                    holder[name] = self._put_back(holder[name], escaped=False)
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                if isinstance(function.get("arguments"), str):
                    function["arguments"] = self._put_back(function["arguments"], escaped=True)
        return msgspec.json.encode(data)

    def event(self, event: bytes) -> bytes:
        """One SSE event of a chat or legacy completion stream, with the values put back."""
        if not event.startswith(b"data:"):
            return event
        try:
            data = msgspec.json.decode(event[5:].strip())
        except msgspec.DecodeError:
            return event  # [DONE], or nothing of ours
        if isinstance(data, dict) and str(data.get("type")).startswith("response."):
            return self._response_event(data)
        if not isinstance(data, dict) or not data.get("choices"):
            return event
        for choice in data["choices"]:
            index = choice.get("index", 0)
            chat = isinstance(choice.get("delta"), dict)
            # a chat chunk's text is its delta's content, a legacy one's the choice's text
            texts, name = (choice["delta"], "content") if chat else (choice, "text")
            if isinstance(texts.get(name), str):
                texts[name] = self._piece((index, name), texts[name], escaped=False)
            for call in (texts.get("tool_calls") or ()) if chat else ():
                function = call.get("function") or {}
                if isinstance(function.get("arguments"), str):
                    key = (index, f"args{call.get('index', 0)}")
                    function["arguments"] = self._piece(key, function["arguments"], escaped=True)
            if choice.get("finish_reason"):  # what was held goes out with the choice's end
                for field, rest in self._rest(index).items():
                    if field == name:
                        texts[name] = (texts.get(name) or "") + rest
                    else:  # a tool call's arguments: one more delta of that call
                        call = {"index": int(field[4:]), "function": {"arguments": rest}}
                        texts.setdefault("tool_calls", []).append(call)
        return b"data: " + msgspec.json.encode(data)

    def _response_event(self, data: dict) -> bytes:
        """One event of OpenAI's own Responses stream, with the values put back. A text's deltas
        are held back as a chat chunk's are; what is held when the text's `.done` event comes goes
        out as one more delta just before it (and the stream's later sequence numbers move up)."""
        kind, flushed = data["type"], b""
        if isinstance(data.get("sequence_number"), int):
            data["sequence_number"] += self.inserted
        stem, _, step = kind.rpartition(".")
        whole = _STREAMED.get(stem)
        key = (data.get("output_index", 0), f"{stem}{data.get('content_index', 0)}")
        escaped = whole == "arguments"
        if whole is not None and step == "delta" and isinstance(data.get("delta"), str):
            data["delta"] = self._piece(key, data["delta"], escaped)
        elif whole is not None and step == "done":
            if rest := self.held.pop(key, ""):
                where = ("item_id", "output_index", "content_index", "sequence_number")
                delta = {"type": f"{stem}.delta", **{k: data[k] for k in where if k in data}}
                delta["delta"] = self._put_back(rest, escaped)
                if whole == "text":
                    delta["logprobs"] = []
                flushed = b"data: " + msgspec.json.encode(delta) + b"\n\n"
                if "sequence_number" in data:
                    data["sequence_number"] += 1
                    self.inserted += 1
            if isinstance(data.get(whole), str):
                data[whole] = self._put_back(data[whole], escaped)
        self._part(data.get("part"))  # a content part added or done
        self._item(data.get("item"))  # an output item added or done
        if isinstance(data.get("response"), dict):  # created, in progress, completed, ...
            self._output(data["response"].get("output"))
        return flushed + b"data: " + msgspec.json.encode(data)
