"""Block pool, prefix sharing, ref counts and LRU reuse of cached blocks."""

from tokenyard.engine.kv_cache import BlockManager, BlockTable

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
