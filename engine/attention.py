"""Attention over the paged KV layout: one interface; PyTorch (CPU) and flash-attn (CUDA) backends.

The KV pool of a layer is `[num_blocks, block_size, num_kv_heads, head_dim]` for K and for V.
A step's tokens are flattened into one batch: decodes first (one token each), then prefill chunks.
"""

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F


@dataclass
class SeqSlice:
    """One sequence's part of a step: `num_new` tokens after `num_computed` already cached."""

    block_table: list[int]
    num_computed: int
    num_new: int

    @property
    def context_len(self) -> int:
        return self.num_computed + self.num_new


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] flat slot of each new token's K/V
    num_decodes: int  # the first num_decodes tokens are single-token decodes
    # PyTorch backend: per group of decodes of similar length, (first, end, block ids [B, W],
    # mask [B, 1, 1, W * block_size]); per prefill chunk, (q_start, q_end, block ids, context)
    decodes: list[tuple[int, int, torch.Tensor, torch.Tensor]] | None = None
    prefills: list[tuple[int, int, torch.Tensor, int]] | None = None
    # flash-attn backend
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32


def _slot_mapping(slices: list[SeqSlice], block_size: int) -> list[int]:
    slots: list[int] = []
    for s in slices:
        for pos in range(s.num_computed, s.context_len):
            slots.append(s.block_table[pos // block_size] * block_size + pos % block_size)
    return slots


class TorchAttention:
    """Reference backend: gathers each sequence's K/V blocks from the pool and calls SDPA.

    Gathers whole blocks (index_select over the block dimension copies block-sized runs, much
    faster than indexing token by token); the tail past a sequence's length is masked or cut.
    """

    default_block_size = 16

    def __init__(self, block_size: int, device: torch.device):
        self.block_size = block_size
        self.device = device

    def _width(self, s: SeqSlice) -> int:
        return -(-s.context_len // self.block_size)

    def _decode_group(self, group: list[SeqSlice], first: int, end: int) -> tuple:
        width = max(self._width(s) for s in group)
        tables = [s.block_table[:width] + [0] * (width - len(s.block_table)) for s in group]
        blocks = torch.tensor(tables, dtype=torch.long, device=self.device)
        lengths = torch.tensor([s.context_len for s in group], device=self.device)
        positions = torch.arange(width * self.block_size, device=self.device)
        mask = (positions[None, :] < lengths[:, None])[:, None, None, :]
        return first, end, blocks, mask

    def _blocks(self, s: SeqSlice) -> torch.Tensor:
        return torch.tensor(s.block_table[: self._width(s)], dtype=torch.long, device=self.device)

    def build_metadata(self, slices: list[SeqSlice], num_decodes: int) -> AttentionMetadata:
        slots = torch.tensor(_slot_mapping(slices, self.block_size), device=self.device)
        meta = AttentionMetadata(slots, num_decodes, decodes=[], prefills=[])
        first = 0
        while first < num_decodes:  # decodes come sorted by length: group similar widths
            base = self._width(slices[first])
            end = first + 1
            while end < num_decodes and self._width(slices[end]) <= base * 1.25 + 1:
                end += 1
            meta.decodes.append(self._decode_group(slices[first:end], first, end))
            first = end
        start = num_decodes
        for s in slices[num_decodes:]:
            meta.prefills.append((start, start + s.num_new, self._blocks(s), s.context_len))
            start += s.num_new
        return meta

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        heads, dim = k_cache.shape[2:]
        k_cache.view(-1, heads, dim).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, heads, dim).index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        for first, end, blocks, mask in meta.decodes:
            n = end - first
            keys = k_cache.index_select(0, blocks.flatten()).view(n, -1, heads, dim)
            values = v_cache.index_select(0, blocks.flatten()).view(n, -1, heads, dim)
            out[first:end] = F.scaled_dot_product_attention(
                q[first:end].unsqueeze(2),
                keys.transpose(1, 2),
                values.transpose(1, 2),
                attn_mask=mask,
                enable_gqa=True,
            ).squeeze(2)
        for q_start, q_end, blocks, context in meta.prefills:
            num_new = q_end - q_start
            keys = k_cache.index_select(0, blocks).view(-1, heads, dim)[:context]
            values = v_cache.index_select(0, blocks).view(-1, heads, dim)[:context]
            mask = None
            if num_new != context:  # a later chunk: its queries see every earlier token
                rows = torch.arange(context - num_new, context, device=q.device)
                mask = torch.arange(context, device=q.device)[None, :] <= rows[:, None]
            out[q_start:q_end] = F.scaled_dot_product_attention(
                q[q_start:q_end].transpose(0, 1),
                keys.transpose(0, 1),
                values.transpose(0, 1),
                attn_mask=mask,
                is_causal=mask is None,
                enable_gqa=True,
            ).transpose(0, 1)
        return out


class FlashAttention:
    """CUDA backend: flash-attn's varlen kernel reading K/V through block tables."""

    # flash-attn's paged path takes only page sizes that are multiples of 256
    default_block_size = 256

    def __init__(self, block_size: int, device: torch.device):
        if block_size % 256:
            raise ValueError(
                f"flash-attn needs a block size that is a multiple of 256, not {block_size}"
            )
        from flash_attn import flash_attn_varlen_func  # optional extra `cuda`: imported only here

        self._varlen = flash_attn_varlen_func
        self.block_size = block_size
        self.device = device

    def build_metadata(self, slices: list[SeqSlice], num_decodes: int) -> AttentionMetadata:
        def int32(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=self.device)

        q_lens = [s.num_new for s in slices]
        k_lens = [s.context_len for s in slices]
        width = max(len(s.block_table) for s in slices)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in slices]
        return AttentionMetadata(
            slot_mapping=torch.tensor(_slot_mapping(slices, self.block_size), device=self.device),
            num_decodes=num_decodes,
            cu_seqlens_q=int32([0, *accumulate(q_lens)]),
            cu_seqlens_k=int32([0, *accumulate(k_lens)]),
            max_seqlen_q=max(q_lens),
            max_seqlen_k=max(k_lens),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=self.device),
        )

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, meta.slot_mapping, v)
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=meta.cu_seqlens_q,
            cu_seqlens_k=meta.cu_seqlens_k,
            max_seqlen_q=meta.max_seqlen_q,
            max_seqlen_k=meta.max_seqlen_k,
            causal=True,  # bottom-right aligned: a chunk's queries see all earlier context
            block_table=meta.block_tables,
        )


def make_attention(device: torch.device, block_size: int) -> TorchAttention | FlashAttention:
    """flash-attn on CUDA, PyTorch elsewhere; block_size 0 takes the backend's default."""
    backend = FlashAttention if device.type == "cuda" else TorchAttention
    return backend(block_size or backend.default_block_size, device)
