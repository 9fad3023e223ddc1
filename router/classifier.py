"""Runtime scorer: loads the shipped artifact and scores one prompt, no model call involved.

scikit-learn's per-call overhead (validation, sparse matrix assembly) is ~2 ms for one prompt,
so `load` compiles the fitted pipeline — TF-IDF blocks and text statistics into a logistic
regression — into dictionary lookups and sums; `score` computes the same number (the tests check
it against `predict_proba`) in about a tenth of a millisecond for a typical prompt.

The routing policy calls `score(prompt)` and compares it with a threshold; a team's threshold can
be given as the share of traffic it wants on the strong model, which `threshold_for_strong_share`
turns into a score using the curve calibrated on validation prompts at training time.
"""

import json
import math
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import sklearn
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import Pipeline

from router.features import text_stats

DEFAULT_ARTIFACT = Path(__file__).parent / "artifacts" / "complexity-v1.joblib"


# per-word n-gram lookups kept per character block; prompts reuse most words, so hits dominate
_WORD_CACHE_SIZE = 1 << 16


@dataclass(frozen=True)
class _CompiledTfidf:
    analyzer: Callable[[str], list[str]]
    vocabulary: dict[str, int]
    idf: np.ndarray
    coef: np.ndarray  # the regression weights of this vectorizer's columns
    # char_wb n-grams never cross a space: the prompt's n-grams are its words' n-grams, so each
    # word's known column ids can be looked up once and cached (set for "char_wb" blocks only)
    preprocess: Callable[[str], str] | None = None
    word_ids: Callable[[str], tuple[int, ...]] | None = None

    def term_counts(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
        """Column ids of the prompt's known terms and how often each occurs."""
        if self.preprocess is not None and self.word_ids is not None:
            ids: Counter[int] = Counter()
            for word in self.preprocess(prompt).split():
                ids.update(self.word_ids(word))
        else:
            get = self.vocabulary.get
            terms = Counter(self.analyzer(prompt))
            ids = Counter({j: c for t, c in terms.items() if (j := get(t)) is not None})
        n = len(ids)
        return (
            np.fromiter(ids.keys(), dtype=np.intp, count=n),
            np.fromiter(ids.values(), dtype=float, count=n),
        )

    def dot(self, prompt: str) -> float:
        """Sublinear TF-IDF of the prompt, L2-normalised, dotted with the weights."""
        idx, tf = self.term_counts(prompt)
        if len(idx) == 0:
            return 0.0
        w = self.idf[idx] * (1.0 + np.log(tf))
        return float(self.coef[idx] @ w / math.sqrt(w @ w))

    @classmethod
    def from_vectorizer(cls, v: TfidfVectorizer, coef: np.ndarray) -> "_CompiledTfidf":
        if not (v.sublinear_tf and v.use_idf and v.norm == "l2" and not v.binary):
            # dot() implements exactly this configuration's arithmetic
            raise ValueError(f"cannot compile TF-IDF settings of {v!r}")
        analyzer = v.build_analyzer()
        vocabulary = dict(v.vocabulary_)
        preprocess = word_ids = None
        if v.analyzer == "char_wb":
            preprocess = v.build_preprocessor()

            @lru_cache(maxsize=_WORD_CACHE_SIZE)
            def word_ids(word: str) -> tuple[int, ...]:
                # the analyzer on a lone (already preprocessed) word yields that word's n-grams
                return tuple(j for t in analyzer(word) if (j := vocabulary.get(t)) is not None)

        return cls(
            analyzer=analyzer,
            vocabulary=vocabulary,
            idf=v.idf_,
            coef=coef,
            preprocess=preprocess,
            word_ids=word_ids,
        )


@dataclass(frozen=True)
class _Compiled:
    tfidf: list[_CompiledTfidf]
    stats_mean: np.ndarray
    # the regression weight over the scaler's standard deviation: applies to the raw statistic
    stats_coef: np.ndarray
    intercept: float

    @classmethod
    def from_pipeline(cls, pipeline: Pipeline) -> "_Compiled":
        *vectorizers, (_, stats) = pipeline.named_steps["features"].transformer_list
        model = pipeline.named_steps["model"]
        coef = model.coef_[0]
        tfidf, start = [], 0
        for _, v in vectorizers:
            end = start + len(v.vocabulary_)
            tfidf.append(_CompiledTfidf.from_vectorizer(v, coef[start:end]))
            start = end
        scaler = stats.named_steps["scale"]
        return cls(
            tfidf=tfidf,
            stats_mean=scaler.mean_,
            stats_coef=coef[start:] / scaler.scale_,
            intercept=float(model.intercept_[0]),
        )

    def logit(self, prompt: str) -> float:
        stats = float(np.dot(np.asarray(text_stats(prompt)) - self.stats_mean, self.stats_coef))
        return self.intercept + sum(t.dot(prompt) for t in self.tfidf) + stats


@dataclass(frozen=True)
class ComplexityClassifier:
    pipeline: Pipeline
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
        return cls(pipeline=pipeline, metadata=metadata, compiled=_Compiled.from_pipeline(pipeline))

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
