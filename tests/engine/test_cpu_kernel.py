"""The compiled CPU decode kernel against the PyTorch reference backend, on the same paged pool."""

import random

import pytest
import torch

from engine import attention as attention_module
from engine.attention import KernelAttention, SeqSlice, TorchAttention, make_attention
from engine.cpu_kernels import paged_attention

BS = 16
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def kernel():
    module = paged_attention()
    if module is None:
        pytest.skip("the CPU attention kernel did not build here (no C++ compiler or ninja)")
    return module


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
def test_kernel_matches_reference(kernel, dtype, dim, q_heads, kv_heads, tol):
    rng = random.Random(dim * q_heads)
    # lengths at and around block edges, one token alone, and long contexts; plus a prefill chunk
    # that follows cached context, which both backends run the same way
    decode_lengths = [1, 2, BS - 1, BS, BS + 1, 3 * BS, 700, 257, 40]
    prefill = (30, 50)  # 30 new tokens after 50 cached
    lengths = [*decode_lengths, sum(prefill)]
    tables, k_cache, v_cache = _pool(rng, lengths, kv_heads, dim, dtype)
    slices = [SeqSlice(t, n - 1, 1) for t, n in zip(tables, decode_lengths, strict=False)]
    slices.append(SeqSlice(tables[-1], prefill[1], prefill[0]))
    tokens = len(decode_lengths) + prefill[0]
    q = torch.randn(tokens, q_heads, dim, dtype=dtype)
    k = torch.randn(tokens, kv_heads, dim, dtype=dtype)
    v = torch.randn(tokens, kv_heads, dim, dtype=dtype)

    outs = []
    for backend in (TorchAttention(BS, CPU), KernelAttention(BS, CPU, kernel)):
        keys, values = k_cache.clone(), v_cache.clone()
        meta = backend.build_metadata(slices, len(decode_lengths))
        outs.append((backend.forward(q, k, v, keys, values, meta), keys, values))
    (ref, ref_k, ref_v), (ours, our_k, our_v) = outs
    assert torch.equal(ref_k, our_k) and torch.equal(ref_v, our_v)  # the same slots written
    assert ours.dtype == dtype and ours.shape == ref.shape
    assert (ours.float() - ref.float()).abs().max().item() < tol


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


def test_backend_choice(kernel, monkeypatch):
    assert isinstance(make_attention(CPU, 0, 64, cpu_kernel=True), KernelAttention)
    assert type(make_attention(CPU, 0, 64, cpu_kernel=False)) is TorchAttention
    assert type(make_attention(CPU, 0, 96, cpu_kernel=True)) is TorchAttention  # no such build
    # no compiler: the PyTorch path serves
    monkeypatch.setattr(attention_module, "paged_attention", lambda: None)
    assert type(make_attention(CPU, 0, 64, cpu_kernel=True)) is TorchAttention
