"""Iteration-level scheduling: which sequences run in the next step, and how many tokens each.

Every step takes all running decodes, then prefill chunks within the token budget (chunked
prefill). Waiting sequences are admitted by free KV blocks, interactive before batch and, within a
class, the tenant with the fewest running sequences first. When blocks run out, the lowest-priority,
latest-arrived running sequence is preempted (its blocks freed, recomputed later), so interactive
work is never preempted for batch work. With speculation on, decodes then take draft tokens to
verify, in whatever budget and free blocks are left. A request's n choices share one reading of
its prompt: the others wait until the first has computed it, then start from its cached blocks.
"""

from collections import deque
from dataclasses import dataclass, field

from tokenyard.engine.kv_cache import BlockManager
from tokenyard.engine.sequence import Priority, SeqStatus, Sequence
from tokenyard.engine.speculative import Speculation, draft_length


@dataclass
class ScheduledBatch:
    items: list[tuple[Sequence, int]]  # (sequence, new tokens this step); decodes first
    num_decodes: int
    preempted: list[Sequence] = field(default_factory=list)
    # a speculating sequence's draft: the last of its new tokens (its slots are allocated)
    drafts: dict[Sequence, list[int]] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        preempt_batch_for_interactive: bool = True,
        speculation: Speculation | None = None,
    ):
        self.blocks = blocks
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.preempt_batch_for_interactive = preempt_batch_for_interactive
        self.speculation = speculation
        # per priority class, per tenant, a FIFO of waiting sequences
        self.waiting: dict[Priority, dict[str, deque[Sequence]]] = {p: {} for p in Priority}
        self.running: list[Sequence] = []
        # a request's first choice → its other choices, held until it has read the prompt
        self.held: dict[Sequence, list[Sequence]] = {}
        self.num_preemptions = 0
        self._admissions = 0
        self._tenant_last_admitted: dict[str, int] = {}

    # ------------------------------------------------------------ queues

    def add(self, seq: Sequence, front: bool = False) -> None:
        seq.status = SeqStatus.WAITING
        queue = self.waiting[seq.priority].setdefault(seq.tenant, deque())
        queue.appendleft(seq) if front else queue.append(seq)

    def add_choices(self, seqs: list[Sequence]) -> None:
        """A request's n choices. Where the prompt fills a cached block, all but the first wait
        until the first has computed the prompt, then find it in the prefix cache: the prompt is
        read once, not n times (the last partial block excepted), as vLLM forks parallel
        samples."""
        first, *rest = seqs
        self.add(first)
        shares = self.blocks.enable_prefix_caching and first.num_prompt > self.blocks.block_size
        if rest and shares:
            self.held[first] = rest
            for seq in rest:
                seq.status = SeqStatus.WAITING
        else:
            for seq in rest:
                self.add(seq)

    def _release_held(self, first: Sequence) -> None:
        """The first choice has read the prompt (or ended): the others join the queue's front, in
        order. Its scores of the prompt are theirs too, so none of them reads it again."""
        for seq in reversed(self.held.pop(first, [])):
            seq.prompt_logprobs = list(first.prompt_logprobs)
            self.add(seq, front=True)

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for tenants in self.waiting.values() for q in tenants.values())

    def waiting_tokens(self) -> int:
        return sum(
            s.num_tokens - s.num_computed
            for tenants in self.waiting.values()
            for q in tenants.values()
            for s in q
        )

    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def _next_waiting(self) -> Sequence | None:
        """Highest class first; within it, the tenant with the fewest running sequences."""
        for priority in Priority:
            tenants = [t for t, q in self.waiting[priority].items() if q]
            if not tenants:
                continue
            running = {t: 0 for t in tenants}
            for seq in self.running:
                if seq.priority == priority and seq.tenant in running:
                    running[seq.tenant] += 1
            tenant = min(tenants, key=lambda t: (running[t], self._tenant_last_admitted.get(t, -1)))
            return self.waiting[priority][tenant][0]
        return None

    def _pop_waiting(self, seq: Sequence) -> None:
        queue = self.waiting[seq.priority][seq.tenant]
        queue.popleft()
        if not queue:
            del self.waiting[seq.priority][seq.tenant]
        self._admissions += 1
        self._tenant_last_admitted[seq.tenant] = self._admissions

    # ------------------------------------------------------------ lifecycle

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks a waiting sequence may start from: none while its prompt is still
        to be scored (the scores come from the rows computed)."""
        return [] if seq.scoring_prompt else self.blocks.match_prefix(seq.token_ids, seq.cache_root)

    def preempt(self, seq: Sequence) -> None:
        """Free its blocks; it goes back to the front of its queue and is recomputed later."""
        self.running.remove(seq)
        self.blocks.release(seq.table)
        seq.num_computed = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.add(seq, front=True)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self._release_held(seq)  # ended before its prompt was read: the others read it
        held = next((rest for rest in self.held.values() if seq in rest), None)
        if held is not None:
            held.remove(seq)
        elif seq.status == SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SeqStatus.WAITING:
            queue = self.waiting[seq.priority][seq.tenant]
            queue.remove(seq)
            if not queue:
                del self.waiting[seq.priority][seq.tenant]
        seq.status = SeqStatus.FINISHED
        self.blocks.release(seq.table)

    # ------------------------------------------------------------ one step

    def schedule(self) -> ScheduledBatch:
        preempted = self._make_room_for_interactive() if self.preempt_batch_for_interactive else []
        budget = self.max_num_batched_tokens
        scheduled: dict[Sequence, int] = {}

        # 1. running sequences: decodes first (one token each), then prefill chunks, each in order
        out_of_blocks = False
        line = sorted(self.running, key=lambda s: (s.num_tokens - s.num_computed > 1, s.order))
        for seq in line:
            if not budget:
                break
            if seq.status != SeqStatus.RUNNING:  # preempted below as someone's victim
                continue
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            while not self.blocks.can_grow(seq.table, seq.num_computed + num_new):
                out_of_blocks = True
                later = [s for s in self.running if s.order > seq.order]
                victim = max(later, key=lambda s: s.order) if later else seq
                budget += scheduled.pop(victim, 0)
                self.preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SeqStatus.RUNNING:
                continue
            self.blocks.grow(seq.table, seq.num_computed + num_new)
            scheduled[seq] = num_new
            budget -= num_new

        # 2. admit waiting sequences while blocks, slots and budget last (not when blocks just
        # ran out: the preempted deserve the room first)
        while not out_of_blocks and budget and len(self.running) < self.max_num_seqs:
            seq = self._next_waiting()
            if seq is None:
                break
            matched = self._cached_prefix(seq)
            cached = len(matched) * self.blocks.block_size
            num_new = min(seq.num_tokens - cached, budget)
            if not self.blocks.can_adopt(matched, cached + num_new):
                break
            self._pop_waiting(seq)
            self.blocks.adopt_prefix(seq.table, matched, seq.num_prompt, seq.cache_root)
            if seq.num_cached < 0:
                seq.num_cached = min(cached, seq.num_prompt)
            seq.num_computed = cached
            self.blocks.grow(seq.table, cached + num_new)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            scheduled[seq] = num_new
            budget -= num_new

        # 3. drafts for the decodes to verify, last: they never delay a prefill or preempt anyone
        drafts = self._draft(self.speculation, scheduled, budget) if self.speculation else {}

        # decodes first, shortest context first (attention batches decodes of similar length);
        # a speculating sequence's 1 + n tokens run as a small prefill chunk
        items = sorted(
            scheduled.items(), key=lambda it: (it[1] != 1, it[0].num_tokens * (it[1] == 1))
        )
        num_decodes = sum(1 for _, n in items if n == 1)
        return ScheduledBatch(items, num_decodes, preempted, drafts)

    def update_from_output(self, batch: ScheduledBatch, accepted: dict[Sequence, int]) -> None:
        """After the step's forward pass: each sequence has computed its new tokens, less the
        draft tokens the sampler rejected (`accepted`: how many of each draft it kept). Rejected
        tokens' slots go back (their K/V is never read); full blocks of computed tokens get their
        prefix hash (never a rejected token's)."""
        for seq, num_new in batch.items:
            tokens = seq.token_ids
            draft = batch.drafts.get(seq)
            if draft:
                kept = accepted[seq]
                seq.acceptance.record(len(draft), kept)
                seq.draft_tokens_kept += kept
                num_new -= len(draft) - kept
                tokens = tokens + draft[:kept]
                self.blocks.truncate(seq.table, seq.num_computed + num_new)
            seq.num_computed += num_new
            self.blocks.commit_full_blocks(seq.table, tokens, seq.num_computed)
            if seq.num_computed >= seq.num_prompt and seq in self.held:
                self._release_held(seq)

    def _draft(
        self, spec: Speculation, scheduled: dict[Sequence, int], budget: int
    ) -> dict[Sequence, list[int]]:
        """Proposed tokens for decodes, with their slots allocated, within the budget and free
        blocks left; none while more decodes run than speculation pays for."""
        decodes = [s for s, n in scheduled.items() if n == 1 and s.num_computed + 1 == s.num_tokens]
        if len(decodes) > spec.max_decodes:
            return {}
        drafts = {}
        for seq in decodes:
            # the step emits the accepted draft plus one token: never more than max_tokens
            produced = seq.num_tokens - seq.num_prompt
            left = seq.request.params.max_tokens - produced
            prediction = seq.request.prediction
            most = spec.most(bool(prediction))
            room = min(most, budget, left - 1)
            if not seq.request.speculative or room <= 0:
                continue
            seq.acceptance.decay()
            room = min(room, draft_length(seq.acceptance.rate, most, spec.row_cost))
            if room <= 0:
                continue
            draft = spec.proposer.propose(seq.token_ids, room, prediction, produced)
            num_tokens = seq.num_tokens + len(draft)
            if not draft or not self.blocks.can_grow(seq.table, num_tokens):
                continue
            self.blocks.grow(seq.table, num_tokens)
            scheduled[seq] += len(draft)
            budget -= len(draft)
            drafts[seq] = draft
        return drafts

    def _make_room_for_interactive(self) -> list[Sequence]:
        """An interactive sequence that cannot be admitted preempts running batch sequences."""
        seq = self._next_waiting()
        if seq is None or seq.priority != Priority.INTERACTIVE:
            return []
        batch = sorted(
            (s for s in self.running if s.priority == Priority.BATCH), key=lambda s: s.order
        )
        preempted = []
        while batch:
            matched = self._cached_prefix(seq)
            cached = len(matched) * self.blocks.block_size
            num_new = min(seq.num_tokens - cached, self.max_num_batched_tokens)
            fits = self.blocks.can_adopt(matched, cached + num_new)
            if fits and len(self.running) < self.max_num_seqs:
                break
            victim = batch.pop()
            self.preempt(victim)
            preempted.append(victim)
        return preempted
