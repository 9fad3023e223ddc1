"""The complexity model and its runtime scorer: no model call at request time.

`BlendedRouter` (the fitted estimator in the artifact) adds seven standardised scores:
- a logistic regression over TF-IDF word and character n-grams and text statistics (topic cues
  of subjects seen in training),
- a logistic regression over the text statistics and a static embedding (mean of SmolLM2's
  input-embedding rows over the prompt's tokens), which transfers to unseen subjects; once fitted,
  the embedding block is folded into one weight per token,
- the prompt's log length,
- the expected gain of the training subjects the prompt resembles,
- gradient-boosted trees over the text statistics alone (no words: interactions of length, options,
  numbers and negations that carry over to subjects never seen in training),
- a logistic regression on the same n-gram features as the first, learning where the strong model
  fails (a negative weight: escalating a prompt both models fail gains nothing),
- a word-problem expert: a logistic regression over word-problem statistics (quantities,
  fractions, comparisons, conditions…) fitted on the training math word problems (GSM8K) alone,
  weighed by how likely the subject model finds the prompt to be one, above a floor (below it the
  expert is not consulted, and the part is 0); the n-gram parts, fitted mostly on MMLU, rank word
  problems no better than length;
with weights picked at training time on validation data. A part whose weight is 0 when the model is
fitted is not fitted: the artifact does not hold it and the scorer does not compute it.

scikit-learn's per-call overhead (validation, sparse matrix assembly) is ~2 ms for one prompt,
so `load` compiles the fitted model into dictionary lookups and sums; `score` computes the same
number (the tests check it against `predict_proba`) in a fraction of a millisecond.

The routing policy calls `score(prompt)` and compares it with a threshold; a team's threshold can
be given as the share of traffic it wants on the strong model, which `threshold_for_strong_share`
turns into a score using the curve calibrated on validation prompts at training time.
"""

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import sklearn
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from router.features import (
    StaticEmbedding,
    TextStats,
    TokenPieces,
    feature_union,
    text_stats,
    word_problem_stats,
)

DEFAULT_ARTIFACT = Path(__file__).parent / "artifacts" / "complexity-v5.joblib"

