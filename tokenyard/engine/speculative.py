"""Speculative decoding: proposers of draft tokens, and when the scheduler asks for them.

A sequence with a draft of n tokens runs 1 + n tokens in the step (its last sampled token, then the
draft) as a small causal chunk over its cached context, in the same flattened forward pass as every
other sequence; the sampler then verifies the draft row by row (`Sampler.verify`). Reading the
weights dominates a decode step at small batch, so the extra rows cost little and every accepted
draft token is a token without a step of its own.

Proposals are deterministic (a point mass), which is what keeps the verification exact: see
`Sampler.verify`. A draft-model proposer (a smaller model of the same tokenizer) fits the same
interface if it proposes its own greedy continuation; it would need its own weights and KV pool
(blocks per sequence, allocated and rolled back alongside the target's), a forward pass of its own
per draft token before the target's step, and a GPU box to pay off. One that samples its drafts
would also have to hand its distributions to the verifier (accept with min(1, p/q)).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Proposer(Protocol):
    def propose(
        self,
        token_ids: list[int],
        max_tokens: int,
        prediction: Sequence[int] = (),
        produced: int = 0,
    ) -> list[int]:
        """Up to max_tokens tokens likely to follow token_ids (possibly none). `prediction`: the
        output the client expects (OpenAI's Predicted Outputs), of which the last `produced` of
        token_ids are the output so far."""
        ...


class NgramProposer:
    """Prompt lookup: find where the sequence's last tokens occurred before in its prompt and
    output, and propose what followed. Of the earlier occurrences of its last token, the one whose
    match reaches furthest back (up to max_ngram tokens) wins, the most recent on a tie: a longer
    match is surer to be the passage being copied (a line of code, a sentence) and not a phrase
    that recurs elsewhere. Pays off where the output copies its input: summaries, extractions,
    rewrites, code edits. A continuation that reaches the sequence's end goes on copying its own
    tokens, as an overlapping LZ77 copy does: text that repeats itself up to its end (a small
    model's loop, a table's rows) gets a full draft of the repetition, not what is left of it.

    A match of the last token alone is weak evidence: by default nothing is proposed below 2 (on
    the copy-heavy benchmark, 74% of draft tokens accepted against 65%, and 1.47-1.51x against
    1.40-1.43x in the same sittings; bench/RESULTS.md)."""

    def __init__(self, max_ngram: int = 8, min_ngram: int = 2):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(
        self,
        token_ids: list[int],
        max_tokens: int,
        prediction: Sequence[int] = (),
        produced: int = 0,
    ) -> list[int]:
        if prediction:
            begin = len(token_ids) - produced
            output = token_ids[begin:]
            # still on the prediction: its next tokens, whatever the last ones match elsewhere
            if produced < len(prediction) and output == list(prediction[:produced]):
                return list(prediction[produced : produced + max_tokens])
            # off it (an edit): it is searched as text the output came right after, so a match
            # there wins a tie with the prompt's (the later one does)
            token_ids = [*token_ids[:begin], *prediction, *output]
        tokens = np.asarray(token_ids)
        last = tokens.size - 1
        if last < 1:
            return []
        # earlier positions holding the last token (each with a token after it), and how far the
        # match of the sequence's end reaches back from each, grown one token at a time: one pass
        # over the sequence, then work only on the candidates
        ends = np.flatnonzero(tokens[:-1] == tokens[-1])
        if not ends.size:
            return []
        length = np.ones(ends.size, dtype=np.int64)
        for j in range(1, min(self.max_ngram, last)):
            grows = (length == j) & (ends >= j) & (tokens[ends - j] == tokens[last - j])
            if not grows.any():
                break
            length += grows
        longest = length.max()
        if longest < self.min_ngram:
            return []
        start = int(ends[length == longest][-1]) + 1
        count = max_tokens
        if prediction and begin <= start < begin + len(prediction):
            count = min(count, begin + len(prediction) - start)  # the prediction's end ends it
        period = len(token_ids) - start  # the continuation, repeated where it runs out
        return [token_ids[start + i % period] for i in range(count)]


@dataclass
class Speculation:
    """The scheduler's speculation settings."""

    proposer: Proposer
    num_tokens: int  # draft tokens per sequence and step, at most
    # no drafts in a step with more decodes than this: a larger batch makes the step's matmuls
    # compute-bound, and verifying drafts then costs more than the tokens it saves
    max_decodes: int
    # what one draft row adds to a one-row step's time, as a share of it (`draft_length`)
    row_cost: float
    # draft tokens per step, at most, of a request with a predicted output (its drafts come
    # mostly from the prediction: surer than a lookup); 0: predictions are not used
    predicted_tokens: int = 0

    def most(self, predicted: bool) -> int:
        """A sequence's longest draft."""
        return self.predicted_tokens if predicted else self.num_tokens


@dataclass
class Acceptance:
    """How a sequence's drafts fare: the chance that a draft token is accepted given the ones
    before it were, from its verified drafts (accepted tokens, and the rejection that ended a
    draft early). The counts decay at every decode, toward an even prior, so the estimate
    follows the text (a copied passage ends, another starts) and a sequence that stopped drafting
    tries again."""

    accepted: float = 0.0
    rejected: float = 0.0
    DECAY = 0.9

    @property
    def rate(self) -> float:
        return (1 + self.accepted) / (2 + self.accepted + self.rejected)

    def decay(self) -> None:
        self.accepted *= self.DECAY
        self.rejected *= self.DECAY

    def record(self, proposed: int, accepted: int) -> None:
        self.accepted += accepted
        self.rejected += accepted < proposed


# a draft row's cost as a share of a one-row step on CPU: a 5-row verify step costs 1.75x a
# one-row one on the quantized kernels (bench/RESULTS.md, issue 17)
CPU_ROW_COST = 0.2


def draft_length(rate: float, most: int, row_cost: float) -> int:
    """The draft length, 0 to `most`, that gives the most tokens per unit of step time: a draft
    of k tokens is expected to yield 1 + a + ... + a^k tokens (each accepted with chance a once
    the ones before it were) and costs 1 + row_cost * k one-row steps. Where rows cost (a CPU),
    drafts that are mostly rejected cost more than they save; where they are nearly free (a GPU),
    every draft pays."""
    best, best_gain, expected = 0, 1.0, 1.0
    for k in range(1, most + 1):
        expected += rate**k
        gain = expected / (1 + row_cost * k)
        if gain > best_gain:
            best, best_gain = k, gain
    return best
