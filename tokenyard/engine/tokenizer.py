"""Tokenizer and chat template from the model's own files (GGUF metadata or an HF directory)."""

import functools
import os

from transformers import AutoTokenizer, PreTrainedTokenizerBase


class Tokenizer:
    def __init__(self, hf: PreTrainedTokenizerBase, eos_token_ids: tuple[int, ...]):
        self.hf = hf
        ids = set(eos_token_ids)
        if hf.eos_token_id is not None:
            ids.add(hf.eos_token_id)
        self.eos_token_ids = tuple(sorted(ids))
        self._fast = getattr(hf, "_tokenizer", None)  # the Rust tokenizer: no Python overhead

    @classmethod
    def load(cls, path: str, eos_token_ids: tuple[int, ...] = ()) -> "Tokenizer":
        return cls(_hf_tokenizer(path), eos_token_ids)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        continue_final: bool = False,
        open_turn: bool = True,
    ) -> list[int]:
        """The conversation as the model reads it, opening the assistant's turn (unless not
        `open_turn`); or, with `continue_final`, ending inside the last (assistant) message, for
        the model to go on."""
        text = self.hf.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=open_turn and not continue_final,
            continue_final_message=continue_final,
            tokenize=False,
        )
        # the template already wrote BOS and friends
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)


@functools.lru_cache(maxsize=2)
def _hf_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """Kept for the process, and shared (encoding and decoding do not change it): from a GGUF,
    transformers parses the file and converts its vocabulary, about 7.5 s (cProfile), and the
    tests build many engines in one process."""
    if path.endswith(".gguf"):
        folder, name = os.path.split(path)
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return AutoTokenizer.from_pretrained(path)
