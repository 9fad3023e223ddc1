"""Shared engine fixtures: the SmolLM2 GGUF, the engine, and transformers as the reference."""

import functools
import gc
import os
from unittest import mock

import pytest
import torch

from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.loader import resolve_model_path
from tokenyard.engine.packed_linear import packable
from tokenyard.engine.sequence import GenerationRequest, SamplingParams

from .prompts import SYSTEM, chat_prompts

MAX_NEW = 24  # tokens each comparison prompt is continued by


@pytest.fixture(scope="session")
def gguf_path() -> str:
    return resolve_model_path("smollm2")


@pytest.fixture(scope="session")
def reference(gguf_path):
    """transformers' own GGUF loading: the engine is tested against it."""
    import gguf
    from transformers import AutoModelForCausalLM

    # transformers parses the file twice (config, then weights: 8 s each) and asks gguf for the
    # same tensor-name table once per module (397 builds: 13 s); both are read, never changed,
    # and depend on their arguments alone, so one of each serves the load (34 -> ~12 s on a
    # 2-core AVX2 EPYC) and the model is the same
    with (
        mock.patch.object(gguf, "GGUFReader", functools.cache(gguf.GGUFReader)),
        mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)),
    ):
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
        )
    return model.eval()


_ENGINES: dict[tuple, LLMEngine] = {}  # the most recently used last
# engines kept at once: each holds its weights and a KV pool (1 GiB unless the test sizes it), so
# keeping every configuration the suite builds reached ~16 GB; tests of one configuration run
# together (one file), so the few latest cover nearly every reuse
# bf16 matmuls of the whole model run on oneDNN where the CPU has AVX-512 (BW/VL/DQ) or
# AVX-NE-CONVERT; on an AVX2-only CPU PyTorch falls back to scalar code that takes minutes a pass
# (the engine runs fp32 there by default), so those tests wait for a CPU that has them
needs_bf16_matmuls = pytest.mark.skipif(
    not packable(torch.bfloat16),
    reason="no oneDNN bf16 matmuls on this CPU (AVX2 only): the engine runs fp32 here",
)
KEEP_ENGINES = 3


@pytest.fixture(scope="session")
def engine_factory():
    """Loading takes seconds, so engines are built once per configuration and shared."""

    def make(**overrides) -> LLMEngine:
        # fp32 and the GGUF dequantized unless asked: the reference runs fp32, and its tokens are
        # compared one for one (quantized weights are tested against it in test_quant_*.py)
        overrides = {"dtype": "float32", "quantization": "none", **overrides}
        key = tuple(sorted(overrides.items()))
        engine = _ENGINES.pop(key, None)
        if engine is None:
            while len(_ENGINES) >= KEEP_ENGINES:
                _ENGINES.pop(next(iter(_ENGINES)))
            gc.collect()  # the dropped engine's tensors go before the new one's are allocated
            engine = LLMEngine(EngineConfig(device="cpu", **overrides))
        _ENGINES[key] = engine
        assert not engine.has_work()
        return engine

    return make


@pytest.fixture(scope="session")
def prompt_ids(engine_factory) -> list[list[int]]:
    """The 26 chat prompts the engine is compared on, from under 64 tokens to over 400; the last
    four share a system prompt, so a mixed batch hits the prefix cache."""
    tokenizer = engine_factory(num_blocks=2048).tokenizer
    ids = [tokenizer.apply_chat_template(m) for m in chat_prompts()]
    ids += [
        tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, *m])
        for m in chat_prompts()[:4]
    ]
    return ids


@pytest.fixture(scope="session")
def batched_greedy(engine_factory, prompt_ids) -> list[list[int]]:
    """The engine's greedy continuations of prompt_ids, MAX_NEW tokens each (EOS held back), all
    in one batch on a pool that holds them at once: what test_correctness checks against
    transformers and test_speculative against speculation (one run for both, ~20 s on a 2-core
    AVX2 machine)."""
    engine = engine_factory(num_blocks=2048)
    requests = [
        GenerationRequest(f"batched-{i}", ids, greedy(MAX_NEW, min_tokens=MAX_NEW))
        for i, ids in enumerate(prompt_ids)
    ]
    out = run_to_completion(engine, requests)
    assert_all_blocks_free(engine)
    return [[t for o in out[r.request_id] for t in o.token_ids] for r in requests]


@pytest.fixture(autouse=True)
def block_accounting_holds():
    """After every test, every engine's block accounting is consistent."""
    yield
    for engine in _ENGINES.values():
        assert_block_invariants(engine)


def run_to_completion(engine: LLMEngine, requests: list[GenerationRequest]) -> dict[str, list]:
    """Drive the synchronous engine; outputs per request id, and check blocks after each step."""
    for request in requests:
        engine.add_request(request)
    outputs: dict[str, list] = {r.request_id: [] for r in requests}
    while engine.has_work():
        for out in engine.step():
            outputs[out.request_id].append(out)
        assert_block_invariants(engine)
    return outputs


def assert_block_invariants(engine: LLMEngine) -> None:
    tables = [s.table for s in engine.scheduler.running]
    engine.blocks.check_invariants(tables)
    waiting_tables = [
        s.table for t in engine.scheduler.waiting.values() for q in t.values() for s in q
    ]
    assert all(not t.blocks for t in waiting_tables), "a waiting sequence holds blocks"


def assert_all_blocks_free(engine: LLMEngine) -> None:
    assert not engine.has_work()
    assert engine.blocks.num_free == engine.blocks.num_blocks
    engine.blocks.check_invariants([])


def reference_greedy(
    model, ids: list[int], max_new: int, candidate: list[int] | None = None
) -> list[int]:
    """transformers' greedy continuation of ids, exactly max_new tokens (EOS held back, as
    min_new_tokens does).

    With a candidate (the engine's own output), one forward pass over ids + candidate checks it
    instead of generating: where transformers' argmax after every prefix is the candidate's next
    token, the candidate is transformers' greedy continuation, token for token (by induction over
    the positions). That is the same check as generating and comparing, for one pass instead of
    max_new (minutes a session on a 2-core AVX2 machine); generation runs only for a candidate
    that fails it, to name the tokens it should have been."""
    if candidate is not None and len(candidate) == max_new:
        eos = model.generation_config.eos_token_id
        with torch.inference_mode():
            logits = model(torch.tensor([ids + candidate[:-1]])).logits[0, len(ids) - 1 :]
            logits[:, eos if isinstance(eos, list) else [eos]] = float("-inf")
            if logits.argmax(-1).tolist() == candidate:
                return candidate
    with torch.inference_mode():
        x = torch.tensor([ids])
        y = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=False,
            pad_token_id=2,
        )
    return y[0, len(ids) :].tolist()


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)
