"""Prompt-text features: TF-IDF word n-grams, optionally character n-grams of the prompt's start,
and a few text statistics.

The n-grams carry topic (MMLU subject, math word problem, code…), which is most of what predicts
the weak model's failures; the statistics carry structure (length, how much arithmetic, negated
questions such as "Which is NOT…", long passages to read).
"""

import math
import re

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import FeatureUnion, Pipeline
from sklearn.preprocessing import StandardScaler

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
