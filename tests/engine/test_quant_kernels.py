"""Quantized weights: GGUF blocks converted exactly, and the compiled matmuls (AVX-512 VNNI and
AVX2 paths) against the PyTorch reference, on odd shapes and block edges."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize

from tests.engine.conftest import needs_bf16_matmuls
from tokenyard.engine.cpu_kernels import QUANT_ISAS, quant_isa, quant_matmul
from tokenyard.engine.loader import gguf_weight
from tokenyard.engine.packed_linear import PackedLinear
from tokenyard.engine.quant import (
    BLOCK,
    GGUF_TYPES,
    PANEL,
    QuantizedTensor,
    from_gguf,
    from_panels,
    pack_q4,
    quantize,
    to_panels,
)
from tokenyard.engine.quantized_linear import (
    COPY_ROWS,
    DENSE_ROWS,
    QuantizedEmbedding,
    QuantizedLinear,
)

KERNELS = quant_matmul()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="quantized kernels not built here")
ISAS = [isa for isa in QUANT_ISAS.values() if KERNELS is not None and isa <= KERNELS.best_isa()]
# where each format keeps its fp16 scales: (offset, low, high) of a sane random value
SCALE_FIELDS = {
    "Q4_0": [(0, 0.002, 0.02)],
    "Q4_1": [(0, 0.002, 0.02), (2, -0.15, 0.0)],
    "Q8_0": [(0, 0.0002, 0.002)],
    "Q4_K": [(0, 0.0002, 0.002), (2, 0.0002, 0.002)],
    "Q6_K": [(208, 0.0002, 0.002)],
    # formats the kernels have no layout for (loaded as int8)
    "Q5_0": [(0, 0.002, 0.02)],
    "Q5_1": [(0, 0.002, 0.02), (2, -0.15, 0.0)],
    "Q5_K": [(0, 0.0002, 0.002), (2, 0.0002, 0.002)],
    "Q3_K": [(108, 0.0002, 0.002)],
    "Q2_K": [(80, 0.0002, 0.002), (82, 0.0002, 0.002)],
    "IQ4_XS": [(0, 0.0002, 0.002)],
}
REQUANTIZED = ("Q5_0", "Q5_1", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS")


def random_gguf(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random raw blocks of a GGUF type: any bytes are valid levels; the fp16 scales are set."""
    rng = np.random.default_rng(seed)
    block_weights, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    n_blocks = rows * cols // block_weights
    raw = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    for offset, low, high in SCALE_FIELDS[type_name]:
        scale = rng.uniform(low, high, n_blocks).astype(np.float16)
        raw[:, offset : offset + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, -1)


