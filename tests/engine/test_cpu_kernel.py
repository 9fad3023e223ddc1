"""The compiled CPU kernels (decode; fp32 and bf16 prefill) against the PyTorch reference backend,
on the same paged pool."""

import random

import pytest
import torch

from tokenyard.engine import attention as attention_module
from tokenyard.engine.attention import KernelAttention, SeqSlice, TorchAttention, make_attention
from tokenyard.engine.cpu_kernels import paged_attention
from tokenyard.engine.kv_cache import Int8Pool, quantize_rows

BS = 16
CPU = torch.device("cpu")
FP32 = torch.float32


@pytest.fixture(scope="module")
def kernel():
    module = paged_attention()
    if module is None:
        pytest.skip("the CPU attention kernel did not build here (no C++ compiler or ninja)")
    return module


@pytest.fixture(scope="module")
def prefill_kernel(kernel):
    if not kernel.PREFILL_BF16:
        pytest.skip("no bf16 prefill kernel: this CPU lacks AVX512-BF16")
    return kernel


def _backend(kernel, dtype: torch.dtype, prefill: bool, int8_kv: bool = False) -> KernelAttention:
    """The kernel backend as make_attention builds it for `dtype`: with the prefill kernel or
    without; short chunks as decode rows except through the prefill kernel's exact mode, which
    reads a pool in q's dtype only."""
    exact = prefill and not int8_kv
    return KernelAttention(BS, CPU, kernel, prefill, short_rows=not exact)


def _run_both(kernel, slices, num_decodes, q, k, v, k_cache, v_cache, prefill=False):
    """The reference's and the kernel backend's outputs and written caches, from the same pool."""
    outs = []
    for backend in (TorchAttention(BS, CPU), _backend(kernel, q.dtype, prefill)):
        keys, values = k_cache.clone(), v_cache.clone()
        meta = backend.build_metadata(slices, num_decodes)
        outs.append((backend.forward(q, k, v, keys, values, meta), keys, values))
    return outs


