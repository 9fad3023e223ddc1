"""Tokenizer and chat template from the model's own files (GGUF metadata or an HF directory)."""

import functools
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

log = logging.getLogger("tokenyard.engine")


class Tokenizer:
    def __init__(self, hf: PreTrainedTokenizerBase, eos_token_ids: tuple[int, ...]):
        self.hf = hf
        ids = set(eos_token_ids)
        if hf.eos_token_id is not None:
            ids.add(hf.eos_token_id)
        self.eos_token_ids = tuple(sorted(ids))
        self._fast = getattr(hf, "_tokenizer", None)  # the Rust tokenizer: no Python overhead

    @classmethod
    def load(
        cls, path: str, eos_token_ids: tuple[int, ...] = (), cache_dir: str = ""
    ) -> "Tokenizer":
        """With a cache_dir, a GGUF's tokenizer is converted once and read from there after."""
        return cls(_hf_tokenizer(path, cache_dir), eos_token_ids)

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
def _hf_tokenizer(path: str, cache_dir: str = "") -> PreTrainedTokenizerBase:
    """Kept for the process, and shared (encoding and decoding do not change it): from a GGUF,
    transformers parses the file and converts its vocabulary (9 s for SmolLM2 on a 2-core AVX2
    EPYC), and the tests build many engines in one process."""
    if not path.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(path)
    converted = _converted_folder(path, cache_dir) if cache_dir else None
    if converted is not None and converted.is_dir():
        return AutoTokenizer.from_pretrained(converted)  # 0.6 s
    folder, name = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if converted is not None:
        _keep(tokenizer, converted)
    return tokenizer


def _converted_folder(path: str, cache_dir: str) -> Path:
    """Where a GGUF's converted tokenizer is kept: named by the file (its real path, size and
    modification time) and the transformers that converted it, so a changed file or a new
    converter is converted again."""
    stat = os.stat(path)
    identity = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, transformers.__version__)
    digest = hashlib.sha256(repr(identity).encode()).hexdigest()[:24]
    return Path(cache_dir) / "tokenizers" / f"{Path(path).stem}-{digest}"


def _keep(tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Save the converted tokenizer whole or not at all (written aside, then renamed: engines
    starting together may race); a cache that cannot be written only costs the next start."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".saving-"))
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(folder)
        except OSError:  # another engine kept it first
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        log.warning("the converted tokenizer was not kept in %s: %s", folder.parent, exc)
