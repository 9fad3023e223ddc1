"""The flash-attn backend against the PyTorch reference, on CUDA."""

import importlib.util

import pytest
import torch

from tokenyard.engine.attention import FlashAttention, SeqSlice, TorchAttention

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        importlib.util.find_spec("flash_attn") is None,
        reason="needs flash-attn (the optional extra `cuda`)",
    ),
]

BS, HQ, HKV, D = 256, 8, 2, 64


def test_flash_attention_matches_torch_reference_on_paged_mixed_batch():
    device = torch.device("cuda")
    torch.manual_seed(0)
    num_blocks = 16
    # decodes (one token after a context) and prefill chunks (first and later), out-of-order blocks
    slices = [
        SeqSlice([3, 7], 300, 1),
        SeqSlice([1], 40, 1),
        SeqSlice([5, 2], 0, 400),
        SeqSlice([9, 0, 11], 512, 100),
    ]
    total = sum(s.num_new for s in slices)
    q = torch.randn(total, HQ, D, device=device, dtype=torch.bfloat16)
    k = torch.randn(total, HKV, D, device=device, dtype=torch.bfloat16)
    v = torch.randn(total, HKV, D, device=device, dtype=torch.bfloat16)
    cache = torch.randn(2, num_blocks, BS, HKV, D, device=device, dtype=torch.bfloat16)
    flash, ref = FlashAttention(BS, device), TorchAttention(BS, device)
    num_decodes = 2
    cache_ref = cache.clone()
    out = flash.forward(q, k, v, cache[0], cache[1], flash.build_metadata(slices, num_decodes))
    expected = ref.forward(
        q.float(),
        k.float(),
        v.float(),
        cache_ref[0].float(),
        cache_ref[1].float(),
        ref.build_metadata(slices, num_decodes),
    )
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_engine_generates_on_cuda_and_matches_cpu_greedy():
    from tokenyard.engine.config import EngineConfig
    from tokenyard.engine.engine import LLMEngine
    from tokenyard.engine.sequence import GenerationRequest, SamplingParams

    def run(device: str, dtype: str) -> list[int]:
        blocks = 64 if device == "cuda" else 1024  # same capacity in 256- and 16-token blocks
        engine = LLMEngine(EngineConfig(device=device, dtype=dtype, num_blocks=blocks))
        ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
        engine.add_request(GenerationRequest("r", ids, SamplingParams(max_tokens=8, temperature=0)))
        tokens = []
        while engine.has_work():
            tokens += [t for o in engine.step() for t in o.token_ids]
        return tokens

    # flash-attn computes in bf16, so only the first greedy tokens are expected to agree
    cuda_tokens, cpu_tokens = run("cuda", "bfloat16"), run("cpu", "float32")
    assert cuda_tokens[:3] == cpu_tokens[:3]
