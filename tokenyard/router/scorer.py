"""The complexity classifier at request time: a prompt's score, and how sure the router is of it.

A prompt is embedded (router/embedding.py: MiniLM's token vectors, distilled and projected), and
three numbers are read from the embedding and the prompt's length, each in standardised units:
- the model: a logistic regression over the embedding, fitted within each training domain (so it
  learns what makes a prompt of a domain harder than its neighbours, not which domain is hardest),
  plus `w_length` times the standardised log length;
- the prior: the standardised log length alone (the length rule, the safe fallback: on every
  domain seen it ranks prompts better than chance or close to it);
- the confidence: how close the prompt is to the training prompts, the lowest of three ramps: its
  cosine similarity to the nearest of the training embeddings' k-means centroids (1 at or above
  `sim_full`, most training prompts; 0 at or below `sim_none`); how far its mean token vector
  lies from the training prompts' mean (1 up to `norm_full`, 0 from `norm_none`: text made of
  tokens no benchmark prompt mixes, unknown scripts, symbol soup, lands far out even where its
  direction happens to match a centroid); and the share of its lines that are code
  (router/code_lines.py; 1 up to `code_full`, 0 from `code_none`): no training domain is code,
  and its tokens alone do not give it away.

The score is sigmoid(prior + confidence × (model − prior)): a prompt unlike anything in training
gets the prior's score exactly, and no prompt's score is ever further from the prior than the model
puts it. The policy compares the score with the team's threshold; a share of traffic turns into a
threshold with the curve calibrated at training time on validation prompts.
"""

import math
from dataclasses import dataclass

import numpy as np

from tokenyard.router.code_lines import code_share
from tokenyard.router.embedding import WordPieces, edges


@dataclass(frozen=True)
class RouteScore:
    score: float  # in (0, 1): higher, the prompt more likely needs the strong model
    confidence: float  # in [0, 1]: 0, the prompt is far from training and scored by the prior
    prior: float  # the length rule's score, what an unsure router falls back to
    # the prompt's view, stored for feedback: its embedding (CompiledScorer.projected) and the
    # share of its lines that are code
    projected: np.ndarray
    code: float


def _sigmoid(z: float) -> float:
    # the two branches keep exp() from overflowing on extreme logits
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@dataclass
class CompiledScorer:
    """Every array the score needs (what the artifact holds, besides the tokenizer)."""

    pieces: WordPieces
    table: np.ndarray  # vocab × dims: MiniLM's token vectors on the principal axes, float32
    center: np.ndarray  # subtracted from the mean token vector before normalising
    coef: np.ndarray  # the embedding LR's weights over the normalised embedding
    logit_mean: float  # the LR logit's mean and spread on the training prompts
    logit_std: float
    length_mean: float  # log(1 + characters): mean and spread on the training prompts
    length_std: float
    w_length: float
    centroids: np.ndarray  # k × dims, unit rows
    sim_none: float
    sim_full: float
    norm_full: float
    norm_none: float
    # the principal axes (dims × 384) and the training prompts' mean token vector: feedback rows,
    # stored as `projected` vectors, are mapped back to MiniLM's space to train the next model
    axes: np.ndarray
    raw_mean: np.ndarray
    code_full: float
    code_none: float

    def projected(self, prompt: str) -> np.ndarray:
        """The prompt's mean token vector on the principal axes, centred (not normalised); zeros
        for a prompt with no tokens."""
        ids = self.pieces.ids(prompt)
        if not ids:
            return np.zeros(self.table.shape[1])
        return self.table[ids].mean(axis=0, dtype=np.float64) - self.center

    def parts_of(self, v: np.ndarray, log_chars: float, code: float) -> tuple[float, float, float]:
        """(model, prior, confidence) in standardised units, from the projected embedding,
        log(1 + the prompt's characters) and the share of its lines that are code."""
        norm = math.sqrt(float(v @ v))
        e = v / norm if norm > 0 else v
        prior = (log_chars - self.length_mean) / self.length_std
        model = (float(e @ self.coef) - self.logit_mean) / self.logit_std + self.w_length * prior
        near = (float((self.centroids @ e).max()) - self.sim_none) / (self.sim_full - self.sim_none)
        inside = (self.norm_none - norm) / (self.norm_none - self.norm_full)
        prose = (self.code_none - code) / (self.code_none - self.code_full)
        confidence = min(max(min(near, inside, prose), 0.0), 1.0)
        return model, prior, confidence

    def route_score(self, prompt: str) -> RouteScore:
        # code is read where the embedding reads: the edges bound a long prompt's cost
        code = code_share(edges(prompt))
        return self.score_projected(self.projected(prompt), math.log1p(len(prompt)), code)

    def score_raw(self, raw: np.ndarray, log_chars: float, code: float) -> float:
        """The score of a prompt known by its mean MiniLM token vector (a rated request's)."""
        return self.score_projected((raw - self.raw_mean) @ self.axes.T, log_chars, code).score

    def score_projected(self, projected: np.ndarray, log_chars: float, code: float) -> RouteScore:
        """The score of a prompt known by its view alone: the projected embedding, length and
        code share."""
        model, prior, confidence = self.parts_of(projected, log_chars, code)
        return RouteScore(
            score=_sigmoid(prior + confidence * (model - prior)),
            confidence=confidence,
            prior=_sigmoid(prior),
            projected=projected,
            code=code,
        )

    def scores(self, prompts: list[str]) -> np.ndarray:
        return np.array([self.route_score(p).score for p in prompts])
