"""Weights from a Hugging Face directory (sharded safetensors), and Llama 3 rope scaling."""

from dataclasses import replace

import pytest
import torch

from tokenyard.engine.config import EngineConfig, ModelConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.model import rope_inv_freq
from tokenyard.engine.sequence import GenerationRequest

from .conftest import greedy, run_to_completion


@pytest.fixture(scope="module")
def hf_dir(reference, gguf_path, tmp_path_factory):
    """The GGUF as transformers loads it, saved as config.json + several safetensors shards."""
    import json
    import os

    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("smollm2-hf")
    # save_pretrained refuses GGUF-loaded models: write what it would (config + shards) directly
    config = reference.config.to_dict()
    config.pop("quantization_config", None)
    (path / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in reference.state_dict().items() if k != "lm_head.weight"}
    names = sorted(state)
    for i, shard in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        save_file({k: state[k] for k in shard}, path / f"model-0000{i + 1}-of-00002.safetensors")
    tokenizer = AutoTokenizer.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
    )
    tokenizer.save_pretrained(path)
    return path


def test_hf_directory_loads_and_generates_like_the_gguf(hf_dir, engine_factory):
    assert len(list(hf_dir.glob("*.safetensors"))) > 1, "meant to exercise sharded checkpoints"
    from_gguf = engine_factory(num_blocks=2048)
    from_hf = LLMEngine(EngineConfig(model=str(hf_dir), device="cpu", num_blocks=256))
    assert from_hf.model_config.num_kv_heads == from_gguf.model_config.num_kv_heads == 3
    assert from_hf.model_config.tie_word_embeddings
    messages = [{"role": "user", "content": "Name a famous painter."}]
    ids = from_hf.tokenizer.apply_chat_template(messages)
    assert ids == from_gguf.tokenizer.apply_chat_template(messages)
    outs = [
        run_to_completion(e, [GenerationRequest("hf", ids, greedy(12, min_tokens=12))])["hf"]
        for e in (from_gguf, from_hf)
    ]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]


LLAMA3_8B = ModelConfig(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
    num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
    max_position_embeddings=131072, tie_word_embeddings=False,
    rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)  # fmt: skip


def test_llama3_rope_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(
        hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072,
        rope_scaling={**LLAMA3_8B.rope_scaling, "rope_theta": 500000.0},
    )  # fmt: skip
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    ours = rope_inv_freq(LLAMA3_8B)
    torch.testing.assert_close(ours, expected)
    unscaled = rope_inv_freq(replace(LLAMA3_8B, rope_scaling=None))
    assert not torch.allclose(ours, unscaled)  # the scaling changed the low frequencies


def test_the_gguf_parses_into_what_gguf_reads(gguf_path):
    """The engine's reader (plain views of the mapping, for speed) gives gguf's own reader's
    metadata and tensors, byte for byte."""
    import numpy as np
    from gguf import GGUFReader

    from tokenyard.engine.loader import _gguf_file

    ours, meta = _gguf_file(gguf_path)
    theirs = GGUFReader(gguf_path)
    assert type(ours.data) is np.ndarray and isinstance(theirs.data, np.memmap)
    assert meta == {
        k: f.contents() for k, f in theirs.fields.items() if "tokenizer.ggml.tokens" not in k
    }
    assert ours.fields["tokenizer.ggml.tokens"].contents() == (
        theirs.fields["tokenizer.ggml.tokens"].contents()
    )
    assert len(ours.tensors) == len(theirs.tensors) > 0
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, list(a.shape)) == (b.name, b.tensor_type, list(b.shape))
        assert np.array_equal(a.data, b.data)
