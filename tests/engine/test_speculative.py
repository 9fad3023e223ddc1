"""Speculative decoding: the n-gram proposer, when drafts are scheduled, exact verification, the
rollback of rejected tokens' KV slots, and the acceptance metrics."""

import itertools
import random

import pytest
import torch
from prometheus_client import generate_latest
from scipy.stats import chi2_contingency, chisquare

from tokenyard.engine.cpu_kernels import paged_attention
from tokenyard.engine.kv_cache import BlockManager, BlockTable
from tokenyard.engine.sampler import Sampler
from tokenyard.engine.scheduler import Scheduler
from tokenyard.engine.sequence import GenerationRequest, SamplingParams, Sequence
from tokenyard.engine.speculative import Acceptance, NgramProposer, Speculation, draft_length

from .conftest import MAX_NEW, assert_all_blocks_free, greedy, run_to_completion

# the engine of test_correctness's mixed batch (a small pool and budget: chunked prefill,
# prefix-cache hits and preemption all happen), speculating at every step
SPECULATIVE = {
    "num_blocks": 96,
    "max_num_batched_tokens": 128,
    "max_num_seqs": 16,
    "speculative_tokens": 4,
    "speculative_max_decodes": 16,
    "speculative_row_cost": 0.0,  # full drafts whatever the acceptance
}
PLAIN = {"num_blocks": 2048}  # the reference: everything at once (test_correctness's "alone")
P_VALUE = 1e-3  # distribution tests fail below this p-value (a false alarm once in 1000 runs)


# ---------------------------------------------------------------- proposer


def test_ngram_proposes_what_followed_the_latest_longest_match():
    proposer = NgramProposer(max_ngram=3, min_ngram=1)
    # "1 2 3" occurs twice; the latest occurrence is followed by 7 8
    assert proposer.propose([1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 1, 2, 3], 2) == [7, 8]
    # no 3-gram or 2-gram match: the last single token's latest occurrence
    assert proposer.propose([5, 6, 9, 5, 7, 4, 2, 5], 3) == [7, 4, 2]
    # a continuation that reaches the end repeats itself: the text is looping
    assert proposer.propose([1, 2, 1, 2], 4) == [1, 2, 1, 2]
    assert proposer.propose([1, 2, 1, 2], 1) == [1]
    assert proposer.propose([7, 5, 5], 3) == [5, 5, 5]
    assert proposer.propose([3, 1, 2, 3, 1, 2, 3], 5) == [1, 2, 3, 1, 2]
    assert proposer.propose([1, 2, 3], 4) == []
    assert proposer.propose([1], 4) == []
    assert proposer.propose([], 4) == []


def test_ngram_prefers_the_longer_match_over_the_more_recent_one():
    # "8 1 2 3" occurs once, early; "1 2 3" alone recurs later with something else after it
    tokens = [8, 1, 2, 3, 4, 5, 9, 1, 2, 3, 6, 7, 8, 1, 2, 3]
    assert NgramProposer(max_ngram=8).propose(tokens, 2) == [4, 5]
    assert NgramProposer(max_ngram=3).propose(tokens, 2) == [6, 7]  # capped: the latest wins
    # a match shorter than min_ngram (by default 2: one token is weak evidence) proposes nothing
    assert NgramProposer().propose([5, 6, 9, 5, 7, 4, 2, 5], 3) == []
    assert NgramProposer(min_ngram=3).propose([9, 1, 2, 5, 1, 2], 3) == []
    assert NgramProposer().propose([9, 1, 2, 5, 1, 2], 3) == [5, 1, 2]


