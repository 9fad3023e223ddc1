"""Block pool, prefix sharing, ref counts and LRU reuse of cached blocks; the int8 pool's rows."""

import pytest
import torch

from tests.engine.conftest import run_to_completion
from tokenyard.engine.attention import make_attention
from tokenyard.engine.config import EngineConfig, ModelConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.kv_cache import (
    BlockManager,
    BlockTable,
    Int8Pool,
    blocks_for_budget,
    kv_pool,
    quantize_rows,
)
from tokenyard.engine.sequence import GenerationRequest, SamplingParams

BS = 4


def filled(manager: BlockManager, tokens: list[int]) -> BlockTable:
    """A sequence that has computed all of tokens (after reusing what the cache had)."""
    table = BlockTable()
    manager.adopt_prefix(table, manager.match_prefix(tokens), len(tokens))
    manager.grow(table, len(tokens))
    manager.commit_full_blocks(table, tokens, len(tokens))
    return table


def test_equal_prefixes_share_blocks_with_ref_counts():
    m = BlockManager(16, BS)
    a = filled(m, list(range(10)))  # 2 full blocks + 2 tokens
    b = filled(m, [*range(8), 99, 98, 97])  # same first 8 tokens
    assert b.blocks[:2] == a.blocks[:2]
    assert b.blocks[2] != a.blocks[2]
    assert [m.blocks[i].ref_count for i in a.blocks[:2]] == [2, 2]
    assert m.prefix_hits == 8
    m.check_invariants([a, b])
    m.release(a)
    m.release(b)
    m.check_invariants([])
    assert m.num_free == 16


def test_at_least_one_prompt_token_is_left_to_compute():
    m = BlockManager(16, BS)
    a = filled(m, list(range(8)))
    # the whole 8-token prompt is cached, but its last token must run to produce logits
    assert len(m.match_prefix(list(range(8)))) == 1
    assert len(m.match_prefix(list(range(9)))) == 2
    m.release(a)


def test_same_tokens_after_a_different_prefix_do_not_match():
    m = BlockManager(16, BS)
    a = filled(m, [1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert m.match_prefix([9, 9, 9, 9, 5, 6, 7, 8, 0]) == []
    m.release(a)


def test_freed_cached_blocks_are_reused_until_evicted_lru():
    m = BlockManager(4, BS)
    old = filled(m, [1] * 8 + [0])  # 3 blocks: two full and hashed
    m.release(old)
    # 3 blocks: the never-used one, old's partial block, then old's tail (the oldest cached)
    young = filled(m, [2] * 8 + [0])
    m.release(young)
    assert m.num_free == 4
    # old's tail was evicted; its head is still cached, and so is all of young
    assert len(m.match_prefix([1] * 8 + [0])) == 1
    assert len(m.match_prefix([2] * 8 + [0])) == 2
    again = filled(m, [1] * 8 + [0])
    assert m.prefix_hits == 4
    m.check_invariants([again])
    m.release(again)
    m.check_invariants([])


def test_adopting_idle_cached_blocks_counts_against_free_space():
    m = BlockManager(3, BS)
    a = filled(m, list(range(9)))  # all 3 blocks
    m.release(a)
    matched = m.match_prefix(list(range(9)))
    assert len(matched) == 2
    assert m.can_adopt(matched, 9)  # 2 cached + 1 new = 3 blocks
    assert not m.can_adopt(matched, 13)  # would need a 4th


SMOLLM2 = ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def test_int8_rows_round_to_their_scale():
    """Each row's largest magnitude maps to 127; every value is off by at most half a step; a row
    of zeros has scale 0 and stays zeros; values never leave [-127, 127]."""
    torch.manual_seed(0)
    rows = torch.randn(50, 3, 64) * torch.logspace(-3, 3, 50).view(50, 1, 1)
    rows[7, 1] = 0
    values, scales = quantize_rows(rows)
    assert values.dtype == torch.int8 and scales.shape == (50, 3)
    assert values.abs().amax(-1)[scales > 0].eq(127).all()
    assert scales[7, 1] == 0 and not values[7, 1].any()
    error = (values.float() * scales.unsqueeze(-1) - rows).abs()
    assert (error <= scales.unsqueeze(-1) / 2 * (1 + 1e-5) + 1e-30).all()


def test_an_int8_pool_holds_more_tokens_in_the_same_memory():
    """68 bytes a row (64 values and a scale) against 128 for bf16 and 256 for fp32."""
    bf16 = blocks_for_budget(SMOLLM2, 16, torch.bfloat16, 1.0)
    int8 = blocks_for_budget(SMOLLM2, 16, torch.bfloat16, 1.0, int8=True)
    fp32 = blocks_for_budget(SMOLLM2, 16, torch.float32, 1.0)
    assert int8 / bf16 == pytest.approx(128 / 68, rel=1e-3)
    assert int8 / fp32 == pytest.approx(256 / 68, rel=1e-3)
    (k, v), *_ = kv_pool(SMOLLM2, 4, 16, torch.bfloat16, "cpu", int8=True)
    assert isinstance(k, Int8Pool) and k.values.shape == (4, 16, 3, 64)
    assert k.values.dtype == torch.int8 and v.scales.shape == (4, 16, 3)
    bytes_per_block = sum(t.nbytes for t in (k.values, k.scales, v.values, v.scales)) // 4
    assert bytes_per_block == 2 * 16 * 3 * 68


def test_an_int8_pool_is_refused_where_it_cannot_run():
    """flash-attn reads pools in the model's dtype: CUDA refuses an int8 one before importing it;
    an unknown pool dtype is refused at start."""
    with pytest.raises(ValueError, match="CPU feature"):
        make_attention(torch.device("cuda"), 0, 64, torch.bfloat16, True, int8_kv=True)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLMEngine(EngineConfig(device="cpu", kv_cache_dtype="fp8", num_blocks=4))


def test_cached_prompts_are_shared_only_under_the_same_salt(engine_factory):
    """vLLM's cache_salt: a prompt cached under one salt is not found under another, nor without
    one; under its own salt it is (the gateway salts each team's requests)."""
    engine = engine_factory()
    prompt = list(range(2000, 2100))  # 100 tokens: 6 whole blocks of 16 can be cached

    def cached(request_id: str, salt: str | None) -> int:
        request = GenerationRequest(
            request_id, prompt, SamplingParams(max_tokens=1, temperature=0), cache_salt=salt
        )
        return run_to_completion(engine, [request])[request_id][-1].stats.cached_tokens

    assert cached("a1", "team-a") == 0
    assert cached("b1", "team-b") == 0
    assert cached("plain1", None) == 0
    assert (cached("a2", "team-a"), cached("b2", "team-b"), cached("plain2", None)) == (96, 96, 96)
