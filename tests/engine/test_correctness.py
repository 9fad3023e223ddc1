"""The engine's greedy output is token-identical to transformers on the same GGUF."""

import pytest
import torch

from tokenyard.engine.sequence import GenerationRequest

from .conftest import (
    MAX_NEW,
    assert_all_blocks_free,
    greedy,
    needs_bf16_matmuls,
    reference_greedy,
    run_to_completion,
)


@pytest.fixture(scope="module")
def expected(reference, prompt_ids, batched_greedy):
    """transformers' greedy continuations: the engine's batched ones, each checked by
    transformers in one pass (reference_greedy), or transformers' own where the check fails."""
    return [
        reference_greedy(reference, ids, MAX_NEW, candidate)
        for ids, candidate in zip(prompt_ids, batched_greedy, strict=True)
    ]


def test_prompts_cover_lengths(prompt_ids):
    lengths = sorted(len(p) for p in prompt_ids)
    assert len(prompt_ids) >= 20
    assert lengths[0] < 64 and lengths[-1] > 400


def test_the_reference_check_takes_no_wrong_candidate(reference, prompt_ids, expected):
    """reference_greedy's one-pass check: a candidate one token off anywhere is refused, and the
    generation it falls back to gives the checked continuation."""
    ids = min(prompt_ids, key=len)
    right = expected[prompt_ids.index(ids)]
    wrong = [*right[:5], (right[5] + 1) % 1000, *right[6:]]
    assert reference_greedy(reference, ids, MAX_NEW, wrong) == right


def test_alone_matches_transformers(engine_factory, prompt_ids, expected):
    """One at a time (each prompt one prefill chunk, batch-1 decodes): the shortest and longest
    prompts and every third between them; the mixed batches below run all of them."""
    engine = engine_factory(num_blocks=2048)
    by_length = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    for i in sorted({*by_length[::3], by_length[-1]}):
        ids = prompt_ids[i]
        out = run_to_completion(
            engine, [GenerationRequest(f"alone-{i}", ids, greedy(MAX_NEW, min_tokens=MAX_NEW))]
        )
        tokens = [t for o in out[f"alone-{i}"] for t in o.token_ids]
        assert tokens == expected[i], f"prompt {i} ({len(ids)} tokens)"
    assert_all_blocks_free(engine)


# the CPU's own attention kernel on every prompt; PyTorch's SDPA (where the kernels are not built)
# on every other one, which still shares a system prompt and overflows the pool: the same paths,
# for half of a pass that costs ~35 s on a 2-core AVX2 machine
@pytest.mark.parametrize(("cpu_kernel", "every"), [(True, 1), (False, 2)], ids=["kernel", "sdpa"])
def test_mixed_batch_matches_transformers(engine_factory, prompt_ids, expected, cpu_kernel, every):
    # a small pool and token budget: chunked prefill, prefix-cache hits and preemption all happen
    engine = engine_factory(
        num_blocks=96, max_num_batched_tokens=128, max_num_seqs=16, cpu_kernel=cpu_kernel
    )
    backend = "KernelAttention" if cpu_kernel else "TorchAttention"
    assert type(engine.runner.attention).__name__ == backend
    hits_before = engine.blocks.prefix_hits
    chosen = range(0, len(prompt_ids), every)
    requests = [
        GenerationRequest(f"mixed-{i}", prompt_ids[i], greedy(MAX_NEW, min_tokens=MAX_NEW))
        for i in chosen
    ]
    out = run_to_completion(engine, requests)
    for i in chosen:
        tokens = [t for o in out[f"mixed-{i}"] for t in o.token_ids]
        assert tokens == expected[i], f"prompt {i} ({len(prompt_ids[i])} tokens)"
    assert engine.scheduler.num_preemptions > 0, "the workload was meant to force a preemption"
    assert engine.blocks.prefix_hits > hits_before, "the shared system prompt should hit the cache"
    cached = [o[-1].stats.cached_tokens for o in out.values()]
    assert max(cached) >= engine.block_size
    assert_all_blocks_free(engine)


def test_last_position_logits_close(engine_factory, reference, prompt_ids):
    """fp32 both sides: max abs difference of the last position's logits below 2e-3."""
    from tokenyard.engine.attention import SeqSlice
    from tokenyard.engine.kv_cache import BlockTable

    engine = engine_factory(num_blocks=2048)
    for ids in (prompt_ids[0], prompt_ids[-1]):
        table = BlockTable()
        engine.blocks.grow(table, len(ids))
        meta = engine.runner.attention.build_metadata([SeqSlice(table.blocks, 0, len(ids))], 0)
        with torch.inference_mode():
            hidden = engine.runner.forward(torch.tensor(ids), torch.arange(len(ids)), meta)
            ours = engine.runner.model.logits(hidden[-1:])[0]
            theirs = reference(torch.tensor([ids])).logits[0, -1]
        engine.blocks.release(table)
        assert (ours - theirs).abs().max().item() < 2e-3
        assert ours.argmax() == theirs.argmax()
    assert_all_blocks_free(engine)


@needs_bf16_matmuls
def test_bf16_tracks_fp32(engine_factory, prompt_ids, expected):
    """bf16 weights and cache (the CPU default where bf16 is native): fed the fp32 reference's
    own continuation, the engine predicts the same next token at nearly every position."""
    from tokenyard.engine.attention import SeqSlice
    from tokenyard.engine.kv_cache import BlockTable

    engine = engine_factory(num_blocks=2048, dtype="bfloat16")
    assert engine.runner.kv_caches[0].dtype == torch.bfloat16
    agree = total = 0
    for ids, continuation in zip(prompt_ids, expected, strict=True):
        tokens = ids + continuation
        table = BlockTable()
        engine.blocks.grow(table, len(tokens))
        meta = engine.runner.attention.build_metadata([SeqSlice(table.blocks, 0, len(tokens))], 0)
        with torch.inference_mode():
            hidden = engine.runner.forward(torch.tensor(tokens), torch.arange(len(tokens)), meta)
            predicted = engine.runner.model.logits(hidden[len(ids) - 1 : -1]).argmax(-1).tolist()
        engine.blocks.release(table)
        agree += sum(p == t for p, t in zip(predicted, continuation, strict=True))
        total += len(continuation)
    assert agree / total >= 0.95, f"{agree}/{total} next tokens as fp32 predicts"
    assert_all_blocks_free(engine)
