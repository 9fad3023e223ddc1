"""The CPU decode path (engine/cpu_decode.py) gives the modules' results bit for bit: the final
hidden states and the K/V it writes into the pool, for decodes at different lengths and for short
chunks beside them, and for whole prefill chunks where the layers keep no bf16 copies; it takes
only the steps it was made for."""

import pytest
import torch

from tests.lora_files import PROJECTIONS, lora_tensors, write_adapter
from tokenyard.engine.attention import SHORT_CHUNK, SeqSlice
from tokenyard.engine.config import EngineConfig
from tokenyard.engine.cpu_kernels import layer_ops, quant_matmul
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.lora import load_adapter
from tokenyard.engine.packed_linear import packable
from tokenyard.engine.quantized_linear import COPY_ROWS, DENSE_ROWS

pytestmark = pytest.mark.skipif(
    layer_ops() is None or quant_matmul() is None, reason="CPU kernels not built here"
)


def make_engine(dtype: str, dense_copy: bool | None = None, kv: str = "auto") -> LLMEngine:
    config = EngineConfig(
        device="cpu",
        dtype=dtype,
        quantization="auto",
        num_blocks=64,
        dense_copy=dense_copy,
        kv_cache_dtype=kv,
    )
    return LLMEngine(config)


# bf16 with the copies that AMX CPUs keep, whatever this CPU is (where oneDNN has bf16)
@pytest.fixture(scope="module", params=[("float32", None), ("bfloat16", True)])
def engine(request) -> LLMEngine:
    return make_engine(*request.param)


@pytest.fixture(scope="module")
def int8_pool() -> LLMEngine:
    """bf16 over an int8 KV pool, its rows quantized by the compiled writer and by
    kv_cache.quantize_rows alike; without bf16 copies, which AMX CPUs would keep by default, so
    that the decode path takes the whole prefill chunk too on every CPU."""
    return make_engine("bfloat16", dense_copy=False, kv="int8")


def pool_tensors(engine: LLMEngine) -> list[torch.Tensor]:
    """Every tensor of the KV pool: each layer's [2, ...] tensor, or its int8 pools' parts."""
    tensors = []
    for cache in engine.runner.kv_caches:
        if isinstance(cache, torch.Tensor):
            tensors.append(cache)
        else:
            tensors += [t for pool in cache for t in (pool.values, pool.scales)]
    return tensors


@pytest.fixture(scope="module")
def uncopied() -> LLMEngine:
    """bf16 without the copies, as on CPUs without AMX."""
    return make_engine("bfloat16", dense_copy=False)


def step(engine: LLMEngine, lengths: list[int], chunks: list[tuple[int, int]] = ()):
    """A step of len(lengths) decodes with that many tokens cached, then chunks of (new tokens,
    cached before them): random K/V in the pool, each sequence its own blocks. Its inputs and
    attention metadata."""
    torch.manual_seed(len(lengths) + len(chunks))
    for tensor in pool_tensors(engine):
        if tensor.dtype == torch.int8:
            tensor.copy_(torch.randint_like(tensor, -127, 128))
        else:
            tensor.normal_().abs_()  # scales are positive (K/V of a float pool any sign is fine)
    bs, slices, positions, first = engine.block_size, [], [], 0
    for new, cached in [(1, n) for n in lengths] + list(chunks):
        width = (cached + new) // bs + 1
        slices.append(SeqSlice(list(range(first, first + width)), cached, new))
        positions += range(cached, cached + new)
        first += width
    meta = engine.runner.attention.build_metadata(slices, len(lengths))
    ids = torch.randint(0, engine.model_config.vocab_size, (len(positions),))
    return ids, torch.tensor(positions), meta


@pytest.mark.parametrize(
    "lengths, chunks",
    [
        ([0], []),
        ([37], []),
        ([5, 300, 16, 129], []),
        # speculation's chunks (1 + a draft: decode rows) after their context, and prefills: a
        # prompt's tail after its cached start, whole prompts
        ([20], [(2, 45), (9, 130)]),
        ([], [(9, 300), (17, 4), (20, 0)]),
    ],
)
def test_same_bits_as_the_modules(engine, lengths, chunks):
    assert_same_bits(engine, lengths, chunks)


@pytest.mark.parametrize(
    "lengths, chunks", [([5, 300, 16, 129], []), ([20], [(2, 45), (9, 130)]), ([], [(300, 0)])]
)
def test_same_bits_over_an_int8_pool(int8_pool, lengths, chunks):
    assert_same_bits(int8_pool, lengths, chunks)


@pytest.mark.parametrize(
    "lengths, chunks", [([], [(300, 0)]), ([7, 200], [(COPY_ROWS, 90), (100, 0)])]
)
def test_same_bits_on_prefill_chunks_without_copies(uncopied, lengths, chunks):
    assert_same_bits(uncopied, lengths, chunks)


