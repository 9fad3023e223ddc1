"""The compiled element-wise layer ops give the PyTorch expressions' bits (engine/model.py's
reference path) in fp32 and bf16, on views of the fused projections as the model passes them."""

import os

import pytest
import torch

from tokenyard.engine.cpu_kernels import layer_ops, layer_ops_for
from tokenyard.engine.kv_cache import quantize_rows
from tokenyard.engine.lora import Part, _add
from tokenyard.engine.model import RMSNorm, apply_rotary

OPS = layer_ops()
pytestmark = pytest.mark.skipif(OPS is None, reason="CPU layer ops not built here (no compiler)")
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_rms_norm_with_and_without_residual(dtype, rows):
    torch.manual_seed(rows)
    reference, fused = RMSNorm(576, 1e-5), RMSNorm(576, 1e-5, OPS)
    weight = torch.randn(576)
    for norm in (reference, fused):
        norm.weight.data.copy_(weight)
        norm.to(dtype)
    x, residual = torch.randn(rows, 576, dtype=dtype), torch.randn(rows, 576, dtype=dtype) * 4
    # the sum of squares adds up in another order: a scale one fp32 ulp apart can move a bf16
    # result by one ulp, twice rounded (the normalized value, then times the weight)
    ulps = 2**-6 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(fused(x), reference(x), rtol=ulps, atol=0)
    (normed, total), (ref_normed, ref_total) = (
        n.add_forward(x, residual) for n in (fused, reference)
    )
    assert torch.equal(total, ref_total)
    torch.testing.assert_close(normed, ref_normed, rtol=ulps, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_on_projection_views(dtype):
    torch.manual_seed(0)
    tokens, heads, kv_heads, dim = 7, 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)
    angles = torch.rand(tokens, 1, dim) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    expected_q, expected_k = apply_rotary(q, k, cos, sin)
    v_before = v.clone()
    OPS.rotary_(q, k, cos, sin)
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k)
    assert torch.equal(v, v_before)  # the rest of the projection's output is untouched


def test_bad_shapes_are_refused():
    with pytest.raises(RuntimeError, match="weight"):
        OPS.rms_norm(torch.randn(2, 8), None, torch.ones(4), 1e-5)
    q, k = torch.randn(2, 3, 8), torch.randn(2, 1, 8)
    with pytest.raises(RuntimeError, match="cos and sin"):
        OPS.rotary_(q, k, torch.randn(8, 2).t(), torch.randn(2, 8))  # not contiguous
    # the ops work in whole vectors of the machine's width (8 or 16 floats): other widths are
    # refused, and a model with them keeps to PyTorch's ops
    lanes = OPS.LANES
    assert lanes in (8, 16)
    hidden, head = 5 * lanes // 2, 3 * lanes  # half a head: 1.5 vectors
    with pytest.raises(RuntimeError, match=f"multiple of {lanes}"):
        OPS.rms_norm(torch.randn(2, hidden), None, torch.ones(hidden), 1e-5)
    with pytest.raises(RuntimeError, match=f"multiple of {2 * lanes}"):
        OPS.rotary_(
            torch.randn(2, 3, head),
            torch.randn(2, 1, head),
            torch.randn(2, head),
            torch.randn(2, head),
        )
    assert layer_ops_for(576, 64) is OPS and layer_ops_for(576, 128) is OPS
    assert layer_ops_for(hidden, 64) is None and layer_ops_for(576, head) is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_the_mlp(dtype):
    """Equal to F.silu(gate) * up but for exp's last bit: within one bf16 rounding step, and for
    fp32 a few ulps; a width that is not a multiple of the vector (the tail lanes) included."""
    torch.manual_seed(1)
    for width in (1536, 100):
        gate_up = torch.randn(6, 2 * width, dtype=dtype) * 4
        gate_up[0, :3] = torch.tensor([-120.0, 95.0, 0.0])  # past exp's clamp, and zero
        gate, up = gate_up.split(width, dim=-1)
        expected = torch.nn.functional.silu(gate) * up
        rtol = 2**-7 if dtype == torch.bfloat16 else 1e-6
        torch.testing.assert_close(OPS.silu_mul(gate_up), expected, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_to_cache_rotates_and_writes_the_pool(dtype):
    """The fused decode op equals split + rotary + index_copy_ into the pool, returns q as a view
    of the projection, writes only the given slots, and refuses a slot outside the pool."""
    torch.manual_seed(2)
    tokens, heads, kv_heads, dim = 3, 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype)
    angles = torch.rand(tokens, 1, dim) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    q, k, v = qkv.clone().split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = apply_rotary(q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim), cos, sin)
    k_pool, v_pool = (
        torch.zeros(20, kv_heads, dim, dtype=dtype),
        torch.zeros(20, kv_heads, dim, dtype=dtype),
    )
    slots = torch.tensor([7, 0, 19])
    out = OPS.rotary_to_cache_(qkv, heads, kv_heads, cos, sin, k_pool, v_pool, slots)
    assert torch.equal(out, q) and out.data_ptr() == qkv.data_ptr()
    assert torch.equal(k_pool[slots], k) and torch.equal(
        v_pool[slots], v.view(tokens, kv_heads, dim)
    )
    untouched = [i for i in range(20) if i not in slots.tolist()]
    assert not k_pool[untouched].any() and not v_pool[untouched].any()
    with pytest.raises(RuntimeError, match="outside the pool"):
        OPS.rotary_to_cache_(
            qkv, heads, kv_heads, cos, sin, k_pool, v_pool, torch.tensor([0, 1, 20])
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_to_cache_quantizes_into_an_int8_pool(dtype):
    """Into an int8 pool, the rotated K and V rows go as kv_cache.quantize_rows rounds them, bit
    for bit (the module path quantizes with it), a scale per (slot, head); a zero row's is 0."""
    torch.manual_seed(3)
    tokens, heads, kv_heads, dim = 4, 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype) * 5
    qkv[1, -dim:] = 0  # one V row of zeros
    angles = torch.rand(tokens, 1, dim) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    q, k, v = qkv.clone().split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = apply_rotary(q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim), cos, sin)
    pools = [torch.zeros(12, kv_heads, dim, dtype=torch.int8) for _ in range(2)]
    scales = [torch.zeros(12, kv_heads) for _ in range(2)]
    slots = torch.tensor([3, 11, 0, 5])
    out = OPS.rotary_to_cache_(qkv, heads, kv_heads, cos, sin, *pools, slots, *scales)
    assert torch.equal(out, q)
    for rows, pool, scale in ((k, pools[0], scales[0]), (v, pools[1], scales[1])):
        values, expected = quantize_rows(rows.reshape(tokens, kv_heads, dim))
        assert torch.equal(pool[slots], values) and torch.equal(scale[slots], expected)
        assert pool[slots].abs().amax(-1).ge(126).sum() >= tokens * kv_heads - 1
    assert scales[1][11, -1] == 0 and not pools[1][11, -1].any()
    with pytest.raises(RuntimeError, match="scales"):
        OPS.rotary_to_cache_(qkv, heads, kv_heads, cos, sin, *pools, slots)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [None, [0], [4, 1, 6]], ids=["all", "one", "some"])
