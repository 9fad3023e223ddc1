"""Linear weights packed for oneDNN: the same products as F.linear, every projection of the model
swapped (the tied LM head too, the embedding kept), and the engine's logits unchanged."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tokenyard.engine.packed_linear import PackedLinear, pack_linears
from tokenyard.engine.sequence import GenerationRequest

from .conftest import greedy, needs_bf16_matmuls, run_to_completion
from .prompts import chat_prompts


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [(torch.float32, 1e-4), pytest.param(torch.bfloat16, 0.0, marks=needs_bf16_matmuls)],
    ids=["fp32", "bf16"],
)
@pytest.mark.parametrize("rows", [1, 5, 64, 300])
def test_packed_matches_f_linear(dtype: torch.dtype, tol: float, rows: int) -> None:
    torch.manual_seed(rows)
    weight = torch.randn(1536, 576, dtype=dtype)
    x = torch.randn(rows, 576, dtype=dtype)
    got = PackedLinear(weight)(x)
    assert got.shape == (rows, 1536) and got.dtype == dtype
    torch.testing.assert_close(got.float(), F.linear(x, weight).float(), rtol=tol, atol=tol)


def test_pack_linears_swaps_bias_free_layers_only() -> None:
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 4, bias=True))
    x = torch.randn(3, 8)
    before = model(x)
    assert pack_linears(model) == 1
    assert isinstance(model[0], PackedLinear) and isinstance(model[2], nn.Linear)
    torch.testing.assert_close(model(x), before)


def test_the_engine_packs_every_projection_and_its_tied_head(engine_factory) -> None:
    packed, plain = engine_factory(), engine_factory(packed_weights=False)
    config = packed.model_config
    assert config.tie_word_embeddings  # SmolLM2 ties its head to the embedding
    swapped = [m for m in packed.runner.model.modules() if isinstance(m, PackedLinear)]
    assert len(swapped) == 2 * 2 * config.num_layers + 1  # qkv, o, gate_up, down; the head
    assert not any(isinstance(m, PackedLinear) for m in plain.runner.model.modules())
    assert isinstance(packed.runner.model.embed_tokens, nn.Embedding)  # lookups still read the rows
    hidden = torch.randn(3, config.hidden_size)
    head = packed.runner.model.logits(hidden)
    assert head.shape == (3, config.vocab_size)
    torch.testing.assert_close(
        head, hidden @ plain.runner.model.embed_tokens.weight.T, rtol=0, atol=1e-4
    )


def test_packed_and_plain_engines_generate_the_same(engine_factory) -> None:
    tokens = []
    for packed in (True, False):
        engine = engine_factory(packed_weights=packed)
        requests = [
            GenerationRequest(
                f"p{i}", engine.tokenizer.apply_chat_template(m), greedy(12, min_tokens=12)
            )
            for i, m in enumerate(chat_prompts()[:6])
        ]
        out = run_to_completion(engine, requests)
        tokens.append([[t for o in out[r.request_id] for t in o.token_ids] for r in requests])
    assert tokens[0] == tokens[1]
    assert all(len(t) == 12 for t in tokens[0])