# The boosted trees' settings: shallow, slow and many, with large leaves, won the exploratory runs
# on validation; deeper trees or smaller leaves fit the training subjects and transferred worse.
BOOST_SETTINGS: dict[str, Any] = {
    "max_iter": 300,
    "learning_rate": 0.03,
    "max_depth": 3,
    "min_samples_leaf": 200,
    "l2_regularization": 1.0,
    "early_stopping": False,
}


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    e = np.exp(z[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def _gate(p: Any, floor: float) -> Any:
    """The word-problem part's weight from P(word problem): 0 up to the floor, so the expert is
    not consulted on the many prompts only faintly like one (and the scorer skips its statistics
    there), rising linearly to 1."""
    return np.maximum(p - floor, 0.0) / (1.0 - floor)


class BlendedRouter(ClassifierMixin, BaseEstimator):
    """w_sparse·z(n-gram LR) + w_dense·z(statistics + static-embedding LR) + w_length·z(log
    length) + w_subject·z(subject gain) + w_boost·z(boosted trees on the statistics) +
    w_strong·z(strong-fails LR) + w_word·z(gate(P(word problem)) × word-problem expert), each z
    standardised with its mean and spread on the training prompts. `fit` fits only the parts whose
    weight is not 0 (the n-gram LR always: the subject and strong-fails parts read its features;
    the subject model also when only the word-problem part needs its probabilities); afterwards
    set_params re-weights the fitted parts without a refit."""

    def __init__(
        self,
        c: float = 1.0,
        char_ngrams: bool = True,
        c_dense: float = 0.003,
        c_strong: float = 1.0,
        w_sparse: float = 1.0,
        w_dense: float = 1.0,
        w_length: float = 1.0,
        w_subject: float = 0.0,
        w_boost: float = 0.0,
        w_strong: float = 0.0,
        w_word: float = 0.0,
        c_word: float = 0.1,
        word_domain: str = "gsm8k",
        word_gate: float = 0.1,
        subject_c: float = 3.0,
        subject_features: int = 20_000,
        seed: int = 0,
    ):
        self.c = c
        self.char_ngrams = char_ngrams
        self.c_dense = c_dense
        self.c_strong = c_strong
        self.w_sparse = w_sparse
        self.w_dense = w_dense
        self.w_length = w_length
        self.w_subject = w_subject
        self.w_boost = w_boost
        self.w_strong = w_strong
        self.w_word = w_word
        self.c_word = c_word
        self.word_domain = word_domain
        self.word_gate = word_gate
        self.subject_c = subject_c
        self.subject_features = subject_features
        self.seed = seed

    def fit(
        self,
        texts: list[str],
        y: np.ndarray,
        groups: np.ndarray,
        gains: np.ndarray,
        strong_fails: np.ndarray,
    ) -> "BlendedRouter":
        """groups: each prompt's subject (MMLU subject, or the benchmark); gains: what routing
        it to the strong model gains (strong quality − weak quality); strong_fails: whether the
        strong model got it wrong."""
        texts, y = list(texts), np.asarray(y)
        groups, gains = np.asarray(groups), np.asarray(gains, dtype=float)
        self.classes_ = np.unique(y)
        self.sparse_ = Pipeline(
            [
                ("features", feature_union(self.char_ngrams)),
                ("model", LogisticRegression(C=self.c, max_iter=2000, random_state=self.seed)),
            ]
        ).fit(texts, y)
        stats = TextStats().transform(texts)
        self.stats_scaler_ = StandardScaler().fit(stats)
        self.embedding_ = self.dense_stats_coef_ = self.dense_intercept_ = None
        if self.w_dense:
            embedding = StaticEmbedding().fit(texts)
            emb = embedding.transform(texts)
            emb_scaler = StandardScaler().fit(emb)
            x = np.hstack([self.stats_scaler_.transform(stats), emb_scaler.transform(emb)])
            dense = LogisticRegression(C=self.c_dense, max_iter=3000, random_state=self.seed)
            dense.fit(x, y)
            k = stats.shape[1]
            # fold the scaler and the weights into one weight per token: the artifact keeps a
            # vector
            token_weights = dense.coef_[0][k:] / emb_scaler.scale_
            self.embedding_ = embedding.fold(token_weights)
            self.dense_stats_coef_ = dense.coef_[0][:k]
            self.dense_intercept_ = float(dense.intercept_[0] - emb_scaler.mean_ @ token_weights)
        self.subject_ = self.subject_cols_ = self.subject_gain_ = None
        if self.w_subject or self.w_word:
            # which training subject the prompt looks like (a multinomial LR over the most
            # frequent word columns) × that subject's mean gain on the training prompts
            words = self._word_tfidf(texts)
            df = np.asarray((words > 0).sum(axis=0)).ravel()
            self.subject_cols_ = np.sort(np.argsort(-df, kind="stable")[: self.subject_features])
            subject = LogisticRegression(C=self.subject_c, max_iter=100, random_state=self.seed)
            subject.fit(words[:, self.subject_cols_], groups)
            # float32-representable weights: the artifact compresses ~2×, scores move by ~1e-7
            subject.coef_ = subject.coef_.astype(np.float32).astype(np.float64)
            self.subject_ = subject
            self.subject_gain_ = np.array([gains[groups == g].mean() for g in subject.classes_])
        self.boost_ = None
        if self.w_boost:
            self.boost_ = HistGradientBoostingClassifier(random_state=self.seed, **BOOST_SETTINGS)
            self.boost_.fit(stats, y)
        self.strong_ = None
        if self.w_strong:
            # the n-gram LR's own columns: the scorer computes them once for both regressions
            features = self.sparse_.named_steps["features"].transform(texts)
            self.strong_ = LogisticRegression(
                C=self.c_strong, max_iter=2000, random_state=self.seed
            ).fit(features, np.asarray(strong_fails, dtype=bool))
        self.word_ = self.word_scaler_ = self.word_center_ = self.word_class_ = None
        if self.w_word:
            # fitted on the domain's prompts only: among MMLU's ten times as many, what makes a
            # word problem hard would be a few weights in a model about something else
            domain = groups == self.word_domain
            if not domain.any():
                raise ValueError(
                    f"no training prompts of the word-problem domain {self.word_domain!r}"
                )
            x = np.array([word_problem_stats(t) for t, d in zip(texts, domain, strict=True) if d])
            self.word_scaler_ = StandardScaler().fit(x)
            scaled = self.word_scaler_.transform(x)
            self.word_ = LogisticRegression(C=self.c_word, max_iter=2000, random_state=self.seed)
            self.word_.fit(scaled, y[domain])
            # centred on the domain, so gate × logit is ~0 for a typical word problem, as
            # for any other prompt, and only what is harder or easier than usual moves the score
            self.word_center_ = float(self.word_.decision_function(scaled).mean())
            self.word_class_ = int(np.flatnonzero(self.subject_.classes_ == self.word_domain)[0])
        parts = self.parts(texts)
        self.center_ = parts.mean(axis=0)
        # an unfitted part's column is all 0: a spread of 1 keeps it 0
        spread = parts.std(axis=0)
        self.spread_ = np.where(self.fitted_parts, spread, 1.0)
        return self

    @property
    def fitted_parts(self) -> np.ndarray:
        """Which of the seven parts the model holds (the n-gram LR and the length always)."""
        fitted = (self.embedding_, self.subject_, self.boost_, self.strong_, self.word_)
        dense, subject, boost, strong, word = (part is not None for part in fitted)
        return np.array([True, dense, True, subject, boost, strong, word])

    def _word_tfidf(self, texts: list[str]) -> Any:
        return self.sparse_.named_steps["features"].transformer_list[0][1].transform(texts)

    def parts(self, texts: list[str]) -> np.ndarray:
        """The seven raw scores per prompt (0 for a part not fitted): n-gram logit, dense logit,
        log length, the expected gain of the training subjects the prompt resembles, the boosted
        trees' logit, the strong-fails logit and the word-problem part."""
        texts = list(texts)
        zeros = np.zeros(len(texts))
        features = self.sparse_.named_steps["features"].transform(texts)
        sparse = self.sparse_.named_steps["model"].decision_function(features)
        raw_stats = TextStats().transform(texts)
        dense = zeros
        if self.embedding_ is not None:
            stats = self.stats_scaler_.transform(raw_stats)
            dense = (
                self.dense_intercept_
                + stats @ self.dense_stats_coef_
                + self.embedding_.transform(texts)[:, 0]
            )
        length = np.log1p(np.array([len(t) for t in texts], dtype=float))
        subject = word = zeros
        if self.subject_ is not None:
            words = self._word_tfidf(texts)[:, self.subject_cols_]
            subject_p = self.subject_.predict_proba(words)
            subject = subject_p @ self.subject_gain_
            if self.word_ is not None:
                gate = _gate(subject_p[:, self.word_class_], self.word_gate)
                x = self.word_scaler_.transform([word_problem_stats(t) for t in texts])
                expert = self.word_.decision_function(x) - self.word_center_
                word = gate * expert
        boost = zeros if self.boost_ is None else self.boost_.decision_function(raw_stats)
        strong = zeros if self.strong_ is None else self.strong_.decision_function(features)
        return np.column_stack([sparse, dense, length, subject, boost, strong, word])

    @property
    def weights(self) -> np.ndarray:
        weights = np.array(
            [
                self.w_sparse,
                self.w_dense,
                self.w_length,
                self.w_subject,
                self.w_boost,
                self.w_strong,
                self.w_word,
            ],
            dtype=float,
        )
        if hasattr(self, "center_") and (weights[~self.fitted_parts] != 0).any():
            raise ValueError("a part fitted with weight 0 was not fitted: refit to weight it")
        return weights

    def decision_function(self, texts: list[str]) -> np.ndarray:
        return ((self.parts(texts) - self.center_) / self.spread_) @ self.weights

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        p = _sigmoid(self.decision_function(texts))
        return np.column_stack([1.0 - p, p])

    def predict(self, texts: list[str]) -> np.ndarray:
        return self.classes_[(self.decision_function(texts) >= 0).astype(int)]


# per-word n-gram lookups kept per character block; prompts reuse most words, so hits dominate
_WORD_CACHE_SIZE = 1 << 16
_WARM_WORDS = 20_000


@dataclass(frozen=True)
class _CompiledTfidf:
    analyzer: Callable[[str], list[str]]
    vocabulary: dict[str, int]
    idf: np.ndarray
    coef: np.ndarray  # the regressions' weights of this vectorizer's columns (columns × heads)
    # char_wb n-grams never cross a space: the prompt's n-grams are its words' n-grams, so each
    # word's known column ids can be looked up once and cached (set for "char_wb" blocks only)
    preprocess: Callable[[str], str] | None = None
    word_ids: Callable[[str], np.ndarray] | None = None
    # "word" blocks: the vectorizer's own preprocessor and tokenizer (a C regex), with the n-grams
    # joined through map/zip and counted by Counter in C, not the analyzer's Python loop
    tokenize: Callable[[str], list[str]] | None = None
    ngram_range: tuple[int, int] = (1, 1)

    def term_counts(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
        """Column ids of the prompt's known terms and how often each occurs."""
        if self.preprocess is not None and self.word_ids is not None:
            ids = list(map(self.word_ids, self.preprocess(prompt).split()))
            cols = np.concatenate(ids) if ids else np.empty(0, dtype=np.intp)
        else:
            if self.preprocess is not None and self.tokenize is not None:
                tokens = self.tokenize(self.preprocess(prompt))
                terms: list[str] = []
                low, high = self.ngram_range
                for n in range(low, high + 1):
                    grams = zip(*(tokens[i:] for i in range(n)), strict=False)
                    terms.extend(tokens if n == 1 else map(" ".join, grams))
            else:
                terms = self.analyzer(prompt)
            get = self.vocabulary.get
            cols = np.fromiter(map(get, terms, repeat(-1)), np.intp, count=len(terms))
            cols = cols[cols >= 0]
        # sorting-based counting in numpy: cheaper than a Counter over hundreds of terms
        idx, counts = np.unique(cols, return_counts=True)
        return idx, counts.astype(float)

    def tfidf(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
        """Column ids of the prompt's known terms and their sublinear TF-IDF (before the norm)."""
        idx, tf = self.term_counts(prompt)
        return idx, self.idf[idx] * (1.0 + np.log(tf))

    def dot(self, prompt: str) -> np.ndarray:
        """Sublinear TF-IDF of the prompt, L2-normalised, dotted with each head's weights."""
        return self.dot_tfidf(*self.tfidf(prompt))

    def dot_tfidf(self, idx: np.ndarray, w: np.ndarray) -> np.ndarray:
        if len(idx) == 0:
            return np.zeros(self.coef.shape[1])
        return w @ self.coef[idx] / math.sqrt(w @ w)

    @classmethod
    def from_vectorizer(cls, v: TfidfVectorizer, coef: np.ndarray) -> "_CompiledTfidf":
        if not (v.sublinear_tf and v.use_idf and v.norm == "l2" and not v.binary):
            # dot() implements exactly this configuration's arithmetic
            raise ValueError(f"cannot compile TF-IDF settings of {v!r}")
        analyzer = v.build_analyzer()
        vocabulary = dict(v.vocabulary_)
        preprocess = word_ids = tokenize = None
        if v.analyzer == "word" and v.get_stop_words() is None:
            preprocess, tokenize = v.build_preprocessor(), v.build_tokenizer()
        if v.analyzer == "char_wb":
            preprocess = v.build_preprocessor()

            @lru_cache(maxsize=_WORD_CACHE_SIZE)
            def word_ids(word: str) -> np.ndarray:
                # the analyzer on a lone (already preprocessed) word yields that word's n-grams
                known = [j for t in analyzer(word) if (j := vocabulary.get(t)) is not None]
                return np.array(known, dtype=np.intp)

        return cls(
            analyzer=analyzer,
            vocabulary=vocabulary,
            idf=v.idf_,
            coef=coef,
            preprocess=preprocess,
            word_ids=word_ids,
            tokenize=tokenize,
            ngram_range=tuple(v.ngram_range),
        )


def _warm_word_caches(blocks: list[_CompiledTfidf], words: TfidfVectorizer) -> None:
    """Fill the per-word caches of the character blocks with the most common words of the word
    vocabulary (lowest idf), so a prompt's first sighting of an ordinary word is a cache hit:
    a miss runs sklearn's n-gram analyzer in Python (~5 µs a word), which made the scoring
    latency's tail. ~0.1 s at load."""
    idf = words.idf_
    unigrams = sorted((idf[j], t) for t, j in words.vocabulary_.items() if " " not in t)
    common = [t for _, t in unigrams[:_WARM_WORDS]]
    for block in blocks:
        if block.word_ids is not None:
            for word in common:
                block.word_ids(word)


@dataclass(frozen=True)
class _CompiledNgrams:
    """The logistic regressions over the n-gram features (TF-IDF blocks and statistics), one
    head each: the escalate LR, then the strong-fails LR when the model has it. The prompt's
    TF-IDF is computed once; each further head costs one more column in the dot products."""

    tfidf: list[_CompiledTfidf]
    stats_mean: np.ndarray
    # the regression weights over the scaler's standard deviation: apply to the raw statistics
    stats_coef: np.ndarray  # (statistics × heads)
    intercept: np.ndarray

    @classmethod
    def from_pipeline(
        cls, pipeline: Pipeline, heads: list[LogisticRegression]
    ) -> "_CompiledNgrams":
        """heads: further regressions fitted on the pipeline's features."""
        *vectorizers, (_, stats) = pipeline.named_steps["features"].transformer_list
        models = [pipeline.named_steps["model"], *heads]
        coef = np.column_stack([m.coef_[0] for m in models])
        tfidf, start = [], 0
        for _, v in vectorizers:
            end = start + len(v.vocabulary_)
            tfidf.append(_CompiledTfidf.from_vectorizer(v, coef[start:end]))
            start = end
        _warm_word_caches(tfidf, vectorizers[0][1])
        scaler = stats.named_steps["scale"]
        return cls(
            tfidf=tfidf,
            stats_mean=scaler.mean_,
            stats_coef=coef[start:] / scaler.scale_[:, None],
            intercept=np.array([m.intercept_[0] for m in models]),
        )

    def logits(
        self, prompt: str, stats: np.ndarray, words: tuple[np.ndarray, np.ndarray]
    ) -> np.ndarray:
        """words: the first (word) block's tfidf(prompt), shared with the subject part."""
        stats_term = (stats - self.stats_mean) @ self.stats_coef
        first, *rest = self.tfidf
        ngrams = first.dot_tfidf(*words) + sum(t.dot(prompt) for t in rest)
        return self.intercept + ngrams + stats_term


@dataclass(frozen=True)
class _CompiledSubject:
    """softmax(intercept + coef · normalised word TF-IDF) · per-subject gain."""

    column: np.ndarray  # word-vocabulary column → the subject model's column, or -1
    coef_t: np.ndarray  # (subject columns × subjects), rows looked up per prompt
    intercept: np.ndarray
    gain: np.ndarray

    @classmethod
    def from_model(cls, model: BlendedRouter) -> "_CompiledSubject":
        n_words = len(model.sparse_.named_steps["features"].transformer_list[0][1].vocabulary_)
        column = np.full(n_words, -1, dtype=np.intp)
        column[model.subject_cols_] = np.arange(len(model.subject_cols_))
        return cls(
            column=column,
            coef_t=np.ascontiguousarray(model.subject_.coef_.T),
            intercept=model.subject_.intercept_,
            gain=model.subject_gain_,
        )

    def probabilities(self, idx: np.ndarray, w: np.ndarray) -> np.ndarray:
        """P(subject) for the prompt's word TF-IDF (column ids, weights before the norm)."""
        cols = self.column[idx]
        keep = cols >= 0
        logits = self.intercept.copy()
        if keep.any():
            wk = w[keep]
            # the norm is over all the word block's columns, as in the pipeline
            logits += (wk / math.sqrt(w @ w)) @ self.coef_t[cols[keep]]
        p = np.exp(logits - logits.max())
        return p / p.sum()


@dataclass(frozen=True)
class _CompiledTrees:
    """The boosted trees' logit, all trees walked together one level per step in numpy (~15 µs;
    sklearn's predictor costs ~0.3 ms per call, a Python walk over 300 trees more). The nodes of
    every tree are concatenated; a leaf points to itself, so `depth` steps end on every leaf."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    roots: np.ndarray
    depth: int
    baseline: float

    @classmethod
    def from_model(cls, model: HistGradientBoostingClassifier) -> "_CompiledTrees":
        # the fitted trees are private attributes (_predictors, _baseline_prediction); the tests
        # check this walk against decision_function, so a change in sklearn shows there
        nodes = [tree[0].nodes for tree in model._predictors]
        offsets = np.cumsum([0] + [len(n) for n in nodes[:-1]])
        every = np.concatenate(nodes)
        own = np.arange(len(every))
        leaf = every["is_leaf"].astype(bool)
        shift = np.repeat(offsets, [len(n) for n in nodes])
        if every["is_categorical"].any():
            raise ValueError("cannot compile categorical splits")
        return cls(
            feature=every["feature_idx"].astype(np.intp),
            threshold=every["num_threshold"].astype(float),
            left=np.where(leaf, own, every["left"].astype(np.intp) + shift),
            right=np.where(leaf, own, every["right"].astype(np.intp) + shift),
            value=every["value"].astype(float),
            roots=offsets.astype(np.intp),
            depth=int(every["depth"].max()),
            baseline=float(np.ravel(model._baseline_prediction)[0]),
        )

    def logit(self, x: np.ndarray) -> float:
        """x: the raw statistics (never NaN, so the trees' missing-value branches never apply)."""
        node = self.roots
        for _ in range(self.depth):
            go_left = x[self.feature[node]] <= self.threshold[node]
            node = np.where(go_left, self.left[node], self.right[node])
        return self.baseline + float(self.value[node].sum())


@dataclass(frozen=True)
class _CompiledDense:
    """The statistics + static-embedding LR, its embedding folded into one weight per token."""

    pieces: TokenPieces
    token_weights: np.ndarray
    stats_mean: np.ndarray
    stats_scale: np.ndarray
    stats_coef: np.ndarray
    intercept: float

    @classmethod
    def from_model(cls, model: BlendedRouter) -> "_CompiledDense":
        return cls(
            pieces=model.embedding_.pieces_,
            token_weights=np.ascontiguousarray(model.embedding_.table_[:, 0]),
            stats_mean=model.stats_scaler_.mean_,
            stats_scale=model.stats_scaler_.scale_,
            stats_coef=model.dense_stats_coef_,
            intercept=model.dense_intercept_,
        )

    def logit(self, prompt: str, stats: np.ndarray) -> float:
        ids = self.pieces.ids(prompt)
        tokens = float(np.mean(self.token_weights[ids])) if ids else 0.0
        scaled = (stats - self.stats_mean) / self.stats_scale
        return self.intercept + float(scaled @ self.stats_coef) + tokens


@dataclass(frozen=True)
class _CompiledWordProblem:
    """The word-problem expert's centred logit, its scaler folded into the weights; the caller
    multiplies it by the gate on the subject model's probability of the word-problem domain."""

    mean: np.ndarray
    coef: np.ndarray  # over the raw statistics: the regression's weights / the scaler's scale
    intercept: float  # the regression's intercept minus the domain's mean logit
    domain: int  # the domain's index among the subject model's classes
    gate_floor: float

    @classmethod
    def from_model(cls, model: BlendedRouter) -> "_CompiledWordProblem":
        return cls(
            mean=model.word_scaler_.mean_,
            coef=model.word_.coef_[0] / model.word_scaler_.scale_,
            intercept=float(model.word_.intercept_[0] - model.word_center_),
            domain=model.word_class_,
            gate_floor=model.word_gate,
        )

    def logit(self, prompt: str) -> float:
        return self.intercept + float(
            (np.asarray(word_problem_stats(prompt)) - self.mean) @ self.coef
        )


@dataclass(frozen=True)
class _Compiled:
    """The parts the model holds; a part fitted with weight 0 is None here and never computed
    (it adds exactly 0 to the pipeline's sum)."""

    ngrams: _CompiledNgrams
    dense: _CompiledDense | None
    subject: _CompiledSubject | None
    trees: _CompiledTrees | None
    has_strong: bool  # the strong-fails LR is the n-gram features' second head
    word: _CompiledWordProblem | None
    center: np.ndarray
    spread: np.ndarray
    weights: np.ndarray

    @classmethod
    def from_model(cls, model: BlendedRouter) -> "_Compiled":
        heads = [] if model.strong_ is None else [model.strong_]
        return cls(
            ngrams=_CompiledNgrams.from_pipeline(model.sparse_, heads),
            dense=None if model.embedding_ is None else _CompiledDense.from_model(model),
            subject=None if model.subject_ is None else _CompiledSubject.from_model(model),
            trees=None if model.boost_ is None else _CompiledTrees.from_model(model.boost_),
            has_strong=model.strong_ is not None,
            word=None if model.word_ is None else _CompiledWordProblem.from_model(model),
            center=model.center_,
            spread=model.spread_,
            weights=model.weights,
        )

    def logit(self, prompt: str) -> float:
        stats = np.asarray(text_stats(prompt))
        words = self.ngrams.tfidf[0].tfidf(prompt)
        ngrams = self.ngrams.logits(prompt, stats, words)
        subject = word = 0.0
        if self.subject is not None:
            p = self.subject.probabilities(*words)
            # computed even when weighted 0 (the model is there for the word part's gate), as
            # the pipeline does: a dot product over the subjects
            subject = float(p @ self.subject.gain)
            if self.word is not None:
                gate = float(_gate(p[self.word.domain], self.word.gate_floor))
                word = gate * self.word.logit(prompt) if gate > 0.0 else 0.0
        parts = np.array(
            [
                ngrams[0],
                0.0 if self.dense is None else self.dense.logit(prompt, stats),
                math.log1p(len(prompt)),
                subject,
                0.0 if self.trees is None else self.trees.logit(stats),
                ngrams[1] if self.has_strong else 0.0,
                word,
            ]
        )
        return float(((parts - self.center) / self.spread) @ self.weights)


@dataclass(frozen=True)
class ComplexityClassifier:
    pipeline: BlendedRouter
    metadata: dict[str, Any]
    compiled: _Compiled

    @classmethod
    def load(cls, path: Path | str = DEFAULT_ARTIFACT) -> "ComplexityClassifier":
        path = Path(path)
        metadata = json.loads(path.with_suffix(".json").read_text())
        if metadata["sklearn_version"] != sklearn.__version__:
            # the compiled scorer reads only vocabularies and weights, which are stable across
            # versions, so serving goes on; the tests (fast path == pipeline, report recomputed)
            # are what proves the artifact still scores as evaluated
            warnings.warn(
                f"{path.name} was trained with scikit-learn {metadata['sklearn_version']}, "
                f"this is {sklearn.__version__}; retrain with `tokenyard router train`",
                stacklevel=2,
            )
        pipeline = joblib.load(path)
        return cls(pipeline=pipeline, metadata=metadata, compiled=_Compiled.from_model(pipeline))

    @property
    def version(self) -> str:
        return str(self.metadata["version"])

    def score(self, prompt: str) -> float:
        """Probability-like score in [0, 1]: higher means the prompt more likely needs the
        strong model (the weak one fails where the strong one succeeds)."""
        z = self.compiled.logit(prompt)
        # the two branches keep exp() from overflowing on extreme logits
        if z >= 0:
            return 1.0 / (1.0 + math.exp(-z))
        e = math.exp(z)
        return e / (1.0 + e)

    def score_many(self, prompts: list[str]) -> np.ndarray:
        """The pipeline's own batch scoring: what training evaluated, and the fast path's check."""
        return self.pipeline.predict_proba(prompts)[:, 1]

    def threshold_for_strong_share(self, share: float) -> float:
        """The threshold that sends about `share` (0..1) of traffic to the strong model."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"strong share must be in [0, 1], got {share}")
        curve = self.metadata["threshold_curve"]
        return float(np.interp(share, curve["strong_share"], curve["threshold"]))

    def needs_strong(self, prompt: str, threshold: float) -> bool:
        return self.score(prompt) >= threshold