def brute_force_lookup(tokens: list[int], max_ngram: int, max_tokens: int) -> list[int]:
    """The definition: the longest suffix of up to max_ngram tokens that occurs earlier with a
    token after it; its latest such occurrence; what follows it, copied a token at a time from
    the text as it grows (past the end, the draft's own tokens)."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[-n:]:
                text = list(tokens)
                for i in range(max_tokens):
                    text.append(text[start + n + i])
                return text[len(tokens) :]
    return []


def test_ngram_proposer_matches_its_definition_on_random_text():
    rng = random.Random(7)
    proposer = NgramProposer(max_ngram=6, min_ngram=1)
    for _ in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        assert proposer.propose(tokens, 5) == brute_force_lookup(tokens, 6, 5), tokens


def test_a_prediction_is_proposed_while_the_output_follows_it_then_searched():
    """OpenAI's Predicted Outputs: while the output so far is the prediction's start, its next
    tokens are the draft, whatever the last tokens match elsewhere; once the output leaves it
    (an edit), it is searched as text the output came right after: of equal matches in the
    prompt and the prediction, the prediction's wins."""
    proposer = NgramProposer()
    prompt, prediction = [7, 3, 4, 5, 6], [1, 2, 9, 4, 5, 8]
    assert proposer.propose(prompt, 3, prediction, 0) == [1, 2, 9]  # nothing produced yet
    assert proposer.propose([*prompt, 1, 2], 3, prediction, 2) == [9, 4, 5]
    # left the prediction after "1 2": "4 5" occurs in both; the prediction's continues with 8
    assert proposer.propose([*prompt, 1, 2, 0, 4, 5], 2, prediction, 5) == [8]
    # no prediction: what followed the prompt's "4 5"
    assert proposer.propose([*prompt, 1, 2, 0, 4, 5], 2) == [6, 1]


# ---------------------------------------------------------------- scheduling


class FixedProposer:
    def propose(self, token_ids: list[int], max_tokens: int, *_: object) -> list[int]:
        return [9, 9, 9, 9, 9][:max_tokens]


_ids = itertools.count()


def decoding(prompt_len: int, max_tokens: int = 8, speculative: bool = True) -> Sequence:
    request = GenerationRequest(
        "r", list(range(prompt_len)), SamplingParams(max_tokens), speculative=speculative
    )
    return Sequence(next(_ids), request, 0, list(request.prompt_ids))


def scheduled_after_prefill(seqs: list[Sequence], max_decodes: int, budget: int = 64):
    """Prefill the sequences (one step), give each a first token, and schedule the next step
    with this token budget."""
    speculation = Speculation(FixedProposer(), 3, max_decodes, row_cost=0.0)
    s = Scheduler(BlockManager(64, 4), 64, 8, speculation=speculation)
    for sq in seqs:
        s.add(sq)
    s.update_from_output(s.schedule(), {})
    for sq in seqs:
        sq.token_ids.append(1)
    s.max_num_batched_tokens = budget
    return s, s.schedule()


def test_drafts_for_few_decodes_none_for_many():
    _, batch = scheduled_after_prefill([decoding(5), decoding(6)], max_decodes=2)
    assert [n for _, n in batch.items] == [4, 4]
    assert all(d == [9, 9, 9] for d in batch.drafts.values())
    assert batch.num_decodes == 0  # verified as small prefill chunks
    _, batch = scheduled_after_prefill([decoding(5), decoding(6), decoding(7)], max_decodes=2)
    assert [n for _, n in batch.items] == [1, 1, 1] and not batch.drafts


def test_drafts_respect_opt_out_max_tokens_and_the_budget_left():
    opted_out, short = decoding(5, speculative=False), decoding(6, max_tokens=3)
    s, batch = scheduled_after_prefill([opted_out, short], max_decodes=4)
    assert batch.drafts == {short: [9]}  # 1 token out, 3 at most: 1 draft + 1 sampled
    # the slots of the draft are allocated
    assert len(short.table.blocks) == s.blocks.blocks_needed(short.num_tokens + 1)
    # 2 decodes in a budget of 5: 3 tokens left, one draft's worth
    first, second = decoding(5), decoding(6)
    _, batch = scheduled_after_prefill([first, second], max_decodes=4, budget=5)
    assert batch.drafts == {first: [9, 9, 9]} and batch.num_tokens == 5