def shapes(type_name: str) -> list[tuple[int, int]]:
    """Odd row counts; for 32-weight formats an odd number of blocks (the kernels' tail)."""
    if GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0] == 256:
        return [(37, 256), (5, 768)]
    return [(37, 7 * BLOCK), (3, 16 * BLOCK), (61, BLOCK)]


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """What the kernels multiply: x rounded per block of 32 to int8 levels times the block scale."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return (torch.round(blocks * inv) * (amax / 127)).reshape(x.shape)


@pytest.mark.parametrize("type_name", GGUF_TYPES)
def test_gguf_blocks_dequantize_like_gguf(type_name):
    for rows, cols in shapes(type_name):
        raw = random_gguf(type_name, rows, cols)
        weight = from_gguf(raw, type_name, rows, cols)
        expected = gguf_dequantize(raw, GGMLQuantizationType[type_name]).reshape(rows, cols)
        assert weight.shape == (rows, cols)
        assert torch.equal(weight.dequantize(), torch.from_numpy(expected)), (rows, cols)
        some_rows = torch.tensor([rows - 1, 0])
        assert torch.equal(weight.dequantize(some_rows), torch.from_numpy(expected[[rows - 1, 0]]))


@pytest.mark.parametrize("type_name", REQUANTIZED)
def test_other_gguf_formats_load_as_int8_within_a_step_of_their_values(type_name):
    """A format the kernels have no layout for (Q5_K of Q5_K_M files, ...) loads as int8 from its
    values, each within half a level (1/254 of its block's largest weight), not as floats."""
    kind = GGMLQuantizationType[type_name]
    for rows, cols in shapes(type_name):
        raw = random_gguf(type_name, rows, cols)
        expected = torch.from_numpy(gguf_dequantize(raw, kind).reshape(rows, cols))
        weight = gguf_weight(raw, kind, (rows, cols), keep_quantized=True)
        assert isinstance(weight, QuantizedTensor)
        assert (weight.kind, weight.source) == ("q8", f"{type_name}, in int8")
        blocks = expected.reshape(rows, -1, BLOCK)
        err = (weight.dequantize().reshape(blocks.shape) - blocks).abs()
        assert (err <= blocks.abs().amax(-1, keepdim=True) / 254 * 1.0001).all()
        assert err.max() > 0  # rounded: not one of the layouts kept as shipped
        dense = gguf_weight(raw, kind, (rows, cols), keep_quantized=False)
        assert torch.equal(dense, expected)  # quantization none: the format's own values


def test_gguf_vectors_and_float_matrices_stay_float():
    norm = np.ones(64, np.float32)
    assert torch.equal(gguf_weight(norm, GGMLQuantizationType.F32, (64,), True), torch.ones(64))
    matrix = np.eye(32, dtype=np.float16)
    loaded = gguf_weight(matrix, GGMLQuantizationType.F16, (32, 32), True)
    assert loaded.dtype == torch.float32 and torch.equal(loaded, torch.eye(32))


@pytest.mark.parametrize("type_name", GGUF_TYPES)
def test_panels_reorder_exactly(type_name):
    """The kernels' panel layout holds the same levels and scales: back to rows it is the same
    tensor, and the reference reads it the same; rows past a multiple of 16 are padding."""
    rows, cols = shapes(type_name)[0]
    weight = from_gguf(random_gguf(type_name, rows, cols), type_name, rows, cols)
    panels = to_panels(weight)
    assert panels.shape == weight.shape and panels.qs.shape[0] == -(-rows // PANEL)
    back = from_panels(panels)
    for name in ("qs", "scales", "mins"):
        original, restored = getattr(weight, name), getattr(back, name)
        assert (original is None and restored is None) or torch.equal(original, restored), name
    assert torch.equal(panels.dequantize(), weight.dequantize())
    some_rows = torch.tensor([rows - 1, 0])
    assert torch.equal(panels.dequantize(some_rows), weight.dequantize(some_rows))
    if KERNELS is not None:  # the embedding looks rows up in the panels, bit for bit
        ids = torch.tensor([[rows - 1, 0, 5], [5, 17, 2]])
        looked_up = QuantizedEmbedding(panels)(ids)
        assert torch.equal(looked_up, weight.dequantize(ids.reshape(-1)).reshape(2, 3, cols))


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", GGUF_TYPES)
def test_matmul_matches_reference(type_name, isa):
    """Against x' @ W.T with x' the activations as the kernel rounds them: equal up to fp32
    summation order (1e-4 of the output's scale); against unrounded x: within 3% (the int8
    activations' error, about 0.5% here)."""
    torch.manual_seed(0)
    for rows, cols in shapes(type_name):
        layer = QuantizedLinear(
            from_gguf(random_gguf(type_name, rows, cols), type_name, rows, cols)
        )
        layer.isa = isa
        w = layer.weight.dequantize()
        for m in (1, 2, 3, 4, 5, 9, 16, 17):
            x = torch.randn(m, cols)
            x[0, :BLOCK] = 0  # an all-zero block: scale 0 must not divide by zero
            y = layer(x)
            exact = quantized_activations(x) @ w.T
            scale = exact.abs().max().item()
            torch.testing.assert_close(y, exact, rtol=1e-4, atol=1e-4 * scale)
            assert (y - x @ w.T).norm() <= 0.03 * (x @ w.T).norm()


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_q4_at_the_extremes_of_its_sums(isa):
    """Every level 15 against activations that all quantize to +-127: the largest dot products a
    q4 block can make (AVX2 sums a block's 16 products per lane in int16 before widening: at most
    30480), over steps of 1 to 33 rows (tiles of 4 on AVX2, 16 with VNNI), exact in the outputs."""
    rows, cols = 20, 4 * BLOCK
    levels = np.full((rows, cols), 15, dtype=np.uint8)
    ones = np.ones((rows, cols // BLOCK), dtype=np.float32)
    layer = QuantizedLinear(pack_q4(levels, ones, 0 * ones, "int4"))
    layer.isa = isa
    for m in (1, 4, 5, 8, 9, 13, 16, 17, 33):
        signs = torch.tensor([(-1.0) ** i for i in range(m)]).unsqueeze(1)
        x = signs * torch.ones(m, cols)
        expected = (signs * 15.0 * cols).expand(m, rows)
        torch.testing.assert_close(layer(x), expected, rtol=1e-6, atol=0)


@needs_kernels
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_bf16_input_and_dense_path(kind):
    """bf16 activations give bf16 outputs close to fp32's; from DENSE_ROWS rows up the layer
    multiplies the dequantized weight (oneDNN) and matches the reference closely."""
    torch.manual_seed(1)
    layer = QuantizedLinear(quantize(torch.randn(50, 9 * BLOCK), kind))
    w = layer.weight.dequantize()
    x = torch.randn(3, 9 * BLOCK)
    y16 = layer(x.bfloat16())
    assert y16.dtype == torch.bfloat16
    y = layer(x)
    assert (y16.float() - y).norm() <= 0.02 * y.norm()
    # equal but for the last bit where the compiler fuses d * q + m into one rounding
    torch.testing.assert_close(layer.dense(torch.float32), w, rtol=1e-6, atol=1e-6)
    big = torch.randn(DENSE_ROWS + 1, 9 * BLOCK)
    torch.testing.assert_close(layer(big), big @ w.T, rtol=1e-4, atol=1e-3)


@needs_kernels
@needs_bf16_matmuls
def test_kept_bf16_copy_serves_larger_steps():
    """With a dense copy, bf16 steps from COPY_ROWS rows multiply the packed bf16 weight; smaller
    steps, and fp32 ones, stay on the int8 kernels."""
    torch.manual_seed(3)
    layer = QuantizedLinear(quantize(torch.randn(70, 9 * BLOCK), "int4"))
    plain = QuantizedLinear(layer.weight)
    layer.keep_dense_copy()
    copy = PackedLinear(layer.weight.dequantize().bfloat16())
    big, small = torch.randn(COPY_ROWS, 9 * BLOCK), torch.randn(COPY_ROWS - 1, 9 * BLOCK)
    assert torch.equal(layer(big.bfloat16()), copy(big.bfloat16()))
    assert not torch.equal(plain(big.bfloat16()), copy(big.bfloat16()))  # int8 activations
    assert torch.equal(layer(small.bfloat16()), plain(small.bfloat16()))
    assert torch.equal(layer(big), plain(big))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantize_at_load_rounds_to_the_nearest_level(kind):
    torch.manual_seed(2)
    w = torch.randn(33, 4 * BLOCK)
    w[3, :BLOCK] = 0.5  # a constant block: zero range, must not divide by zero
    q = quantize(w, kind)
    assert isinstance(q, QuantizedTensor) and q.shape == (33, 4 * BLOCK)
    step = q.scales.repeat_interleave(BLOCK, dim=1)
    err = (q.dequantize() - w).abs()
    assert torch.all(err <= step / 2 + 1e-6)
    assert torch.allclose(q.dequantize()[3, :BLOCK], torch.full((BLOCK,), 0.5))
    assert q.nbytes < w.numel() * w.element_size() * (0.3 if kind == "int8" else 0.2)


@needs_kernels
def test_avx2_path_is_forced_by_environment(monkeypatch):
    monkeypatch.setenv("TOKENYARD_QUANT_ISA", "avx2")
    assert quant_isa() == QUANT_ISAS["avx2"]
    monkeypatch.setenv("TOKENYARD_QUANT_ISA", "avx512_vnni")
    assert quant_isa() == KERNELS.best_isa()
    monkeypatch.setenv("TOKENYARD_QUANT_ISA", "sse")
    with pytest.raises(ValueError):
        quant_isa()


def test_fp16_scales_are_kept_where_exact():
    """GGUF's fp16 scales stay fp16 (fewer bytes a decode step streams) where every one is an exact
    fp16; Q4_K's products of two scales are not, and stay fp32; fusing both kinds gives fp32 scales
    and the same weights; the kernels' dense copy reads fp16 scales as the reference does."""
    q40 = from_gguf(random_gguf("Q4_0", 6, 256), "Q4_0", 6, 256)
    q4k = from_gguf(random_gguf("Q4_K", 6, 256), "Q4_K", 6, 256)
    q80 = from_gguf(random_gguf("Q8_0", 6, 256), "Q8_0", 6, 256)
    assert q40.scales.dtype == q40.mins.dtype == q80.scales.dtype == torch.float16
    assert q4k.scales.dtype == q4k.mins.dtype == torch.float32
    assert quantize(torch.randn(4, 64), "int4").scales.dtype == torch.float32
    fused = QuantizedTensor.cat([q40, q4k])
    assert fused.scales.dtype == fused.mins.dtype == torch.float32
    assert torch.equal(fused.dequantize(), torch.cat([q40.dequantize(), q4k.dequantize()]))
    if KERNELS is not None:
        for weight in (q40, q80):
            dense = QuantizedLinear(weight).dense(torch.float32)
            torch.testing.assert_close(dense, weight.dequantize(), rtol=1e-6, atol=1e-6)