def _pool(rng: random.Random, lengths: list[int], heads: int, dim: int, dtype: torch.dtype):
    """A pool whose blocks are handed out in shuffled order, so no table is contiguous."""
    widths = [-(-n // BS) for n in lengths]
    order = list(range(1, sum(widths) + 4))
    rng.shuffle(order)
    tables, used = [], 0
    for w in widths:
        tables.append(order[used : used + w])
        used += w
    shape = (len(order) + 1, BS, heads, dim)
    return tables, torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)


def _slots(table: list[int], n: int) -> torch.Tensor:
    """The pool slots of a sequence's first n tokens."""
    return torch.tensor([table[t // BS] * BS + t % BS for t in range(n)])


@pytest.mark.parametrize(
    ("dtype", "dim", "q_heads", "kv_heads", "tol"),
    [
        (torch.float32, 64, 9, 3, 1e-5),  # SmolLM2's shape
        (torch.float32, 128, 32, 8, 1e-5),  # Llama 3 8B's
        (torch.float32, 64, 4, 4, 1e-5),  # no GQA
        (torch.bfloat16, 64, 9, 3, 2e-2),
        (torch.bfloat16, 128, 32, 8, 2e-2),
    ],
)
@pytest.mark.parametrize("kernel_prefill", [False, True], ids=["SDPA prefill", "prefill kernel"])
def test_kernel_matches_reference(kernel, dtype, dim, q_heads, kv_heads, tol, kernel_prefill):
    """Decodes, a short chunk and a prefill chunk in one step; with the prefill kernel in fp32
    (bf16's is tested below, where the CPU has it)."""
    if kernel_prefill and dtype != FP32:
        pytest.skip("the bf16 prefill kernel has tests of its own below")
    rng = random.Random(dim * q_heads)
    # lengths at and around block edges, one token alone, and long contexts; a short chunk (a
    # speculating sequence's 1 + 4 tokens, which the kernel backend attends as 5 decode rows); a
    # prefill chunk that follows cached context
    decode_lengths = [1, 2, BS - 1, BS, BS + 1, 3 * BS, 700, 257, 40]
    short, prefill = (5, 2 * BS + 3), (30, 50)  # (new tokens, cached before them)
    lengths = [*decode_lengths, sum(short), sum(prefill)]
    tables, k_cache, v_cache = _pool(rng, lengths, kv_heads, dim, dtype)
    slices = [SeqSlice(t, n - 1, 1) for t, n in zip(tables, decode_lengths, strict=False)]
    slices.append(SeqSlice(tables[-2], short[1], short[0]))
    slices.append(SeqSlice(tables[-1], prefill[1], prefill[0]))
    tokens = len(decode_lengths) + short[0] + prefill[0]
    q = torch.randn(tokens, q_heads, dim, dtype=dtype)
    k = torch.randn(tokens, kv_heads, dim, dtype=dtype)
    v = torch.randn(tokens, kv_heads, dim, dtype=dtype)

    outs = _run_both(kernel, slices, len(decode_lengths), q, k, v, k_cache, v_cache, kernel_prefill)
    (ref, ref_k, ref_v), (ours, our_k, our_v) = outs
    assert torch.equal(ref_k, our_k) and torch.equal(ref_v, our_v)  # the same slots written
    assert ours.dtype == dtype and ours.shape == ref.shape
    assert (ours.float() - ref.float()).abs().max().item() < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("decode_lengths", [[700], [1000, 1], [9 * BS + 3, BS + 1]])
def test_split_sequences_match_reference(kernel, dtype, decode_lengths):
    """Few sequences for the threads: each one's tokens are cut into parts, attended apart and
    merged (parts of unequal length, and parts past a short sequence's end)."""
    rng = random.Random(len(decode_lengths))
    tables, k_cache, v_cache = _pool(rng, decode_lengths, 3, 64, dtype)
    slices = [SeqSlice(t, n - 1, 1) for t, n in zip(tables, decode_lengths, strict=True)]
    q, k, v = (torch.randn(len(slices), h, 64, dtype=dtype) for h in (9, 3, 3))
    (ref, _, _), (ours, _, _) = _run_both(kernel, slices, len(slices), q, k, v, k_cache, v_cache)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (ours.float() - ref.float()).abs().max().item() < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_output_does_not_depend_on_the_rest_of_the_batch(kernel, dtype):
    """Bit for bit: a decode row alone, among a few rows or among many gives the same output (a
    speculation's verify rows and a lone decode must round alike, or greedy output changes with
    speculation once activations are quantized to int8). Lengths at and around part edges."""
    lengths = [700, 1, 64, 65, 300, 129, 1000, 2, 63, 511, 128, 17, 400, 900, 33, 250]
    rng = random.Random(7)
    tables, k_cache, v_cache = _pool(rng, lengths, 3, 64, dtype)
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    lens = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn(len(lengths), 9, 64, dtype=dtype)

    def decode(rows: list[int]) -> torch.Tensor:
        return kernel.paged_decode(q[rows], k_cache, v_cache, table[rows], lens[rows], 0.125)

    together = decode(list(range(len(lengths))))
    for i in range(len(lengths)):
        assert torch.equal(decode([i]), together[i : i + 1]), lengths[i]
    assert torch.equal(decode([0, 6, 1]), together[[0, 6, 1]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("length", "chunk"), [(700, 5), (9 * BS + 3, 8), (BS + 2, 2)])
def test_a_short_chunk_alone_matches_reference(kernel, dtype, length, chunk):
    """A speculating sequence alone in its step (batch 1): its chunk's rows attend as decode rows,
    cut into parts for the threads; each row sees only its own context (the last part holds
    tokens that only the later rows see)."""
    rng = random.Random(length + chunk)
    tables, k_cache, v_cache = _pool(rng, [length], 3, 64, dtype)
    slices = [SeqSlice(tables[0], length - chunk, chunk)]
    q, k, v = (torch.randn(chunk, h, 64, dtype=dtype) for h in (9, 3, 3))
    (ref, _, _), (ours, _, _) = _run_both(kernel, slices, 0, q, k, v, k_cache, v_cache)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (ours.float() - ref.float()).abs().max().item() < tol


def _int8(pool: torch.Tensor) -> Int8Pool:
    return Int8Pool(*quantize_rows(pool))


@pytest.mark.parametrize(
    ("dtype", "prefill"),
    [(FP32, False), (FP32, True), (torch.bfloat16, False), (torch.bfloat16, True)],
    ids=["fp32", "fp32 prefill kernel", "bf16 decode rows", "bf16 prefill kernel"],
)
@pytest.mark.parametrize(("dim", "q_heads", "kv_heads"), [(64, 9, 3), (128, 32, 8)])
def test_kernel_over_an_int8_pool_matches_reference(kernel, dtype, prefill, dim, q_heads, kv_heads):
    """An int8 pool: decodes (split ones too), a short chunk and a prefill chunk (as decode rows,
    or through the prefill kernel, which dequantizes its tiles), the kernel backend against
    the reference's SDPA over the dequantized blocks; both write the step's K/V quantized the same
    way. The result is near what a float pool of the same values gives: the pool's rounding is
    small."""
    if prefill and dtype != FP32 and not kernel.PREFILL_BF16:
        pytest.skip("no bf16 prefill kernel: this CPU lacks AVX512-BF16")
    rng = random.Random(dim + q_heads)
    decode_lengths = [1, BS, BS + 1, 700, 40]
    short, chunk = (5, 2 * BS + 3), (30, 50)
    lengths = [*decode_lengths, sum(short), sum(chunk)]
    tables, k_float, v_float = _pool(rng, lengths, kv_heads, dim, dtype)
    slices = [SeqSlice(t, n - 1, 1) for t, n in zip(tables, decode_lengths, strict=False)]
    slices += [
        SeqSlice(tables[-2], short[1], short[0]),
        SeqSlice(tables[-1], chunk[1], chunk[0]),
    ]
    tokens = len(decode_lengths) + short[0] + chunk[0]
    q, k, v = (torch.randn(tokens, h, dim, dtype=dtype) for h in (q_heads, kv_heads, kv_heads))
    outs = []
    for backend in (TorchAttention(BS, CPU), _backend(kernel, dtype, prefill, int8_kv=True)):
        keys, values = _int8(k_float), _int8(v_float)
        meta = backend.build_metadata(slices, len(decode_lengths))
        outs.append((backend.forward(q, k, v, keys, values, meta), keys, values))
    (ref, ref_k, ref_v), (ours, our_k, our_v) = outs
    for a, b in ((ref_k, our_k), (ref_v, our_v)):
        assert torch.equal(a.values, b.values) and torch.equal(a.scales, b.scales)
    written = torch.cat([torch.tensor(t[:2]) for t in tables])  # some slots were written
    assert not torch.equal(ref_k.values[written], _int8(k_float).values[written])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (ours.float() - ref.float()).abs().max().item() < tol
    # against a float pool holding the same keys and values before quantizing
    backend = TorchAttention(BS, CPU)
    meta = backend.build_metadata(slices, len(decode_lengths))
    exact = backend.forward(q, k, v, k_float.clone(), v_float.clone(), meta)
    assert (ours.float() - exact.float()).abs().max().item() < 0.05


PREFILL_CHUNKS = [(0, 37), (50, 30), (0, 300), (600, 100), (5, 1), (BS, BS), (31, 33), (0, 1)]


@pytest.mark.parametrize(("dim", "q_heads", "kv_heads"), [(64, 9, 3), (128, 32, 8), (64, 4, 4)])
def test_fp32_prefill_kernel_matches_reference(kernel, dim, q_heads, kv_heads):
    """The fp32 kernel, every prefill chunk of a step in one call: fresh prompts, chunks after
    cached context, one-token chunks, chunks past one work item (32 positions) and across block
    and tile edges; behind two decodes, which must be left alone."""
    rng = random.Random(dim + q_heads)
    decode_lengths = [9, 70]
    lengths = [*decode_lengths, *(cached + new for cached, new in PREFILL_CHUNKS)]
    tables, k_cache, v_cache = _pool(rng, lengths, kv_heads, dim, FP32)
    slices = [SeqSlice(t, n - 1, 1) for t, n in zip(tables, decode_lengths, strict=False)]
    slices += [SeqSlice(t, c, n) for t, (c, n) in zip(tables[2:], PREFILL_CHUNKS, strict=True)]
    tokens = len(decode_lengths) + sum(new for _, new in PREFILL_CHUNKS)
    q, k, v = (torch.randn(tokens, h, dim) for h in (q_heads, kv_heads, kv_heads))
    (ref, ref_k, ref_v), (ours, our_k, our_v) = _run_both(
        kernel, slices, 2, q, k, v, k_cache, v_cache, prefill=True
    )
    assert torch.equal(ref_k, our_k) and torch.equal(ref_v, our_v)
    assert (ours - ref).abs().max().item() < 1e-5
    # the kernel alone, on the same pool: the backend's decode rows are not what passed
    meta = _backend(kernel, FP32, True).build_metadata(slices, 2)
    assert meta.prefill_batch is not None and meta.short_batch is None
    alone = kernel.paged_prefill(q[2:], our_k, our_v, *meta.prefill_batch, dim**-0.5)
    assert (alone - ref[2:]).abs().max().item() < 1e-5


@pytest.mark.parametrize(("dim", "q_heads", "kv_heads"), [(64, 9, 3), (128, 32, 8), (64, 4, 4)])
def test_prefill_kernel_matches_reference(prefill_kernel, dim, q_heads, kv_heads):
    """Every prefill chunk of a step in one call: fresh prompts, chunks after cached context, a
    one-token chunk, chunks past one work item (32 positions) and across block and tile edges;
    behind two decodes, which must be left alone."""
    rng = random.Random(dim + q_heads)
    chunks = PREFILL_CHUNKS
    decode_lengths = [9, 70]
    lengths = [*decode_lengths, *(cached + new for cached, new in chunks)]
    tables, k_cache, v_cache = _pool(rng, lengths, kv_heads, dim, torch.bfloat16)
    slices = [SeqSlice(t, n - 1, 1) for t, n in zip(tables, decode_lengths, strict=False)]
    slices += [SeqSlice(t, c, n) for t, (c, n) in zip(tables[2:], chunks, strict=True)]
    tokens = len(decode_lengths) + sum(new for _, new in chunks)
    q, k, v = (
        torch.randn(tokens, h, dim, dtype=torch.bfloat16) for h in (q_heads, kv_heads, kv_heads)
    )

    (ref, ref_k, ref_v), (ours, our_k, _) = _run_both(
        prefill_kernel, slices, 2, q, k, v, k_cache, v_cache, prefill=True
    )
    assert torch.equal(ref_k, our_k)
    assert (ours.float() - ref.float()).abs().max().item() < 2e-2
    # both against exact fp32 attention on the same bf16 inputs: the kernel's P.V in bf16 costs
    # no more accuracy than SDPA's bf16 path
    exact = TorchAttention(BS, CPU)
    meta = exact.build_metadata(slices, 2)
    fp32 = exact.forward(q.float(), k.float(), v.float(), ref_k.float(), ref_v.float(), meta)
    our_err = (ours.float() - fp32).abs().mean().item()
    assert our_err <= 1.5 * (ref.float() - fp32).abs().mean().item()


@pytest.mark.parametrize(("dim", "q_heads", "kv_heads"), [(64, 9, 3), (64, 4, 4)])
@pytest.mark.parametrize("chunks", [[(300, 9)], [(600, 16), (45, 3)], [(70, 2)], [(29, 5)]])
def test_prefill_kernel_splits_the_keys_of_few_rows(prefill_kernel, dim, q_heads, kv_heads, chunks):
    """A speculating sequence's chunk over its context is too few work items for the threads: each
    one's key tiles are cut into parts (some wholly after a row's position) and merged after."""
    rng = random.Random(len(chunks) + dim)
    tables, k_cache, v_cache = _pool(rng, [c + n for c, n in chunks], kv_heads, dim, torch.bfloat16)
    slices = [SeqSlice(t, c, n) for t, (c, n) in zip(tables, chunks, strict=True)]
    tokens = sum(n for _, n in chunks)
    q, k, v = (
        torch.randn(tokens, h, dim, dtype=torch.bfloat16) for h in (q_heads, kv_heads, kv_heads)
    )
    (ref, _, ref_v), (ours, our_k, _) = _run_both(
        prefill_kernel, slices, 0, q, k, v, k_cache, v_cache, prefill=True
    )
    exact = TorchAttention(BS, CPU)
    meta = exact.build_metadata(slices, 0)
    fp32 = exact.forward(q.float(), k.float(), v.float(), our_k.float(), ref_v.float(), meta)
    error = (ours.float() - fp32).abs()
    assert error.max().item() < 2e-2
    assert error.mean().item() <= 1.5 * (ref.float() - fp32).abs().mean().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    ("context", "rows", "q_heads", "kv_heads", "head_dim"),
    [
        (600, 9, 9, 3, 64),
        (45, 3, 9, 3, 64),
        (BS * 7 + 5, 16, 9, 3, 64),
        (100, 48, 3, 3, 64),
        (300, 5, 32, 2, 64),
        (257, 9, 8, 2, 128),
    ],
)
def test_exact_mode_gives_each_row_a_lone_decodes_bits(
    kernel, dtype, context, rows, q_heads, kv_heads, head_dim
):
    """A speculating sequence's rows through the prefill kernel's exact mode equal, bit for bit,
    the same rows run as decodes (greedy output with and without speculation depends on it); the
    packed form (bf16 P, or fp32 sums in another order) differs in a sizeable share. The mode
    holds a run's rows (positions x query heads per KV head) in 1 to 3 vectors: 27, 9 and 48 rows
    here, 48 positions of one head (the first rows see none of the last part's keys), 5 positions
    of 16 heads, cut into runs, and a head dimension of 128."""
    if dtype == torch.bfloat16 and not kernel.PREFILL_BF16:
        pytest.skip("no bf16 prefill kernel: this CPU lacks AVX512-BF16")
    rng = random.Random(context)
    tables, k_cache, v_cache = _pool(rng, [context], kv_heads, head_dim, dtype)
    q = (3 * torch.randn(rows, q_heads, head_dim)).to(dtype)
    args = (
        torch.tensor(tables, dtype=torch.int32),
        torch.tensor([0, rows], dtype=torch.int32),
        torch.tensor([context], dtype=torch.int32),
        head_dim**-0.5,
    )
    exact = kernel.paged_prefill(q, k_cache, v_cache, *args, exact=True)
    packed = kernel.paged_prefill(q, k_cache, v_cache, *args)
    decode = kernel.paged_decode(
        q,
        k_cache,
        v_cache,
        torch.tensor(tables * rows, dtype=torch.int32),
        torch.arange(context - rows + 1, context + 1, dtype=torch.int32),
        head_dim**-0.5,
    )
    assert torch.equal(exact, decode)
    assert (packed != decode).float().mean().item() > 0.05
    # and the decode rows are attention: against fp32 SDPA on the same inputs
    keys = k_cache.view(-1, kv_heads, head_dim)[_slots(tables[0], context)].float()
    values = v_cache.view(-1, kv_heads, head_dim)[_slots(tables[0], context)].float()
    tol = 1e-5 if dtype == FP32 else 2e-2
    for i in range(rows):
        seen = context - rows + 1 + i
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[i].float().unsqueeze(1),
            keys[:seen].transpose(0, 1).repeat_interleave(q_heads // kv_heads, 0),
            values[:seen].transpose(0, 1).repeat_interleave(q_heads // kv_heads, 0),
        ).squeeze(1)
        assert (decode[i].float() - ref).abs().max().item() < tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP32], ids=["bf16", "fp32"])
def test_exact_mode_reads_a_pool_in_qs_dtype_only(kernel, dtype):
    """An int8 pool's draft rows run as decode rows (engine/attention.py): the exact mode refuses
    one rather than round it differently; so it does a model with more query heads per KV head
    than its lanes hold."""
    if dtype == torch.bfloat16 and not kernel.PREFILL_BF16:
        pytest.skip("no bf16 prefill kernel: this CPU lacks AVX512-BF16")
    rng = random.Random(3)
    tables, k_cache, v_cache = _pool(rng, [40], 3, 64, dtype)
    (k8, k_scales), (v8, v_scales) = quantize_rows(k_cache), quantize_rows(v_cache)
    q = torch.randn(3, 9, 64).to(dtype)
    args = (
        torch.tensor(tables, dtype=torch.int32),
        torch.tensor([0, 3], dtype=torch.int32),
        torch.tensor([40], dtype=torch.int32),
        0.125,
    )
    with pytest.raises(RuntimeError, match="pool"):
        kernel.paged_prefill(q, k8, v8, *args, exact=True, k_scales=k_scales, v_scales=v_scales)
    assert make_attention(CPU, 0, 64, dtype, cpu_kernel=True, int8_kv=True).short_rows
    heads = kernel.EXACT_HEADS + 1
    _, wide_k, wide_v = _pool(rng, [40], 1, 64, dtype)
    with pytest.raises(RuntimeError, match="query heads per KV head"):
        kernel.paged_prefill(torch.randn(3, heads, 64).to(dtype), wide_k, wide_v, *args, exact=True)
    assert make_attention(CPU, 0, 64, dtype, cpu_kernel=True, group=heads).short_rows
    assert not make_attention(CPU, 0, 64, dtype, cpu_kernel=True, group=heads - 1).short_rows


def test_kernel_refuses_what_it_cannot_run(kernel):
    q = torch.randn(2, 9, 64)
    cache = torch.randn(4, BS, 3, 64)
    tables = torch.zeros(2, 1, dtype=torch.int32)
    lengths = torch.ones(2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="share a dtype"):
        kernel.paged_decode(q.bfloat16(), cache, cache, tables, lengths, 0.125)
    with pytest.raises(RuntimeError, match="int32"):
        kernel.paged_decode(q, cache, cache, tables.long(), lengths, 0.125)
    with pytest.raises(RuntimeError, match=r"\[B, Hq, 64\|128\]"):
        kernel.paged_decode(torch.randn(2, 9, 80), cache, cache, tables, lengths, 0.125)
    values, scales = quantize_rows(cache)
    with pytest.raises(RuntimeError, match="both scales"):
        kernel.paged_decode(q, values, values, tables, lengths, 0.125)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.paged_decode(q, values, values, tables, lengths, 0.125, scales, scales[:, :1])


@pytest.mark.parametrize("dtype", [FP32, torch.bfloat16])
def test_prefill_kernel_refuses_what_it_cannot_run(kernel, dtype):
    q = torch.randn(3, 9, 64, dtype=dtype)
    cache = torch.randn(4, BS, 3, 64, dtype=dtype)
    tables = torch.zeros(1, 1, dtype=torch.int32)
    starts = torch.tensor([0, 3], dtype=torch.int32)
    lengths = torch.tensor([3], dtype=torch.int32)
    run = kernel.paged_prefill
    if dtype != FP32 and not kernel.PREFILL_BF16:
        with pytest.raises(RuntimeError, match="AVX512-BF16"):
            run(q, cache, cache, tables, starts, lengths, 0.125)
        return
    other = torch.bfloat16 if dtype == FP32 else FP32
    with pytest.raises(RuntimeError, match="of one dtype"):
        run(q, cache.to(other), cache.to(other), tables, starts, lengths, 0.125)
    with pytest.raises(RuntimeError, match=r"\[T, Hq, 64\|128\]"):
        run(q[..., :40], cache, cache, tables, starts, lengths, 0.125)
    with pytest.raises(RuntimeError, match="int32"):
        run(q, cache, cache, tables, starts.long(), lengths, 0.125)
    with pytest.raises(RuntimeError, match="end at q's length"):
        run(q, cache, cache, tables, torch.tensor([0, 2], dtype=torch.int32), lengths, 0.125)
    values = quantize_rows(cache)[0]
    with pytest.raises(RuntimeError, match="both scales"):
        run(q, values, values, tables, starts, lengths, 0.125)


def test_backend_choice(kernel, monkeypatch):
    bf16, fp32 = torch.bfloat16, torch.float32
    chosen = make_attention(CPU, 0, 64, bf16, cpu_kernel=True)
    assert isinstance(chosen, KernelAttention)
    # bf16: the prefill kernel where the CPU has bf16 dots, short chunks in its exact mode
    assert chosen.prefill == kernel.PREFILL_BF16 and chosen.short_rows != kernel.PREFILL_BF16
    chosen = make_attention(CPU, 0, 64, fp32, cpu_kernel=True)
    assert chosen.prefill and not chosen.short_rows  # fp32: the kernel, short chunks exact
    assert not make_attention(CPU, 0, 64, torch.float16, cpu_kernel=True).prefill
    assert type(make_attention(CPU, 0, 64, bf16, cpu_kernel=False)) is TorchAttention
    assert type(make_attention(CPU, 0, 96, bf16, cpu_kernel=True)) is TorchAttention  # no build
    # no compiler: the PyTorch path serves
    monkeypatch.setattr(attention_module, "paged_attention", lambda: None)
    assert type(make_attention(CPU, 0, 64, bf16, cpu_kernel=True)) is TorchAttention