def test_a_predicted_request_drafts_its_own_length_where_the_engine_does_not_speculate():
    predicted, plain = decoding(5), decoding(6)
    predicted.request.prediction = [4, 4, 4, 4, 4, 4]
    speculation = Speculation(NgramProposer(), 0, 4, row_cost=0.0, predicted_tokens=2)
    s = Scheduler(BlockManager(64, 4), 64, 8, speculation=speculation)
    for sq in (predicted, plain):
        s.add(sq)
    s.update_from_output(s.schedule(), {})
    for sq in (predicted, plain):
        sq.token_ids.append(4)  # the first token out is the prediction's
    batch = s.schedule()
    assert batch.drafts == {predicted: [4, 4]}
    s.update_from_output(batch, {predicted: 1})
    assert predicted.draft_tokens_kept == 1 and plain.draft_tokens_kept == 0


def test_the_step_update_rolls_rejected_drafts_back_and_counts_kept_ones():
    kept_one, kept_all = decoding(6), decoding(7)
    s, batch = scheduled_after_prefill([kept_one, kept_all], max_decodes=2)
    assert batch.drafts == {kept_one: [9, 9, 9], kept_all: [9, 9, 9]}
    s.update_from_output(batch, {kept_one: 1, kept_all: 3})
    # the last sampled token and the kept draft tokens are computed; the rejected ones are not
    assert (kept_one.num_computed, kept_all.num_computed) == (6 + 1 + 1, 7 + 1 + 3)
    assert len(kept_one.table.blocks) == s.blocks.blocks_needed(8)
    assert len(kept_all.table.blocks) == s.blocks.blocks_needed(11)
    # the draft's fate feeds the next draft's length: kept_one's ended in a rejection
    assert (kept_one.acceptance.accepted, kept_one.acceptance.rejected) == (1, 1)
    assert (kept_all.acceptance.accepted, kept_all.acceptance.rejected) == (3, 0)
    # full blocks hold computed tokens only: kept_one's second block (tokens 4-7) is full with
    # its first draft token, and is hashed as such; a rejected token is in no hash
    assert kept_one.table.num_hashed == 2
    assert s.blocks.match_prefix([*range(6), 1, 9, 0]) == kept_one.table.blocks[:2]
    assert s.blocks.match_prefix([*range(6), 1, 8, 0]) == kept_one.table.blocks[:1]
    s.blocks.check_invariants([kept_one.table, kept_all.table])


def test_truncate_frees_the_draft_blocks_first_in_line_for_reuse():
    blocks = BlockManager(8, 4)
    table = BlockTable()
    blocks.grow(table, 6)
    blocks.commit_full_blocks(table, list(range(6)), 6)
    blocks.grow(table, 6 + 7)  # a draft of 7 tokens: two more blocks
    dropped = table.blocks[2:]
    blocks.truncate(table, 6 + 2)  # 2 tokens accepted: they fit in the second block
    assert len(table.blocks) == 2 and blocks.num_free == 6
    assert set(list(blocks.free)[:2]) == set(dropped)
    assert table.num_hashed == 1
    blocks.check_invariants([table])


# ---------------------------------------------------------------- verification

V = 6


def make_seq(seq_id: int = 0, output=(), **params) -> Sequence:
    request = GenerationRequest("r", [5, 4], SamplingParams(**params))
    return Sequence(seq_id, request, 0, [5, 4, *output])


def test_greedy_accepts_while_the_argmax_matches():
    rows = torch.tensor([[0.0, 3, 1, 0, 0, 0], [0, 0, 3, 1, 0, 0], [0, 0, 0, 0, 3, 0]])
    sampler = Sampler((0,), torch.device("cpu"))
    seq = make_seq(temperature=0.0)
    assert [s.token_id for s in sampler.verify(rows.clone(), [seq], [[1, 2]])[0]] == [1, 2, 4]
    assert [s.token_id for s in sampler.verify(rows.clone(), [seq], [[1, 3]])[0]] == [1, 2]
    assert [s.token_id for s in sampler.verify(rows.clone(), [seq], [[5, 2]])[0]] == [1]


