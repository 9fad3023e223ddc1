"""Next-token choice: penalties, logit bias, grammar masks, temperature, top-k/top-p/min-p, seeded
sampling, logprobs (of sampled tokens and of a prompt's, `score_tokens`).

Penalties follow OpenAI (presence/frequency, over generated tokens; logit_bias added as given) and
vLLM (repetition, over prompt and generated tokens; min_tokens holds back EOS and stop tokens).
A constrained sequence's rows then lose every token its grammar forbids (engine/constraints.py).
Logprobs are those of the model's distribution after penalties, bias and mask, before temperature
and truncation (as vLLM reports).
Speculative drafts are verified here too (`verify`).
"""

from itertools import accumulate

import torch

from tokenyard.engine.constraints import Masks
from tokenyard.engine.outputs import Sampled
from tokenyard.engine.sequence import Sequence


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...], device: torch.device):
        self.eos_token_ids = eos_token_ids
        self.device = device
        self._generators: dict[int, torch.Generator] = {}  # per sequence, for seeded requests

    def forget(self, seq: Sequence) -> None:
        self._generators.pop(seq.seq_id, None)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[Sampled]:
        """logits [N, V] (fp32), one row per sequence that produces a token this step."""
        return [out[0] for out in self.verify(logits, seqs, [[] for _ in seqs])]

    def verify(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        drafts: list[list[int]],
        masks: Masks | None = None,
    ) -> list[list[Sampled]]:
        """The tokens each sequence emits: its accepted draft tokens, then one more.

        logits [sum(1 + len(draft)), V] (fp32): per sequence, in order, the rows of its last token
        and of each draft token. Row i is sampled as it would be without speculation (penalties
        counting the draft tokens before it) and the draft's token i is accepted while the sample
        equals it. For a deterministic proposal t that is rejection sampling: t is accepted with
        probability p(t), and a sample that differs is distributed as p without t, renormalised
        (the residual). So the output distribution is exact, greedy output is unchanged, and a
        seeded request draws one number per emitted token, as without speculation: the same seed
        gives the same tokens with or without it (up to floating-point noise in the logits).
        """
        ends = accumulate(1 + len(d) for d in drafts)
        spans = [range(end - 1 - len(d), end) for d, end in zip(drafts, ends, strict=True)]
        for seq, draft, span in zip(seqs, drafts, spans, strict=True):
            for i, row in enumerate(span):
                self._penalize(logits[row], seq, draft[:i])
        if masks is not None:
            masks.apply(logits)
        if masks is not None or any(s.request.params.allowed_token_ids for s in seqs):
            # a grammar, or allowed tokens all banned, that forbids every token of a row (a dead
            # end no check caught) ends that sequence at EOS rather than failing the step, and
            # every request in it, on a NaN
            stuck = ~torch.isfinite(logits).any(dim=-1)
            if stuck.any():
                logits[stuck, self.eos_token_ids[0]] = 0.0
        need_logprobs = any(s.request.params.logprobs is not None for s in seqs)
        logprobs = torch.log_softmax(logits, dim=-1) if need_logprobs else None
        greedy = logits.argmax(dim=-1).tolist()
        out = []
        for seq, draft, span in zip(seqs, drafts, spans, strict=True):
            params = seq.request.params
            emitted = []
            for i, row in enumerate(span):
                token = greedy[row] if params.greedy else self._sample(logits[row], seq)
                sampled = Sampled(token)
                if logprobs is not None and params.logprobs is not None:
                    sampled.logprob = logprobs[row, token].item()
                    if params.logprobs:
                        values, ids = logprobs[row].topk(params.logprobs)
                        sampled.top_logprobs = list(zip(ids.tolist(), values.tolist(), strict=True))
                emitted.append(sampled)
                if i == len(draft) or token != draft[i]:
                    break
            out.append(emitted)
        return out

    def _penalize(self, logits: torch.Tensor, seq: Sequence, ahead: list[int]) -> None:
        """ahead: draft tokens between the sequence's tokens and this row, counted as generated."""
        params = seq.request.params
        if params.repetition_penalty != 1.0:
            seen = torch.tensor(seq.token_ids + ahead, device=self.device).unique()
            scores = logits[seen]
            logits[seen] = torch.where(
                scores > 0, scores / params.repetition_penalty, scores * params.repetition_penalty
            )
        output = seq.output_ids + ahead
        if (params.presence_penalty or params.frequency_penalty) and output:
            ids, counts = torch.tensor(output, device=self.device).unique(return_counts=True)
            logits[ids] -= params.frequency_penalty * counts + params.presence_penalty
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), device=self.device)
            logits[ids] += torch.tensor(list(params.logit_bias.values()), device=self.device)
        if params.allowed_token_ids:
            allowed = torch.tensor(params.allowed_token_ids, device=self.device)
            kept = logits[allowed]
            logits.fill_(-float("inf"))
            logits[allowed] = kept
        for bad in params.bad_words_ids:
            if len(bad) == 1 or output[len(output) - len(bad) + 1 :] == bad[:-1]:
                logits[bad[-1]] = -float("inf")
        if len(output) < params.min_tokens:
            banned = list(params.stop_token_ids)
            if not params.ignore_eos:
                banned += self.eos_token_ids
            logits[banned] = -float("inf")

    def _sample(self, logits: torch.Tensor, seq: Sequence) -> int:
        params = seq.request.params
        logits = logits / params.temperature
        if 0 < params.top_k < logits.numel():
            kth = logits.topk(params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, -float("inf"))
        probs = logits.softmax(dim=-1)
        if params.min_p > 0:
            probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # drop a token once the mass before it already reaches top_p (the top one always stays)
            drop = (sorted_probs.cumsum(0) - sorted_probs) >= params.top_p
            drop[0] = False  # even for a top_p that rounds to 0 in the logits' dtype
            probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
        return int(torch.multinomial(probs, 1, generator=self._generator(seq)).item())

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        seed = seq.request.params.seed
        if seed is None:
            return None
        if seq.seq_id not in self._generators:
            # each of the n choices gets its own stream, reproducibly (the sum wraps: a seed
            # at the top of the 64-bit range takes n choices too)
            self._generators[seq.seq_id] = torch.Generator(self.device).manual_seed(
                (seed + seq.choice) % 2**64
            )
        return self._generators[seq.seq_id]


def score_tokens(logits: torch.Tensor, targets: list[int], top: int) -> list[Sampled]:
    """Each row's target token with its logprob under the model's distribution, and the row's `top`
    most likely tokens (0: none): a prompt's tokens scored, as OpenAI's echo reports them."""
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(targets, device=logits.device)[:, None])
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    scored = [
        Sampled(t, lp, None, rank)
        for t, lp, rank in zip(targets, chosen[:, 0].tolist(), ranks, strict=True)
    ]
    if top:
        values, ids = logprobs.topk(top, dim=-1)
        for s, i, v in zip(scored, ids.tolist(), values.tolist(), strict=True):
            s.top_logprobs = list(zip(i, v, strict=True))
    return scored
