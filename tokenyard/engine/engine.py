"""The step loop: schedule, run one flattened forward pass (engine/model_runner.py), sample
(verifying speculative drafts), detokenize, account."""

import itertools
import time

import torch

from tokenyard.engine.config import EngineConfig
from tokenyard.engine.constraints import Constraints, SchemaError
from tokenyard.engine.detokenizer import IncrementalText
from tokenyard.engine.kv_cache import BlockManager
from tokenyard.engine.loader import resolve_model_path
from tokenyard.engine.metrics import EngineMetrics
from tokenyard.engine.model_runner import ModelRunner
from tokenyard.engine.outputs import RequestError, RequestOutput, Sampled, SeqStats
from tokenyard.engine.sampler import Sampler
from tokenyard.engine.scheduler import ScheduledBatch, Scheduler
from tokenyard.engine.sequence import GenerationRequest, SeqStatus, Sequence
from tokenyard.engine.speculative import CPU_ROW_COST, NgramProposer, Speculation
from tokenyard.engine.tokenizer import Tokenizer


class LLMEngine:
    """Synchronous core; AsyncEngine drives it from one thread."""

    def __init__(self, config: EngineConfig):
        self.config = config
        path = resolve_model_path(config.model)
        self.runner = ModelRunner(config, path)
        for name, adapter_path in config.lora_modules.items():
            self.runner.adapters.add(name, adapter_path)
        self.model_config = self.runner.model_config
        self.max_model_len = self.runner.max_model_len
        self.block_size = self.runner.block_size
        self.tokenizer = Tokenizer.load(path, self.model_config.eos_token_ids, config.cache_dir)
        self.blocks = BlockManager(
            self.runner.num_blocks, self.block_size, config.enable_prefix_caching
        )
        speculation = None
        if config.speculative_tokens or config.prediction_tokens:
            row_cost = config.speculative_row_cost
            if row_cost is None:
                row_cost = CPU_ROW_COST if self.runner.device.type == "cpu" else 0.0
            speculation = Speculation(
                NgramProposer(),
                config.speculative_tokens,
                config.speculative_max_decodes,
                row_cost,
                config.prediction_tokens,
            )
        self.scheduler = Scheduler(
            self.blocks,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            config.preempt_batch_for_interactive,
            speculation,
        )
        self.sampler = Sampler(self.tokenizer.eos_token_ids, self.runner.device)
        self.constraints = Constraints(
            self.tokenizer.hf,
            self.model_config.vocab_size,
            self.tokenizer.eos_token_ids,
            self.runner.device,
        )
        self.model_name = config.served_model_name or config.model
        self.metrics = EngineMetrics(self.model_name)
        self._seq_ids = itertools.count()
        self._requests: dict[str, list[Sequence]] = {}
        self._texts: dict[int, IncrementalText] = {}
        self._seen_queries = self._seen_hits = 0  # prefix-cache counters already exported
        self._stepping: ScheduledBatch | None = None  # the step under way, for fail_step
        self._publish_load()

    # ------------------------------------------------------------ requests

    def validate(self, request: GenerationRequest) -> None:
        """Raise RequestError for a request that could never be served."""
        prompt, params = len(request.prompt_ids), request.params
        if prompt == 0:
            raise RequestError("the prompt is empty", "prompt")
        vocab = self.model_config.vocab_size
        # token ids from the client (a completion's prompt may be ids): one out of range would
        # fail the whole step, every other request in it too
        if not 0 <= min(request.prompt_ids) <= max(request.prompt_ids) < vocab:
            raise RequestError(f"prompt: token ids must be in [0, {vocab})", "prompt")
        if prompt + params.max_tokens > self.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {prompt + params.max_tokens} tokens ({prompt} in the prompt, "
                f"{params.max_tokens} for the completion). Please reduce the length of the prompt "
                "or of max_tokens.",
                "messages",
                "context_length_exceeded",
            )
        if self.blocks.blocks_needed(prompt + params.max_tokens) > self.blocks.num_blocks:
            capacity = self.blocks.num_blocks * self.block_size
            raise RequestError(
                f"prompt plus max_tokens ({prompt + params.max_tokens} tokens) is more than this "
                f"engine's KV cache can ever hold ({capacity} tokens)",
                "max_tokens",
                "kv_cache_capacity_exceeded",
            )
        for param, tokens in (
            ("logit_bias", params.logit_bias),
            ("stop_token_ids", params.stop_token_ids),
            ("allowed_token_ids", params.allowed_token_ids),
        ):
            if any(not 0 <= token < vocab for token in tokens):
                raise RequestError(f"{param}: token ids must be in [0, {vocab})", param)
        if params.constraint is not None:
            if params.min_tokens:
                raise RequestError(
                    "min_tokens cannot be combined with response_format or a forced tool call "
                    "(the grammar may end the output before)",
                    "min_tokens",
                )
            try:
                self.constraints.compile(params.constraint)  # cached: once per schema
            except SchemaError as exc:
                raise RequestError(
                    f"{params.constraint.param}: {exc}", params.constraint.param, "invalid_schema"
                ) from None

    def add_request(self, request: GenerationRequest) -> None:
        self.validate(request)
        if request.request_id in self._requests:
            raise RequestError(f"request id {request.request_id!r} is in flight", "request_id")
        seqs = [
            Sequence(next(self._seq_ids), request, choice, list(request.prompt_ids))
            for choice in range(request.n)
        ]
        self._requests[request.request_id] = seqs
        for seq in seqs:
            self._texts[seq.seq_id] = IncrementalText(
                list(request.params.stop), request.params.include_stop_str_in_output
            )
            self.constraints.start(seq.seq_id, request.params.constraint)
        self.scheduler.add_choices(seqs)
        self._publish_load()

    def abort(self, request_id: str) -> None:
        """The client is gone: free its sequences now, report nothing more."""
        for seq in self._requests.pop(request_id, []):
            if seq.status != SeqStatus.FINISHED:
                self.scheduler.finish(seq, "cancelled")
            self._forget(seq)
        self._publish_load()

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def load(self) -> dict:
        """What this replica reports for routing (/load). The server's thread reads it while the
        engine's thread steps: a snapshot that thread publishes after every change (one reference
        assignment), never the live queues, whose dicts may grow mid-iteration."""
        return self._load

    def _publish_load(self) -> None:
        self._load = {
            "model": self.model_name,
            "block_size": self.block_size,
            "total_blocks": self.blocks.num_blocks,
            "free_blocks": self.blocks.num_free,
            "running": len(self.scheduler.running),
            "waiting": self.scheduler.num_waiting,
            "tokens_queued": self.scheduler.waiting_tokens(),
            "max_model_len": self.max_model_len,
        }

    # ------------------------------------------------------------ one step

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        self._stepping = None  # what fail_step ends if this step raises
        batch = self._stepping = self.scheduler.schedule()
        # a request whose prefill this step runs is running (and holds its blocks) for /load
        # while the step lasts, not only once its first token is out
        self._publish_load()
        if not batch.items:
            return []
        start = time.perf_counter()
        for seq, _ in batch.items:
            if seq.timings.first_scheduled is None:
                seq.timings.first_scheduled = start - seq.request.arrival
        step = self.runner.prepare(batch)
        producing = step.producing
        # the grammar masks may fill while the forward pass runs
        masks = self.constraints.masks([seq.seq_id for seq in producing], step.drafts)
        out = self.runner.run(step)
        for part, scored in zip(step.scoring, out.scored, strict=True):
            part.seq.prompt_logprobs += scored
        masks = masks.result() if masks else None
        emitted = []
        if step.rows:
            emitted = self.sampler.verify(out.logits, producing, step.drafts, masks)
        now = time.perf_counter()
        # how many of its draft tokens each speculating sequence kept (the rest were rejected)
        kept = {s: len(e) - 1 for s, e in zip(producing, emitted, strict=True) if s in batch.drafts}
        self.scheduler.update_from_output(batch, kept)
        self._account(batch, kept, now - start)
        outputs = [self._append(seq, e, now) for seq, e in zip(producing, emitted, strict=True)]
        self._update_gauges(len(batch.preempted))
        self._publish_load()
        return outputs

    def _account(self, batch: ScheduledBatch, kept: dict[Sequence, int], elapsed: float) -> None:
        """Split the step's wall time across its sequences by tokens processed; count drafts."""
        for seq, num_new in batch.items:
            seq.timings.compute += elapsed * num_new / batch.num_tokens
            draft = batch.drafts.get(seq)
            if draft:
                self.metrics.spec_proposed.inc(len(draft))
                self.metrics.spec_accepted.inc(kept[seq])
            if seq.num_computed >= seq.num_prompt and seq.timings.prefill_done is None:
                seq.timings.prefill_done = time.perf_counter() - seq.request.arrival

    def _append(self, seq: Sequence, emitted: list[Sampled], now: float) -> RequestOutput:
        """Add a step's tokens to the sequence until one finishes it (later ones are dropped)."""
        params, timings = seq.request.params, seq.timings
        text = self._texts[seq.seq_id]
        out = RequestOutput(seq.request.request_id, seq.choice, "")
        if params.prompt_logprobs is not None and not seq.output_ids:  # its first output
            out.prompt_logprobs = seq.prompt_logprobs
        elapsed = now - seq.request.arrival
        finish = None
        if params.max_tokens == 0:  # the prompt was only to be read: the sample is not kept
            emitted, finish = [], "length"
        for sampled in emitted:
            token = sampled.token_id
            seq.token_ids.append(token)
            out.token_ids.append(token)
            out.logprobs.append(sampled)
            # tokens of one step arrive together: the gaps after the first are zero
            if timings.first_token is None:
                timings.first_token = elapsed
            else:
                timings.token_gaps.append(elapsed - timings.last_token)
            timings.last_token = elapsed
            is_eos = token in self.tokenizer.eos_token_ids and not params.ignore_eos
            grammar_done = self.constraints.accept(seq.seq_id, token)
            if is_eos or token in params.stop_token_ids or grammar_done:
                finish = "stop"
                if not is_eos and token in params.stop_token_ids:
                    out.stop_reason = token
            else:
                out.text += text.add(
                    lambda ids: self.tokenizer.decode(ids, params.skip_special_tokens),
                    seq.output_ids,
                )
                if text.stopped:
                    finish, out.stop_reason = "stop", text.matched
            if finish is None and (
                len(seq.output_ids) >= params.max_tokens or seq.num_tokens >= self.max_model_len
            ):
                finish = "length"
            if finish is not None:
                break
        if finish is not None:
            out.text += text.flush()
            self.scheduler.finish(seq, finish)
            out.finish_reason, out.stats = finish, self._stats(seq)
            self._finished(seq)
        return out

    def _stats(self, seq: Sequence) -> SeqStats:
        t = seq.timings
        first = t.first_scheduled or 0.0
        stats = SeqStats(
            prompt_tokens=seq.num_prompt,
            cached_tokens=max(seq.num_cached, 0),
            completion_tokens=len(seq.output_ids),
            queue=first,
            prefill=(t.prefill_done or first) - first,
            ttft=t.first_token or 0.0,
            e2e=t.last_token or 0.0,
            compute=t.compute,
            token_gaps=t.token_gaps,
            preemptions=seq.preemptions,
            predicted_tokens=len(seq.request.prediction),
            accepted_prediction_tokens=seq.draft_tokens_kept if seq.request.prediction else 0,
        )
        adapter = seq.request.adapter  # an adapter's requests are its own series
        labels = (adapter.name if adapter else self.model_name, seq.priority.name.lower())
        self.metrics.ttft.labels(*labels).observe(stats.ttft)
        self.metrics.e2e.labels(*labels).observe(stats.e2e)
        self.metrics.queue.labels(*labels).observe(stats.queue)
        itl = self.metrics.itl.labels(*labels)
        for gap in stats.token_gaps:
            itl.observe(gap)
        self.metrics.tokens.labels(*labels).inc(stats.completion_tokens)
        return stats

    def _finished(self, seq: Sequence) -> None:
        self._forget(seq)
        seqs = self._requests.get(seq.request.request_id, [])
        if all(s.status == SeqStatus.FINISHED for s in seqs):
            self._requests.pop(seq.request.request_id, None)

    def _forget(self, seq: Sequence) -> None:
        self._texts.pop(seq.seq_id, None)
        self.sampler.forget(seq)
        self.constraints.forget(seq.seq_id)

    def _update_gauges(self, preempted: int) -> None:
        m = self.metrics
        m.kv_usage.set(1 - self.blocks.num_free / self.blocks.num_blocks)
        m.running.set(len(self.scheduler.running))
        m.waiting.set(self.scheduler.num_waiting)
        if preempted:
            m.preemptions.inc(preempted)
        queries, hits = self.blocks.prefix_queries, self.blocks.prefix_hits
        m.prefix_queries.inc(queries - self._seen_queries)
        m.prefix_hits.inc(hits - self._seen_hits)
        self._seen_queries, self._seen_hits = queries, hits

    def fail_step(self, reason: str = "error") -> list[RequestOutput]:
        """After an unexpected error in a step: end the requests that took part in it (their state
        is unknown then, and one of them may be what failed). The others, waiting or not in the
        step, go on; an error before the step was planned ends every request. Each choice of an
        ended request gets `reason`, one that finished in the failed step too (its output never
        left)."""
        batch, self._stepping = self._stepping, None
        if batch is None:
            ended = dict(self._requests)
        else:
            ended = {}
            for seq, _ in batch.items:
                rid = seq.request.request_id
                ended[rid] = self._requests.get(rid) or [*ended.get(rid, []), seq]
        outputs = []
        for rid, seqs in ended.items():
            self._requests.pop(rid, None)
            for seq in seqs:
                if seq.status != SeqStatus.FINISHED:
                    self.scheduler.finish(seq, reason)
                out = RequestOutput(rid, seq.choice, "", finish_reason=reason)
                out.stats = self._stats(seq)
                outputs.append(out)
                self._forget(seq)
        self._publish_load()
        return outputs
