"""Scheduling without a model: priorities, tenant fairness, chunked prefill, preemption."""

import itertools

from tokenyard.engine.kv_cache import BlockManager
from tokenyard.engine.scheduler import Scheduler
from tokenyard.engine.sequence import (
    GenerationRequest,
    Priority,
    SamplingParams,
    SeqStatus,
    Sequence,
)

BS = 4
_ids = itertools.count()


def seq(prompt_len: int, priority=Priority.INTERACTIVE, tenant="t", arrival=None, max_tokens=8):
    base = next(_ids) * 1000  # distinct prompts: no accidental prefix sharing
    request = GenerationRequest(
        f"r{base}",
        list(range(base, base + prompt_len)),
        SamplingParams(max_tokens=max_tokens),
        priority=priority,
        tenant=tenant,
        arrival=arrival if arrival is not None else next(_ids),
    )
    return Sequence(next(_ids), request, 0, list(request.prompt_ids))


def step(s: Scheduler):
    """One step as the engine does it: compute the scheduled tokens, sample after prefills."""
    batch = s.schedule()
    assert batch.num_tokens <= s.max_num_batched_tokens
    s.update_from_output(batch, {})
    for sq, _ in batch.items:
        if sq.num_computed == sq.num_tokens:
            sq.token_ids.append(7)
            if len(sq.output_ids) >= sq.request.params.max_tokens:
                s.finish(sq, "length")
    s.blocks.check_invariants([x.table for x in s.running])
    return batch


def make(num_blocks=64, budget=64, max_seqs=8, preempt_for_interactive=True) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS), budget, max_seqs, preempt_for_interactive)


def test_interactive_is_admitted_before_earlier_batch():
    s = make(max_seqs=1)
    batch_seq = seq(8, Priority.BATCH, arrival=0)
    inter = seq(8, Priority.INTERACTIVE, arrival=5)
    s.add(batch_seq)
    s.add(inter)
    first = step(s)
    assert [x for x, _ in first.items] == [inter]


def test_tenant_with_one_request_is_not_starved_by_a_tenant_with_many():
    s = make(max_seqs=2, budget=1000, num_blocks=1000)
    for i in range(50):
        s.add(seq(8, tenant="big", arrival=i))
    small = seq(8, tenant="small", arrival=100)
    s.add(small)
    batch = step(s)
    assert small in [x for x, _ in batch.items]
    assert {x.tenant for x, _ in batch.items} == {"big", "small"}


def test_chunked_prefill_respects_budget_and_decodes_go_first():
    s = make(budget=16, num_blocks=64)
    short = seq(4, max_tokens=20)
    s.add(short)
    step(s)  # short's prompt, first token
    long = seq(40)
    s.add(long)
    chunks = []
    while long.num_computed < long.num_prompt:
        batch = step(s)
        assert batch.items[0][0] is short and batch.items[0][1] == 1  # the decode leads
        chunks.append(dict(batch.items).get(long, 0))
    assert chunks == [15, 15, 10]


def test_out_of_blocks_preempts_latest_lowest_priority_never_interactive_for_batch():
    s = make(num_blocks=6, budget=100)
    inter = seq(8, Priority.INTERACTIVE, arrival=0, max_tokens=12)  # grows to 5 blocks
    early_batch = seq(4, Priority.BATCH, arrival=1, max_tokens=12)
    late_batch = seq(4, Priority.BATCH, arrival=2, max_tokens=12)
    for x in (inter, early_batch, late_batch):
        s.add(x)
    preempted = []
    for _ in range(40):
        if not s.has_work():
            break
        preempted += step(s).preempted
    assert not s.has_work()
    assert preempted, "the pool was sized to run out"
    assert inter not in preempted
    assert preempted[0] is late_batch
    assert all(x.status == SeqStatus.FINISHED for x in (inter, early_batch, late_batch))
    assert s.blocks.num_free == 6


def test_waiting_interactive_preempts_running_batch():
    s = make(num_blocks=4, budget=100, max_seqs=4)
    batch_seq = seq(12, Priority.BATCH, max_tokens=30)  # holds 3-4 blocks
    s.add(batch_seq)
    step(s)
    step(s)
    inter = seq(8, Priority.INTERACTIVE)
    s.add(inter)
    batch = step(s)
    assert batch_seq in batch.preempted
    assert inter in [x for x, _ in batch.items]
    assert batch_seq.status == SeqStatus.WAITING and not batch_seq.table.blocks


def test_without_the_option_interactive_waits_for_batch():
    s = make(num_blocks=4, budget=100, max_seqs=4, preempt_for_interactive=False)
    batch_seq = seq(12, Priority.BATCH, max_tokens=30)
    s.add(batch_seq)
    step(s)
    inter = seq(8, Priority.INTERACTIVE)
    s.add(inter)
    batch = step(s)
    assert not batch.preempted
    assert inter.status == SeqStatus.WAITING


def test_finish_of_a_waiting_sequence_removes_it():
    s = make()
    x = seq(8)
    s.add(x)
    s.finish(x, "cancelled")
    assert not s.has_work()
    assert x.status == SeqStatus.FINISHED


def choices(prompt_len: int, n: int, max_tokens: int = 8) -> list[Sequence]:
    first = seq(prompt_len, max_tokens=max_tokens)
    return [first] + [
        Sequence(next(_ids), first.request, c, list(first.request.prompt_ids)) for c in range(1, n)
    ]


def test_a_requests_choices_read_its_prompt_once():
    s = make(budget=16)
    seqs = choices(30, 3)
    s.add_choices(seqs)
    computed = 0
    while any(x.num_computed < x.num_prompt for x in seqs):
        computed += sum(n for x, n in step(s).items if x.num_computed <= x.num_prompt)
    # the first read all 30; the others only the tail past the last full block of 4 (28)
    assert computed == 30 + 2 * (30 - 28)
    assert [x.num_cached for x in seqs] == [0, 28, 28]
    while s.has_work():
        step(s)
    assert all(x.status == SeqStatus.FINISHED and len(x.output_ids) == 8 for x in seqs)
    assert s.blocks.num_free == s.blocks.num_blocks


def test_choices_are_not_held_when_nothing_would_be_shared():
    short = make()
    seqs = choices(BS, 2)  # no full block before the prompt's last token
    short.add_choices(seqs)
    assert short.num_waiting == 2 and not short.held
    uncached = Scheduler(BlockManager(64, BS, enable_prefix_caching=False), 64, 8)
    seqs = choices(30, 2)
    uncached.add_choices(seqs)
    assert uncached.num_waiting == 2 and not uncached.held


def test_ending_held_choices_and_their_first_leaves_nothing_behind():
    s = make(budget=8)
    seqs = choices(30, 3)
    s.add_choices(seqs)
    step(s)  # the first reads 8 of 30 tokens; the others wait for it
    assert s.num_waiting == 0 and s.held
    s.finish(seqs[2], "cancelled")  # one held choice ends: the others are untouched
    assert s.held[seqs[0]] == [seqs[1]]
    s.finish(seqs[0], "cancelled")  # the first ends before the prompt is read: the rest go on
    assert not s.held and s.num_waiting == 1
    while s.has_work():
        step(s)
    assert seqs[1].status == SeqStatus.FINISHED and len(seqs[1].output_ids) == 8
    assert s.blocks.num_free == s.blocks.num_blocks
