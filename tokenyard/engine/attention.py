"""Attention over the paged KV layout: one interface; backends for CPU (compiled decode and bf16
prefill kernels, else PyTorch alone) and CUDA (flash-attn).

The KV pool of a layer is `[num_blocks, block_size, num_kv_heads, head_dim]` for K and for V,
in the model's dtype or in int8 with a scale per row (kv_cache.Int8Pool; CPU backends only).
A step's tokens are flattened into one batch: decodes first (one token each), then prefill chunks.
"""

from dataclasses import dataclass
from itertools import accumulate
from types import ModuleType

import torch
import torch.nn.functional as F

from tokenyard.engine.cpu_kernels import HEAD_DIMS, paged_attention
from tokenyard.engine.kv_cache import Int8Pool, quantize_rows

# one layer's K or V pool: [num_blocks, block_size, Hkv, D] in the model's dtype, or int8
Pool = torch.Tensor | Int8Pool

# chunks up to this long (a speculating sequence's 1 + n tokens) attend as lone decodes do, to the
# bit: greedy output is then the same with and without speculation. They run through the prefill
# kernel's exact mode (bf16 or fp32), which shares the decode kernel's arithmetic (csrc/
# attention_parts.h; the rows in vector lanes: a layer over 600 tokens of context, 9 rows in about
# half the time they take as decode rows); with an int8 pool, or more query heads per KV head than
# the mode's lanes hold, as decode rows, each over the context up to its token (bench/RESULTS.md,
# issue 17)
SHORT_CHUNK = 16


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
    # the first num_decodes tokens attend as decode rows: one query over its sequence's context up
    # to itself (single-token decodes; with KernelAttention without its prefill kernel, also the
    # tokens of short chunks)
    num_decodes: int
    # PyTorch backend: per group of decodes of similar length, (first, end, block ids [B, W],
    # mask [B, 1, 1, W * block_size]); per prefill chunk, (q_start, q_end, block ids, context)
    decodes: list[tuple[int, int, torch.Tensor, torch.Tensor]] | None = None
    prefills: list[tuple[int, int, torch.Tensor, int]] | None = None
    # CPU prefill kernel: the chunks' block tables [S, W], offsets of their rows in the prefill
    # part of q [S + 1] and context lengths [S], all int32; first the `num_short` tokens of the
    # short chunks (SHORT_CHUNK) right after the decodes, then the other chunks
    short_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    num_short: int = 0
    prefill_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # flash-attn backend
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    # flash-attn: every sequence's [B, max_blocks] int32; CPU kernel: the decodes' (and their
    # context lengths, [B] int32)
    block_tables: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None


