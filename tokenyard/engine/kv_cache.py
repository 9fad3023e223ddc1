"""Paged KV cache: a preallocated block pool, block tables, prefix hashes, ref counts, LRU reuse.

A full block is identified by a hash chained with its parent's, so two sequences whose prompts
share a prefix share its blocks. A block whose last reference goes away keeps its hash and stays
findable until the pool needs it for something else; free blocks are handed out oldest-freed
first, so the cached prefixes used most recently survive longest (LRU).
"""

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from tokenyard.engine.config import ModelConfig


@dataclass
class Int8Pool:
    """One layer's K (or V) pool in int8: `values` [num_blocks, block_size, Hkv, D] and a scale per
    slot and head, `scales` [num_blocks, block_size, Hkv] fp32: a row is `values * scale`, its
    largest magnitude at 127 (llama.cpp's q8_0 cache, one block per head row). Half the bytes of
    bf16 for D = 64 (68 against 128 a row), so the same memory holds ~1.9x the tokens."""

    values: torch.Tensor
    scales: torch.Tensor


# a layer's K and V pools: one [2, num_blocks, block_size, Hkv, D] tensor in the model's dtype, or
# two int8 pools
LayerKV = torch.Tensor | tuple[Int8Pool, Int8Pool]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., D] rows → int8 values and fp32 scales [...]: symmetric, the row's absolute maximum at
    127. The compiled writer (layer_ops.cpp `rotary_to_cache_`) rounds the same way, bit for bit:
    scale = max * (1/127), values = round-half-even(x * (1/scale))."""
    x = x.float()
    scales = x.abs().amax(-1) * (1 / 127)
    inverse = torch.where(scales > 0, 1 / scales, torch.zeros_like(scales))
    values = (x * inverse.unsqueeze(-1)).round().clamp(-127, 127).to(torch.int8)
    return values, scales


def kv_pool(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device,
    int8: bool = False,
) -> list[LayerKV]:
    """Per layer one tensor [2 (K, V), num_blocks, block_size, num_kv_heads, head_dim], or with
    `int8` a pair of Int8Pool."""
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    if not int8:
        return [
            torch.zeros((2, *shape), dtype=dtype, device=device) for _ in range(config.num_layers)
        ]

    def pool() -> Int8Pool:
        return Int8Pool(
            torch.zeros(shape, dtype=torch.int8, device=device),
            torch.zeros(shape[:-1], dtype=torch.float32, device=device),
        )

    return [(pool(), pool()) for _ in range(config.num_layers)]


def blocks_for_budget(
    config: ModelConfig, block_size: int, dtype: torch.dtype, gib: float, int8: bool = False
) -> int:
    rows = 2 * config.num_layers * block_size * config.num_kv_heads
    row_bytes = config.head_dim + 4 if int8 else config.head_dim * torch.finfo(dtype).bits // 8
    return max(1, int(gib * 2**30) // (rows * row_bytes))


NO_HASH = -1


def block_hash(parent: int, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int = NO_HASH
    token_ids: tuple[int, ...] = ()


@dataclass
class BlockTable:
    """A sequence's blocks, and how many of its leading blocks already carry prefix hashes."""

    blocks: list[int] = field(default_factory=list)
    num_hashed: int = 0
    last_hash: int = NO_HASH


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # free blocks, oldest-freed first; cached ones among them are still findable by hash
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of which found cached

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ------------------------------------------------------------ prefix cache

    def match_prefix(self, token_ids: list[int], root: int = NO_HASH) -> list[int]:
        """Cached blocks holding a prefix of token_ids (at least one token left to compute);
        root: the first block's parent hash (one per LoRA adapter, NO_HASH for the base model)."""
        if not self.enable_prefix_caching:
            return []
        matched: list[int] = []
        parent = root
        full_blocks = (len(token_ids) - 1) // self.block_size
        for start in range(0, full_blocks * self.block_size, self.block_size):
            chunk = tuple(token_ids[start : start + self.block_size])
            parent = block_hash(parent, chunk)
            block_id = self.hash_to_block.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            matched.append(block_id)
        return matched

    def adopt_prefix(
        self, table: BlockTable, matched: list[int], prompt_len: int, root: int = NO_HASH
    ) -> None:
        """Give a new sequence the cached blocks match_prefix found (counted as prefix hits)."""
        for block_id in matched:
            self._ref(block_id)
        table.blocks.extend(matched)
        table.num_hashed = len(matched)
        table.last_hash = self.blocks[matched[-1]].hash if matched else root
        self.prefix_queries += prompt_len
        self.prefix_hits += len(matched) * self.block_size

    # ------------------------------------------------------------ allocation

    def can_adopt(self, matched: list[int], num_tokens: int) -> bool:
        """Whether a new sequence with these cached blocks can grow to num_tokens."""
        idle = sum(1 for block_id in matched if self.blocks[block_id].ref_count == 0)
        return self.blocks_needed(num_tokens) - len(matched) + idle <= self.num_free

    def can_grow(self, table: BlockTable, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(table.blocks) <= self.num_free

    def grow(self, table: BlockTable, num_tokens: int) -> None:
        """Make the table hold num_tokens; the caller checked can_grow."""
        for _ in range(self.blocks_needed(num_tokens) - len(table.blocks)):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash != NO_HASH:  # evict the least recently freed cached block
                if self.hash_to_block.get(block.hash) == block_id:
                    del self.hash_to_block[block.hash]
                block.hash, block.token_ids = NO_HASH, ()
            block.ref_count = 1
            table.blocks.append(block_id)

    def commit_full_blocks(
        self, table: BlockTable, token_ids: list[int], num_computed: int
    ) -> None:
        """Hash the blocks that computing up to num_computed tokens has filled."""
        if not self.enable_prefix_caching:
            return
        while (table.num_hashed + 1) * self.block_size <= num_computed:
            start = table.num_hashed * self.block_size
            chunk = tuple(token_ids[start : start + self.block_size])
            table.last_hash = block_hash(table.last_hash, chunk)
            block = self.blocks[table.blocks[table.num_hashed]]
            block.hash, block.token_ids = table.last_hash, chunk
            self.hash_to_block.setdefault(table.last_hash, block.block_id)
            table.num_hashed += 1

    def truncate(self, table: BlockTable, num_tokens: int) -> None:
        """Give back the blocks past num_tokens (the slots of rejected draft tokens). They were
        grown for this table alone and hold no hash (only computed tokens' blocks get one), so they
        go to the front of the free list: reused before any block that caches a prefix."""
        while len(table.blocks) > self.blocks_needed(num_tokens):
            block_id = table.blocks.pop()
            self.blocks[block_id].ref_count -= 1
            self.free[block_id] = None
            self.free.move_to_end(block_id, last=False)

    def release(self, table: BlockTable) -> None:
        # last blocks first into the free list: a prefix's tail is evicted before its head
        for block_id in reversed(table.blocks):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
        table.blocks.clear()
        table.num_hashed, table.last_hash = 0, NO_HASH

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1

    def check_invariants(self, tables: list[BlockTable]) -> None:
        """Ref counts equal the tables' references; free exactly the unreferenced blocks."""
        refs = [0] * self.num_blocks
        for table in tables:
            for block_id in table.blocks:
                refs[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (block, refs[block.block_id])
            assert (block.ref_count == 0) == (block.block_id in self.free), block
        for h, block_id in self.hash_to_block.items():
            assert self.blocks[block_id].hash == h