def assert_same_bits(engine: LLMEngine, lengths: list[int], chunks: list[tuple[int, int]]):
    decoder = engine.runner.cpu_decoder
    assert decoder is not None
    ids, positions, meta = step(engine, lengths, chunks)
    assert decoder.serves(len(ids))
    before = [t.clone() for t in pool_tensors(engine)]
    with torch.inference_mode():
        expected = engine.runner.model(
            ids, positions, engine.runner.kv_caches, engine.runner.attention, meta
        )
        written = [t.clone() for t in pool_tensors(engine)]
        for tensor, saved in zip(pool_tensors(engine), before, strict=True):
            tensor.copy_(saved)
        hidden = decoder(ids, positions, meta)
    assert torch.equal(hidden, expected)
    for tensor, reference, saved in zip(pool_tensors(engine), written, before, strict=True):
        assert torch.equal(tensor, reference)
        assert not torch.equal(tensor, saved)  # this layer's K/V was written
    return hidden


@pytest.mark.parametrize("whole_step", [False, True], ids=["some rows", "every row"])
def test_same_bits_with_lora_adapters(engine, tmp_path, whole_step):
    """Adapters on some rows of a step (two adapters and base rows side by side) or on all of
    them: the decode path adds the same terms as the modules, and they change the result."""
    config = engine.model_config
    adapters = [
        load_adapter(
            name,
            write_adapter(
                tmp_path / name, lora_tensors(config, rank, targets, seed), rank, 16, targets
            ),
            config,
        ).to(engine.runner.device, engine.runner.dtype)
        for name, rank, targets, seed in (
            ("every", 8, tuple(PROJECTIONS), 1),
            ("qv", 4, ("q_proj", "v_proj"), 2),
        )
    ]
    lengths, chunks = [5, 300, 16], [(9, 130)]
    rows = len(lengths) + sum(new for new, _ in chunks)
    groups = (
        [(adapters[0], None)]
        if whole_step
        else [(adapters[0], torch.tensor([0, 2])), (adapters[1], torch.arange(3, rows))]
    )
    ids, positions, meta = step(engine, lengths, chunks)
    with torch.inference_mode():
        plain = engine.runner.model(
            ids, positions, engine.runner.kv_caches, engine.runner.attention, meta
        )
    lora = engine.runner.model.lora
    lora.set(groups)
    try:
        hidden = assert_same_bits(engine, lengths, chunks)
    finally:
        lora.set([])
    changed = (hidden != plain).any(dim=-1).tolist()
    assert changed == ([True] * rows if whole_step else [True, False, True] + [True] * (rows - 3))


def test_it_takes_the_steps_the_modules_run_on_the_kernels(engine, uncopied):
    """Where the layers keep bf16 copies, only steps smaller than those the copies serve; without
    copies (fp32, or bf16 without AMX), any step below the one that dequantizes the weights."""
    # the copies are asked for in bf16; oneDNN keeps them where it multiplies bf16 (not AVX2)
    copied = engine.runner.dtype == torch.bfloat16 and packable(torch.bfloat16)
    assert (engine.runner.model.layers[0].mlp.down_proj.copy is not None) == copied
    largest = COPY_ROWS - 1 if copied else DENSE_ROWS - 1
    assert engine.runner.cpu_decoder.serves(largest)
    assert not engine.runner.cpu_decoder.serves(largest + 1)
    assert uncopied.runner.model.layers[0].mlp.down_proj.copy is None
    assert uncopied.runner.cpu_decoder.serves(DENSE_ROWS - 1)
    assert not uncopied.runner.cpu_decoder.serves(DENSE_ROWS)


def test_short_chunks_attend_with_fp32_probabilities(engine):
    """A speculating sequence's 1 + n tokens: with the bf16 prefill kernel, a call of its own in
    the kernel's exact mode; otherwise (fp32, or no prefill kernel), n + 1 decode rows, each over
    the context up to its token. A longer chunk is a prefill either way, through the prefill
    kernel where there is one."""
    attention = engine.runner.attention
    exact_mode = not getattr(attention, "short_rows", True)
    with_kernel = getattr(attention, "prefill", False)
    for new in (2, 9, SHORT_CHUNK, SHORT_CHUNK + 1):
        short = new <= SHORT_CHUNK
        meta = attention.build_metadata([SeqSlice([0, 1, 2], 20, new)], 0)
        if exact_mode:
            assert meta.num_decodes == 0 and meta.num_short == (new if short else 0)
            assert (meta.short_batch is not None) == short
        else:
            assert meta.num_decodes == (new if short else 0)
            if short:
                assert meta.context_lens.tolist() == list(range(21, 21 + new))
        if with_kernel:
            assert (meta.prefill_batch is None) == short


def test_not_built_for_float_weights():
    config = EngineConfig(device="cpu", dtype="float32", quantization="none", num_blocks=8)
    assert LLMEngine(config).runner.cpu_decoder is None