def _int32(values: list[int] | list[list[int]], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


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

    def _padded_tables(self, group: list[SeqSlice]) -> tuple[int, list[list[int]]]:
        """The group's widest table (in blocks), and every table padded with block 0 to it."""
        width = max(self._width(s) for s in group)
        return width, [s.block_table[:width] + [0] * (width - len(s.block_table)) for s in group]

    def _decode_group(self, group: list[SeqSlice], first: int, end: int) -> tuple:
        width, tables = self._padded_tables(group)
        blocks = torch.tensor(tables, dtype=torch.long, device=self.device)
        lengths = torch.tensor([s.context_len for s in group], device=self.device)
        positions = torch.arange(width * self.block_size, device=self.device)
        mask = (positions[None, :] < lengths[:, None])[:, None, None, :]
        return first, end, blocks, mask

    def _blocks(self, s: SeqSlice) -> torch.Tensor:
        return torch.tensor(s.block_table[: self._width(s)], dtype=torch.long, device=self.device)

    def build_metadata(self, slices: list[SeqSlice], num_decodes: int) -> AttentionMetadata:
        slots = torch.tensor(_slot_mapping(slices, self.block_size), device=self.device)
        meta = AttentionMetadata(slots, num_decodes)
        self._decode_metadata(slices[:num_decodes], meta)
        self._prefill_metadata(slices[num_decodes:], meta)
        return meta

    def _prefill_metadata(self, prefills: list[SeqSlice], meta: AttentionMetadata) -> None:
        meta.prefills, start = [], meta.num_decodes
        for s in prefills:
            meta.prefills.append((start, start + s.num_new, self._blocks(s), s.context_len))
            start += s.num_new

    def _decode_metadata(self, decodes: list[SeqSlice], meta: AttentionMetadata) -> None:
        meta.decodes, first = [], 0
        while first < len(decodes):  # decodes come sorted by length: group similar widths
            base = self._width(decodes[first])
            end = first + 1
            while end < len(decodes) and self._width(decodes[end]) <= base * 1.25 + 1:
                end += 1
            meta.decodes.append(self._decode_group(decodes[first:end], first, end))
            first = end

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        self._write_kv(k, v, k_cache, v_cache, meta)
        return self.attend(q, k_cache, v_cache, meta)

    def attend(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        """The step's attention over K/V already in the pool."""
        out = torch.empty_like(q)
        self._decode(q, k_cache, v_cache, meta, out)
        self._prefill(q, k_cache, v_cache, meta, out)
        return out

    @staticmethod
    def _write_kv(k, v, k_cache: Pool, v_cache: Pool, meta: AttentionMetadata) -> None:
        for rows, pool in ((k, k_cache), (v, v_cache)):
            if isinstance(pool, Int8Pool):
                values, scales = quantize_rows(rows)
                heads = pool.scales.shape[-1]
                pool.values.view(-1, *values.shape[1:]).index_copy_(0, meta.slot_mapping, values)
                pool.scales.view(-1, heads).index_copy_(0, meta.slot_mapping, scales)
            else:
                pool.view(-1, *pool.shape[2:]).index_copy_(0, meta.slot_mapping, rows)

    @staticmethod
    def _gather(pool: Pool, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The pool's blocks [len(blocks), block_size, Hkv, D], in `dtype`."""
        if isinstance(pool, Int8Pool):
            values = pool.values.index_select(0, blocks).float()
            return (values * pool.scales.index_select(0, blocks).unsqueeze(-1)).to(dtype)
        return pool.index_select(0, blocks)

    def _prefill(self, q, k_cache, v_cache, meta: AttentionMetadata, out: torch.Tensor) -> None:
        for q_start, q_end, blocks, context in meta.prefills:
            num_new = q_end - q_start
            keys = self._gather(k_cache, blocks, q.dtype).flatten(0, 1)[:context]
            values = self._gather(v_cache, blocks, q.dtype).flatten(0, 1)[:context]
            mask = None
            if num_new != context:  # a later chunk: its queries see every earlier token
                rows = torch.arange(context - num_new, context, device=q.device)
                mask = torch.arange(context, device=q.device)[None, :] <= rows[:, None]
            # batched 4-D inputs: PyTorch's CPU flash kernel takes those (3-D ones fall back to
            # its unfused math path, 2-4x slower)
            out[q_start:q_end] = F.scaled_dot_product_attention(
                q[q_start:q_end].transpose(0, 1)[None],
                keys.transpose(0, 1)[None],
                values.transpose(0, 1)[None],
                attn_mask=mask,
                is_causal=mask is None,
                enable_gqa=True,
            )[0].transpose(0, 1)

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata, out: torch.Tensor) -> None:
        for first, end, blocks, mask in meta.decodes:
            n = end - first
            keys = self._gather(k_cache, blocks.flatten(), q.dtype)
            keys = keys.view(n, -1, *keys.shape[2:])
            values = self._gather(v_cache, blocks.flatten(), q.dtype).view(keys.shape)
            out[first:end] = F.scaled_dot_product_attention(
                q[first:end].unsqueeze(2),
                keys.transpose(1, 2),
                values.transpose(1, 2),
                attn_mask=mask,
                enable_gqa=True,
            ).squeeze(2)


def _kernel_pools(k_cache: Pool, v_cache: Pool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A layer's pools as the kernels take them: the tensors, and an int8 pool's scales."""
    if isinstance(k_cache, Int8Pool):
        assert isinstance(v_cache, Int8Pool)
        return (
            k_cache.values,
            v_cache.values,
            {"k_scales": k_cache.scales, "v_scales": v_cache.scales},
        )
    return k_cache, v_cache, {}


class KernelAttention(TorchAttention):
    """CPU backend: one call of the compiled kernel (engine/csrc) decodes every sequence, reading
    K/V in place through the block tables; with `prefill`, the prefill chunks run through the
    prefill kernel (fp32, or bf16 on a CPU with bf16 dot products), else through SDPA as in
    TorchAttention. Short chunks (speculation's verify rows) run as decode rows where
    `short_rows`, each over the context up to its token; else through the prefill kernel's exact
    mode, in a call of their own: either way each row's bits are a lone decode's."""

    def __init__(
        self,
        block_size: int,
        device: torch.device,
        kernel: ModuleType,
        prefill: bool,
        short_rows: bool,
    ):
        super().__init__(block_size, device)
        self.kernel = kernel
        self.prefill = prefill
        self.short_rows = short_rows

    def attend(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        """As TorchAttention's (engine/cpu_decode.py calls it after writing K/V with the rotary
        embedding)."""
        if meta.num_decodes < q.shape[0]:
            return super().attend(q, k_cache, v_cache, meta)
        # decodes only (most steps): the kernel's output is the result, no copy into a buffer
        return self._kernel_decode(q, k_cache, v_cache, meta)

    def _kernel_decode(self, q, k_cache: Pool, v_cache: Pool, meta: AttentionMetadata):
        keys, values, scales = _kernel_pools(k_cache, v_cache)
        lens, scale = meta.context_lens, q.shape[-1] ** -0.5
        return self.kernel.paged_decode(q, keys, values, meta.block_tables, lens, scale, **scales)

    @staticmethod
    def _num_short(slices: list[SeqSlice]) -> int:
        """How many of these chunks, from the first, are short."""
        count = 0
        while count < len(slices) and slices[count].num_new <= SHORT_CHUNK:
            count += 1
        return count

    def build_metadata(self, slices: list[SeqSlice], num_decodes: int) -> AttentionMetadata:
        if not self.short_rows:
            return super().build_metadata(slices, num_decodes)
        # the short chunks right after the decodes run as that many decode rows
        split = num_decodes + self._num_short(slices[num_decodes:])
        rows = [
            s if s.num_new == 1 else SeqSlice(s.block_table, s.num_computed + j, 1)
            for s in slices[:split]
            for j in range(s.num_new)
        ]
        return super().build_metadata(rows + slices[split:], len(rows))

    def _kernel_batch(self, chunks: list[SeqSlice]) -> tuple[torch.Tensor, ...] | None:
        if not chunks:
            return None
        _, tables = self._padded_tables(chunks)
        starts = [0, *accumulate(s.num_new for s in chunks)]
        lengths = [s.context_len for s in chunks]
        return tuple(_int32(x, self.device) for x in (tables, starts, lengths))

    def _prefill_metadata(self, prefills: list[SeqSlice], meta: AttentionMetadata) -> None:
        if not self.prefill:
            return super()._prefill_metadata(prefills, meta)
        split = self._num_short(prefills)
        meta.short_batch = self._kernel_batch(prefills[:split])
        meta.num_short = sum(s.num_new for s in prefills[:split])
        meta.prefill_batch = self._kernel_batch(prefills[split:])

    def _prefill(self, q, k_cache, v_cache, meta: AttentionMetadata, out: torch.Tensor) -> None:
        if not self.prefill:
            return super()._prefill(q, k_cache, v_cache, meta, out)
        scale = q.shape[-1] ** -0.5
        first, split = meta.num_decodes, meta.num_decodes + meta.num_short
        keys, values, scales = _kernel_pools(k_cache, v_cache)
        if meta.short_batch:
            out[first:split] = self.kernel.paged_prefill(
                q[first:split], keys, values, *meta.short_batch, scale, exact=True, **scales
            )
        if meta.prefill_batch:
            out[split:] = self.kernel.paged_prefill(
                q[split:], keys, values, *meta.prefill_batch, scale, **scales
            )

    def _decode_metadata(self, decodes: list[SeqSlice], meta: AttentionMetadata) -> None:
        if not decodes:
            return
        _, tables = self._padded_tables(decodes)
        meta.block_tables = _int32(tables, self.device)
        meta.context_lens = _int32([s.context_len for s in decodes], self.device)

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata, out: torch.Tensor) -> None:
        n = meta.num_decodes
        if n:
            out[:n] = self._kernel_decode(q[:n], k_cache, v_cache, meta)


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
        q_lens = [s.num_new for s in slices]
        k_lens = [s.context_len for s in slices]
        width = max(len(s.block_table) for s in slices)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in slices]
        return AttentionMetadata(
            slot_mapping=torch.tensor(_slot_mapping(slices, self.block_size), device=self.device),
            num_decodes=num_decodes,
            cu_seqlens_q=_int32([0, *accumulate(q_lens)], self.device),
            cu_seqlens_k=_int32([0, *accumulate(k_lens)], self.device),
            max_seqlen_q=max(q_lens),
            max_seqlen_k=max(k_lens),
            block_tables=_int32(tables, self.device),
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


def make_attention(
    device: torch.device,
    block_size: int,
    head_dim: int,
    dtype: torch.dtype,
    cpu_kernel: bool,
    int8_kv: bool = False,
    group: int = 1,
) -> TorchAttention | FlashAttention:
    """flash-attn on CUDA; on CPU the compiled kernels where they build (and `cpu_kernel`: decode
    always; prefill for fp32, and for bf16 on CPUs with bf16 dot products), else PyTorch alone.
    block_size 0 takes the backend's default. `int8_kv`: the pool is int8 (CPU only: flash-attn
    reads a pool in the model's dtype). `group`: query heads per KV head."""
    if device.type == "cuda":
        if int8_kv:
            raise ValueError("an int8 KV cache is a CPU feature: flash-attn reads bf16 pools")
        return FlashAttention(block_size or FlashAttention.default_block_size, device)
    block_size = block_size or TorchAttention.default_block_size
    kernel = paged_attention() if cpu_kernel and head_dim in HEAD_DIMS else None
    if kernel is None:
        return TorchAttention(block_size, device)
    bf16 = dtype == torch.bfloat16 and kernel.PREFILL_BF16
    # fp16 activations stay with SDPA; fp32 ones take the fp32 kernel
    prefill = bf16 or dtype == torch.float32
    # the exact mode reads a pool in q's dtype: an int8 one's drafts run as decode rows
    exact = prefill and not int8_kv and group <= kernel.EXACT_HEADS
    return KernelAttention(block_size, device, kernel, prefill, short_rows=not exact)