def test_penalties_count_the_draft_tokens_before_a_row():
    """Row 1 sees draft token 0 as generated: its frequency penalty turns the argmax away."""
    rows = torch.tensor([[0.0, 0, 0, 2, 1, 0]] * 2)
    sampler = Sampler((0,), torch.device("cpu"))
    params = {"temperature": 0.0, "frequency_penalty": 2.0}
    emitted = sampler.verify(rows.clone(), [make_seq(**params)], [[3]])[0]
    assert [s.token_id for s in emitted] == [3, 4]
    # as without speculation, one token at a time
    assert sampler(rows[1:].clone(), [make_seq(output=[3], **params)])[0].token_id == 4


def test_rejection_sampling_keeps_the_distribution():
    """Sampled draft verification, many times: the first token follows row 0's distribution (the
    draft token accepted with its probability, the residual otherwise), the second row 1's."""
    torch.manual_seed(0)
    probs = torch.tensor(
        [[0.1, 0.4, 0.2, 0.1, 0.1, 0.1], [0.3, 0.1, 0.1, 0.2, 0.2, 0.1]], dtype=torch.float64
    )
    rows = probs.log().float()
    sampler = Sampler((99,), torch.device("cpu"))
    seq = make_seq(temperature=1.0)
    first, second, trials = [0] * V, [0] * V, 6000
    for _ in range(trials):
        emitted = sampler.verify(rows.clone(), [seq], [[1]])[0]
        first[emitted[0].token_id] += 1
        if len(emitted) == 2:
            assert emitted[0].token_id == 1
            second[emitted[1].token_id] += 1
    assert chisquare(first, probs[0] * trials).pvalue > P_VALUE
    assert chisquare(second, probs[1] * sum(second)).pvalue > P_VALUE
    assert abs(sum(second) / trials - 0.4) < 0.03  # accepted with p(draft) = 0.4


def test_draft_length_pays_for_its_rows():
    """No draft when its tokens would be rejected too often to pay for their rows; longer drafts
    as acceptance rises; every draft when rows are free."""
    assert draft_length(0.1, 4, 0.2) == 0
    lengths = [draft_length(rate, 4, 0.2) for rate in (0.3, 0.6, 0.8, 0.95)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1] == 4
    assert draft_length(0.05, 4, 0.0) == 4


def test_acceptance_follows_the_drafts_and_recovers():
    acceptance = Acceptance()
    assert acceptance.rate == 0.5  # the prior
    for _ in range(5):
        acceptance.decay()
        acceptance.record(4, 4)
    high = acceptance.rate
    assert high > 0.8
    for _ in range(15):  # the copied passage ends: every draft rejected at once
        acceptance.decay()
        acceptance.record(4, 0)
    low = acceptance.rate
    assert low < high and low < 0.5
    for _ in range(40):  # no drafts for a while: back toward the prior, so it drafts again
        acceptance.decay()
    assert abs(acceptance.rate - 0.5) < 0.05


# ---------------------------------------------------------------- the engine


def tokens(outputs: list) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


def counters(engine) -> tuple[float, float]:
    m = engine.metrics
    return m.spec_proposed._value.get(), m.spec_accepted._value.get()


def test_greedy_mixed_batch_is_identical_with_speculation(
    engine_factory, prompt_ids, batched_greedy
):
    """The 26 prompts of the comparison with transformers, against the engine's own output
    without speculation (all at once, PLAIN's engine)."""
    requests = [
        GenerationRequest(f"g{i}", ids, greedy(MAX_NEW, min_tokens=MAX_NEW))
        for i, ids in enumerate(prompt_ids)
    ]
    engine = engine_factory(**SPECULATIVE)
    proposed, accepted = counters(engine)
    speculative = run_to_completion(engine, requests)
    for i, r in enumerate(requests):
        assert tokens(speculative[r.request_id]) == batched_greedy[i], f"prompt {i}"
    proposed_now, accepted_now = counters(engine)
    assert 0 < accepted_now - accepted < proposed_now - proposed
    assert engine.scheduler.num_preemptions > 0, "the workload was meant to force a preemption"
    assert_all_blocks_free(engine)