def test_lora_add_matches_pytorch(dtype, rows):
    """One part of an adapter on a fused projection's columns (here k_proj's in Q/K/V), on every
    row or some: as PyTorch computes it in fp32 and rounds once (the products add up in another
    order: within an ulp or two), and only those rows and columns change."""
    torch.manual_seed(len(rows or ()))
    x = torch.randn(7, 576, dtype=dtype)
    y = torch.randn(7, 960, dtype=dtype)
    part = Part(torch.randn(8, 576, dtype=dtype) / 24, torch.randn(8, 192, dtype=dtype), 576)
    index = None if rows is None else torch.tensor(rows)
    ours = y.clone()
    OPS.lora_add_(ours, x, part.a, part.b, index, part.offset)
    # the reference in fp32 (PyTorch in bf16 would round the thin product too), rounded once
    theirs = y.float()
    _add(theirs, x.float(), Part(part.a.float(), part.b.float(), part.offset), index)
    # fp32: sums of 576 products of about 1 in another order differ by a few 1e-6
    close = 2**-7 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(ours, theirs.to(dtype), rtol=close, atol=close)
    changed = (ours != y).any(dim=1).tolist()
    assert changed == [rows is None or r in rows for r in range(7)]
    assert torch.equal(ours[:, :576], y[:, :576]) and torch.equal(ours[:, 768:], y[:, 768:])


def test_lora_add_refuses_what_it_cannot_take():
    x, y = torch.randn(2, 576), torch.randn(2, 960)
    a, b = torch.randn(8, 576), torch.randn(8, 192)
    with pytest.raises(RuntimeError, match="shapes"):
        OPS.lora_add_(y, x, a, b, None, 800)  # past the output's columns
    with pytest.raises(RuntimeError, match="dtype"):
        OPS.lora_add_(y, x.bfloat16(), a, b, None, 0)
    with pytest.raises(RuntimeError, match="out of range"):
        OPS.lora_add_(y, x, a, b, torch.tensor([0, 2]), 0)
    with pytest.raises(RuntimeError, match="multiples"):
        OPS.lora_add_(y, x[:, :570].contiguous(), a[:, :570].contiguous(), b, None, 0)


def test_a_kernel_build_puts_path_back(monkeypatch):
    """The build puts the pip package's ninja on PATH only for its own time: servers and commands
    started from this process afterwards see the environment they were given."""
    import ninja

    from tokenyard.engine import cpu_kernels

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with cpu_kernels._ninja_on_path():
        assert os.environ["PATH"] == os.pathsep.join([ninja.BIN_DIR, "/usr/bin:/bin"])
    assert os.environ["PATH"] == "/usr/bin:/bin"
    source = str(cpu_kernels.CSRC / "layer_ops.cpp")
    assert cpu_kernels._build("tokenyard_layer_ops", [source], cpu_kernels.QUANT_CFLAGS) is not None
    assert os.environ["PATH"] == "/usr/bin:/bin"
    monkeypatch.delenv("PATH")
    with cpu_kernels._ninja_on_path():
        assert os.environ["PATH"] == ninja.BIN_DIR
    assert "PATH" not in os.environ
