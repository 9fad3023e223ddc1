"""Incremental detokenization with stop strings that may span token boundaries.

Text is released only once it cannot be the start of a stop string any more, so a client never
sees part of a stop sequence.
"""

from dataclasses import dataclass, field


@dataclass
class IncrementalText:
    stop: list[str]
    include_stop: bool = False  # the stop string that ends the text stays in it (vLLM's option)
    text: str = ""  # everything decoded so far
    emitted: int = 0  # characters of text already released
    stopped: bool = False
    matched: str | None = None  # the stop string that ended the text
    _prefix_offset: int = 0
    _read_offset: int = 0
    _hold: int = field(init=False)

    def __post_init__(self) -> None:
        self._hold = max((len(s) for s in self.stop), default=1) - 1

    def add(self, decode, output_ids: list[int]) -> str:
        """Decode the newest token(s); return the text that can be released now."""
        # decode a small window so byte-level pieces (e.g. half a UTF-8 character) join up
        prefix = decode(output_ids[self._prefix_offset : self._read_offset])
        full = decode(output_ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(output_ids)
        return self._release(final=False)

    def _release(self, final: bool) -> str:
        if self.stop and not self.stopped:
            # a stop string can only start where it could still overlap new text
            search_from = max(0, self.emitted - self._hold)
            found = [(self.text.find(s, search_from), s) for s in self.stop]
            hits = [(i, s) for i, s in found if i >= 0]
            if hits:
                at, self.matched = min(hits, key=lambda hit: hit[0])
                self.text = self.text[: at + (len(self.matched) if self.include_stop else 0)]
                self.stopped = True
                final = True
        end = len(self.text) if final else max(self.emitted, len(self.text) - self._hold)
        out = self.text[self.emitted : end]
        self.emitted = end
        return out

    def flush(self) -> str:
        """At the end of the sequence: release what was held back."""
        return self._release(final=True)
