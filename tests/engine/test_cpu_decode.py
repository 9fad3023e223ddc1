"""The CPU decode path (engine/cpu_decode.py) gives the modules' results bit for bit: the final
hidden states and the K/V it writes into the pool, for a batch of decodes at different lengths;
it takes only the steps it was made for."""

import pytest
import torch

from engine.attention import SHORT_CHUNK, SeqSlice
from engine.config import EngineConfig
from engine.cpu_kernels import layer_ops, quant_matmul
from engine.engine import LLMEngine
from engine.quantized_linear import COPY_ROWS

pytestmark = pytest.mark.skipif(
    layer_ops() is None or quant_matmul() is None, reason="CPU kernels not built here"
)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request) -> LLMEngine:
    return LLMEngine(
        EngineConfig(device="cpu", dtype=request.param, quantization="auto", num_blocks=64)
    )


def decode_step(engine: LLMEngine, lengths: list[int]):
    """A decode step of len(lengths) sequences with that many tokens cached (random K/V in the
    pool; each sequence its own blocks): its inputs and attention metadata."""
    torch.manual_seed(len(lengths))
    for cache in engine.kv_caches:
        cache.normal_()
    bs, slices, first = engine.block_size, [], 0
    for n in lengths:
        width = n // bs + 1
        slices.append(SeqSlice(list(range(first, first + width)), n, 1))
        first += width
    meta = engine.attention.build_metadata(slices, len(slices))
    ids = torch.randint(0, engine.model_config.vocab_size, (len(lengths),))
    return ids, torch.tensor(lengths), meta


@pytest.mark.parametrize("lengths", [[0], [37], [5, 300, 16, 129]])
def test_same_bits_as_the_modules(engine, lengths):
    decoder = engine.cpu_decoder
    assert decoder is not None
    ids, positions, meta = decode_step(engine, lengths)
    assert decoder.serves(meta, len(lengths))
    before = [c.clone() for c in engine.kv_caches]
    with torch.inference_mode():
        expected = engine.model(ids, positions, engine.kv_caches, engine.attention, meta)
        written = [c.clone() for c in engine.kv_caches]
        for cache, saved in zip(engine.kv_caches, before, strict=True):
            cache.copy_(saved)
        hidden = decoder(ids, positions, meta)
    assert torch.equal(hidden, expected)
    for cache, reference, saved in zip(engine.kv_caches, written, before, strict=True):
        assert torch.equal(cache, reference)
        assert not torch.equal(cache, saved)  # this layer's K/V was written


def test_only_small_decode_steps_take_it(engine):
    decoder = engine.cpu_decoder
    _, _, meta = decode_step(engine, [10] * COPY_ROWS)
    assert not decoder.serves(meta, COPY_ROWS)  # a batch the bf16 copies serve
    # a short chunk (a speculating sequence's tokens) attends as decode rows: served; a longer
    # one is a prefill
    short = engine.attention.build_metadata([SeqSlice([0, 1], 3, SHORT_CHUNK)], 0)
    assert short.num_decodes == SHORT_CHUNK and decoder.serves(short, SHORT_CHUNK)
    prefill = engine.attention.build_metadata([SeqSlice([0, 1], 0, SHORT_CHUNK + 1)], 0)
    assert not decoder.serves(prefill, SHORT_CHUNK + 1)


def test_not_built_for_float_weights():
    config = EngineConfig(device="cpu", dtype="float32", quantization="none", num_blocks=8)
    assert LLMEngine(config).cpu_decoder is None
