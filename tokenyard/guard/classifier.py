"""The safety classifier at request time: one score per category (OpenAI's moderation taxonomy)
and `jailbreak`, from features that cost a table lookup.

A text is cut into MiniLM's WordPiece ids (router/embedding.py's tokenizer, word by word, cached);
long texts keep their first HEAD_CHARS and last TAIL_CHARS characters (the output check reads a
sliding window of the reply instead). Two feature blocks, each of unit norm, feed one logistic
regression per head:
- lexical: the set of WordPiece unigrams and hashed bigrams, each weighted by its inverse document
  frequency in the training texts and l2-normalised (scikit-learn's TfidfTransformer on binary
  counts), so a head's lexical logit is sum(w * idf) / sqrt(sum(idf^2)) over the text's distinct
  features. The idf keeps common words from adding up in long texts: with plain binary features
  a long ordinary request collected a jailbreak score from its many everyday words;
- semantic: the mean of MiniLM's per-token vectors (router/embedding.py: each vocabulary token
  embedded alone by the full model), projected on the training texts' principal axes, centred and
  normalised.

Scoring is numpy over a few hundred ids: tens of microseconds for a chat turn, bounded for any
prompt by the two edges. Anything a client can send (empty, huge, binary, any script) is text
here; a text with no known token scores each head's bias alone.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenyard.core.artifacts import load_artifact
from tokenyard.router.embedding import WordPieces

ARTIFACT_DIR = Path(__file__).parent / "artifacts"
DEFAULT_ARTIFACT = ARTIFACT_DIR / "guard-v3.joblib"
HEAD_CHARS = 2000
TAIL_CHARS = 2000
BIGRAM_BITS = 18
_BIGRAM_MASK = (1 << BIGRAM_BITS) - 1
_MIX = np.int64(1_000_003)


def cut(text: str) -> tuple[str, ...]:
    """The parts of a text that are read: the whole, or its two edges."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return (text,)
    return (text[:HEAD_CHARS], text[-TAIL_CHARS:])


def text_ids(pieces: WordPieces, text: str) -> np.ndarray:
    ids: list[int] = []
    for part in cut(text):
        ids.extend(pieces.ids(part))  # each part is under router's own edge length: read whole
    return np.asarray(ids, dtype=np.int64)


def lexical_index(ids: np.ndarray, vocab: int) -> np.ndarray:
    """The distinct lexical features of a text: WordPiece ids, then hashed id bigrams."""
    if ids.size == 0:
        return ids
    if ids.size == 1:
        return np.unique(ids)
    bigrams = vocab + ((ids[:-1] * _MIX + ids[1:]) & _BIGRAM_MASK)
    return np.unique(np.concatenate((ids, bigrams)))


def n_lexical(vocab: int) -> int:
    return vocab + (1 << BIGRAM_BITS)


@dataclass
class Model:
    """Every array the scores need; what the artifact holds."""

    pieces: WordPieces
    heads: tuple[str, ...]
    table: np.ndarray  # vocab × dims, MiniLM's token vectors on the principal axes (float16)
    center: np.ndarray  # dims
    lex_index: np.ndarray  # the lexical features with a weight (int32), sorted
    lex_weight: np.ndarray  # len(lex_index) × heads (float16)
    idf: np.ndarray  # every lexical feature's inverse document frequency (float32)
    emb_weight: np.ndarray  # dims × heads
    bias: np.ndarray  # heads
    thresholds: np.ndarray  # heads: the default decision threshold of each head's probability
    _dense: np.ndarray | None = field(default=None, repr=False)
    _table: np.ndarray | None = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_dense"] = state["_table"] = None
        return state

    def prepare(self) -> "Model":
        """Expand the stored (compact) weights for scoring; done once at load."""
        vocab = self.table.shape[0]
        dense = np.zeros((n_lexical(vocab), len(self.heads)), dtype=np.float32)
        # each weight times its feature's idf: a text's lexical logit is then one sum and a norm
        dense[self.lex_index] = self.lex_weight.astype(np.float32) * self.idf[self.lex_index, None]
        self._dense = dense
        self._table = self.table.astype(np.float32)
        return self

    def logits(self, text: str) -> np.ndarray:
        if self._dense is None or self._table is None:
            self.prepare()
        assert self._dense is not None and self._table is not None
        ids = text_ids(self.pieces, text)
        out = self.bias.astype(np.float64).copy()
        if ids.size == 0:
            return out
        index = lexical_index(ids, self._table.shape[0])
        idf = self.idf[index].astype(np.float64)
        out += self._dense[index].sum(axis=0, dtype=np.float64) / math.sqrt(float(idf @ idf))
        v = self._table[ids].mean(axis=0, dtype=np.float64) - self.center
        norm = math.sqrt(float(v @ v))
        if norm > 0:
            out += (v / norm) @ self.emb_weight
        return out

    def scores(self, text: str) -> np.ndarray:
        z = np.clip(self.logits(text), -40.0, 40.0)
        return 1.0 / (1.0 + np.exp(-z))


@dataclass(frozen=True)
class SafetyClassifier:
    model: Model
    metadata: dict[str, Any]

    @classmethod
    def load(cls, path: Path | str = DEFAULT_ARTIFACT) -> "SafetyClassifier":
        model, metadata = load_artifact(path, "tokenyard guard train")
        model.prepare()
        clf = cls(model=model, metadata=metadata)
        clf.scores("warm up")  # the first call builds the tokenizer's caches
        return clf

    @property
    def version(self) -> str:
        return str(self.metadata.get("version", "?"))

    @property
    def heads(self) -> tuple[str, ...]:
        return self.model.heads

    def thresholds(self) -> dict[str, float]:
        return dict(zip(self.model.heads, map(float, self.model.thresholds), strict=True))

    def scores(self, text: Any) -> dict[str, float]:
        """One probability per head. Never raises on what a client may send: anything not a
        string is read as its text, invalid surrogates are replaced."""
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        try:
            values = self.model.scores(text)
        except (UnicodeError, TypeError):  # lone surrogates: the tokenizer takes UTF-8 only
            values = self.model.scores(text.encode("utf-8", "replace").decode("utf-8"))
        return dict(zip(self.model.heads, values.tolist(), strict=True))