COPYING_TASKS = [
    "Repeat this list exactly, one item a line: apples, pears, plums, cherries, grapes, lemons, "
    "limes, oranges, peaches, apricots.",
    "Rewrite in the past tense: The ship enters the harbour at dawn. The crew unloads the crates "
    "and the captain signs the papers. Then the ship leaves for Lisbon.",
    "Add a docstring to this function and return it whole:\n\ndef area(width, height):\n"
    "    if width < 0 or height < 0:\n        raise ValueError('negative side')\n"
    "    return width * height\n",
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_output_with_weights_as_shipped_is_identical_with_speculation(engine_factory, dtype):
    """The GGUF's own 4/8-bit weights, whose matmuls quantize activations to int8: there a
    last-bit difference in a verify row flips a rounding that grows through the layers, so drafts'
    rows must round exactly as a lone decode's (attention's parts are cut by position, not by the
    batch). Draft rows go through the prefill kernel's exact mode, which shares the decode
    kernel's arithmetic (bf16: where the CPU has the bf16 kernel, else as decode rows). Each
    request alone, with and without speculation."""
    engine = engine_factory(
        dtype=dtype, quantization="auto", speculative_tokens=8, speculative_row_cost=0.0
    )
    exact = dtype == "float32" or getattr(paged_attention(), "PREFILL_BF16", False)
    assert engine.runner.attention.short_rows != exact
    template = engine.tokenizer.apply_chat_template
    proposed, accepted = counters(engine)
    for i, task in enumerate(COPYING_TASKS):
        ids = template([{"role": "user", "content": task}])
        runs = []
        for speculative in (False, True):
            request = GenerationRequest(f"q{i}-{speculative}", ids, greedy(64))
            request.speculative = speculative
            runs.append(tokens(run_to_completion(engine, [request])[request.request_id]))
        assert runs[0] == runs[1], task
    proposed_now, accepted_now = counters(engine)
    assert accepted_now - accepted > 40 and proposed_now > proposed


def test_a_predicted_output_leaves_greedy_tokens_as_they_were_in_fewer_steps(
    engine_factory, prompt_ids
):
    """fp32: the same tokens with a prediction as without, whether it is the output itself, an
    unrelated text or the output with an edit in it; a right prediction takes far fewer steps,
    and its accepted tokens are counted for usage."""
    engine = engine_factory(**PLAIN)
    params = greedy(32, min_tokens=32)
    requests = [GenerationRequest(f"p{i}", ids, params) for i, ids in enumerate(prompt_ids[:4])]
    plain = run_to_completion(engine, requests)
    for kind in ("exact", "unrelated", "edited"):
        predicted = []
        for r in requests:
            output = tokens(plain[r.request_id])
            prediction = {
                "exact": output,
                "unrelated": list(range(100, 140)),
                "edited": [*output[:10], 13, 13, *output[14:]],
            }[kind]
            predicted.append(
                GenerationRequest(r.request_id, r.prompt_ids, params, prediction=prediction)
            )
        outputs = run_to_completion(engine, predicted)
        for r in requests:
            assert tokens(outputs[r.request_id]) == tokens(plain[r.request_id]), (
                kind,
                r.request_id,
            )
        steps = {r.request_id: len(outputs[r.request_id]) for r in requests}
        kept = {
            r.request_id: outputs[r.request_id][-1].stats.accepted_prediction_tokens
            for r in requests
        }
        if kind == "exact":
            assert all(n <= 12 for n in steps.values()), steps  # 32 tokens in a step each without
            assert all(k == 32 - n for k, n in zip(kept.values(), steps.values(), strict=True)), (
                kept
            )
        if kind == "edited":
            assert all(n < 24 for n in steps.values()), steps
    assert_all_blocks_free(engine)


COPY = (
    "The quarterly report lists three numbers: revenue of 4.2 million, costs of 3.1 million, and "
    "a headcount of 57. The board approved the budget for the new warehouse in Rotterdam."
)


def copy_request(request_id: str, params: SamplingParams, engine) -> GenerationRequest:
    messages = [{"role": "user", "content": f"Repeat this text word for word:\n\n{COPY}"}]
    return GenerationRequest(request_id, engine.tokenizer.apply_chat_template(messages), params)


def test_rejected_tokens_are_rolled_back_and_accepted_ones_counted(engine_factory):
    """After every step each running sequence holds exactly the blocks of its computed tokens,
    its hashed blocks hold its own tokens, and the metrics count each step's accepted drafts."""
    engine = engine_factory(**SPECULATIVE)
    proposed, accepted = counters(engine)
    requests = [
        copy_request(
            f"copy-{i}",
            SamplingParams(max_tokens=48, temperature=t, seed=i, ignore_eos=True),
            engine,
        )
        for i, t in enumerate((0.0, 0.8, 1.5))
    ]
    for r in requests:
        engine.add_request(r)
    outputs: dict[str, list] = {r.request_id: [] for r in requests}
    bs = engine.block_size
    while engine.has_work():
        for out in engine.step():
            outputs[out.request_id].append(out)
        for seq in engine.scheduler.running:
            assert len(seq.table.blocks) == engine.blocks.blocks_needed(seq.num_computed)
            for i in range(seq.table.num_hashed):
                block = engine.blocks.blocks[seq.table.blocks[i]]
                assert block.token_ids == tuple(seq.token_ids[i * bs : (i + 1) * bs])
        engine.blocks.check_invariants([s.table for s in engine.scheduler.running])
    proposed_now, accepted_now = counters(engine)
    # every step emits its accepted draft tokens plus one (none stops mid-draft: EOS is ignored
    # and drafts never run past max_tokens)
    steps = [o for outs in outputs.values() for o in outs]
    assert all(len(tokens(outs)) == 48 for outs in outputs.values())
    assert accepted_now - accepted == sum(len(o.token_ids) - 1 for o in steps)
    assert accepted_now - accepted > 20, "copying text should accept many drafts"
    assert proposed_now - proposed > accepted_now - accepted, "the sampled ones reject some"
    exposition = generate_latest(engine.metrics.registry).decode()
    assert f'tokenyard_engine_spec_accepted_tokens_total{{model="smollm2"}} {accepted_now}' in (
        exposition
    )
    assert_all_blocks_free(engine)


def test_seeded_sampling_matches_the_distribution_without_speculation(engine_factory):
    """Sampled at temperature 1.5 from a prompt the model half copies: the joint distribution of
    tokens 2-4 (the ones drafts verify) with speculation against without it, on disjoint seeds
    (chi-square test of homogeneity over the 8 likeliest outcomes and the rest); and the same
    seeds give the same tokens either way."""
    plain, engine = engine_factory(**PLAIN), engine_factory(**SPECULATIVE)
    proposed, _ = counters(engine)
    params = dict(max_tokens=4, min_tokens=4, temperature=1.5)

    def run(engine, first_seed: int, count: int = 192) -> list[tuple[int, ...]]:
        requests = [
            copy_request(f"s{seed}", SamplingParams(**params, seed=seed), engine)
            for seed in range(first_seed, first_seed + count, 16)
        ]
        for r in requests:
            r.n = 16
        out = run_to_completion(engine, requests)
        by_choice = [[o for o in outs if o.choice == c] for outs in out.values() for c in range(16)]
        return [tuple(tokens(outs)[1:]) for outs in by_choice]

    with_spec, same_seeds, other_seeds = run(engine, 0), run(plain, 0, 64), run(plain, 1000)
    assert counters(engine)[0] > proposed
    assert sum(a == b for a, b in zip(with_spec, same_seeds, strict=False)) >= 0.95 * 64
    outcomes = sorted(set(other_seeds), key=other_seeds.count, reverse=True)[:8]
    counts = [
        [sample.count(o) for o in outcomes] + [sum(s not in outcomes for s in sample)]
        for sample in (with_spec, other_seeds)
    ]
    columns = [c for c in zip(*counts, strict=True) if sum(c)]
    assert chi2_contingency(list(zip(*columns, strict=True))).pvalue > P_VALUE
    assert_all_blocks_free(engine)
