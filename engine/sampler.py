"""Next-token choice: penalties, temperature, top-k/top-p/min-p, seeded sampling, logprobs.

Penalties follow OpenAI (presence/frequency, over generated tokens) and vLLM (repetition, over
prompt and generated tokens; min_tokens holds back EOS and stop tokens). Logprobs are those of
the model's distribution after penalties, before temperature and truncation (as vLLM reports).
"""

from dataclasses import dataclass

import torch

from engine.sequence import Sequence


@dataclass
class Sampled:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...], device: torch.device):
        self.eos_token_ids = eos_token_ids
        self.device = device
        self._generators: dict[int, torch.Generator] = {}  # per sequence, for seeded requests

    def forget(self, seq: Sequence) -> None:
        self._generators.pop(seq.seq_id, None)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[Sampled]:
        """logits [N, V] (fp32), one row per sequence that produces a token this step."""
        for row, seq in enumerate(seqs):
            self._penalize(logits[row], seq)
        need_logprobs = any(s.request.params.logprobs is not None for s in seqs)
        logprobs = torch.log_softmax(logits, dim=-1) if need_logprobs else None
        greedy = logits.argmax(dim=-1).tolist()
        out = []
        for row, seq in enumerate(seqs):
            params = seq.request.params
            token = greedy[row] if params.greedy else self._sample(logits[row], seq)
            sampled = Sampled(token)
            if logprobs is not None and params.logprobs is not None:
                sampled.logprob = logprobs[row, token].item()
                if params.logprobs:
                    values, ids = logprobs[row].topk(params.logprobs)
                    sampled.top_logprobs = list(zip(ids.tolist(), values.tolist(), strict=True))
            out.append(sampled)
        return out

    def _penalize(self, logits: torch.Tensor, seq: Sequence) -> None:
        params = seq.request.params
        if params.repetition_penalty != 1.0:
            seen = torch.tensor(seq.token_ids, device=self.device).unique()
            scores = logits[seen]
            logits[seen] = torch.where(
                scores > 0, scores / params.repetition_penalty, scores * params.repetition_penalty
            )
        if (params.presence_penalty or params.frequency_penalty) and seq.output_ids:
            ids, counts = torch.tensor(seq.output_ids, device=self.device).unique(
                return_counts=True
            )
            logits[ids] -= params.frequency_penalty * counts + params.presence_penalty
        if len(seq.output_ids) < params.min_tokens:
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
            # each of the n choices gets its own stream, reproducibly
            self._generators[seq.seq_id] = torch.Generator(self.device).manual_seed(
                seed + seq.choice
            )
        return self._generators[seq.seq_id]
