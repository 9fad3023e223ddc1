"""Llama: token embedding, RMSNorm, RoPE (with Llama 3 scaling), GQA attention, SwiGLU, LM head.

The forward pass takes one flattened batch of tokens from many sequences; attention reads and
writes the paged KV pool through the attention backend. On CPU the element-wise parts (residual
add + RMSNorm, rotary, SiLU * up) run as single compiled calls (`ops`, engine/csrc/layer_ops.cpp);
the PyTorch expressions here are the same arithmetic, for CUDA and machines without a compiler.
"""

import math
from types import ModuleType

import torch
from torch import nn
from torch.nn import functional as F

from tokenyard.engine.attention import AttentionMetadata
from tokenyard.engine.config import ModelConfig
from tokenyard.engine.kv_cache import LayerKV
from tokenyard.engine.lora import LoraStep
from tokenyard.engine.quant import QuantizedTensor
from tokenyard.engine.quantized_linear import QuantizedEmbedding, QuantizedLinear, kernel_layout

# a loaded weight: float, or block-quantized (engine/quant.py)
Weight = torch.Tensor | QuantizedTensor


def _unfilled_linear(fan_in: int, fan_out: int) -> nn.Linear:
    """A bias-free layer whose weight `LlamaModel.load` fills or replaces, left uninitialised:
    the random init of weights about to be overwritten was ~1 s of an engine's start (with the
    embedding's). Built on the meta device and given an empty weight: torch's skip_init would
    move it with to_empty, and a meta Embedding imports torch._dynamo, each slower still."""
    layer = nn.Linear(fan_in, fan_out, bias=False, device="meta")
    layer.weight = nn.Parameter(torch.empty(fan_out, fan_in))
    return layer


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, ops: ModuleType | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ops is not None:
            return self.ops.rms_norm(x, None, self.weight, self.eps)[0]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The norm of x + residual, and that sum (the residual stream from here on)."""
        if self.ops is not None:
            return self.ops.rms_norm(x, residual, self.weight, self.eps)
        total = x + residual
        return self.forward(total), total


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    scaling = config.rope_scaling
    if not scaling:
        return inv_freq
    # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    """cos/sin tables for every position (HF's rotate-half convention); a step looks its tokens'
    rows up once and every layer applies them."""

    def __init__(self, config: ModelConfig, max_len: int):
        super().__init__()
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float), rope_inv_freq(config))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and sin rows of the step's tokens, [T, 1, D] each."""
        return (
            self.cos[positions].unsqueeze(1).to(dtype),
            self.sin[positions].unsqueeze(1).to(dtype),
        )


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, lora: LoraStep, index: int, ops: ModuleType | None):
        super().__init__()
        self.ops = ops
        self.lora, self.index = lora, index  # the step's adapters, and which layer this is
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        # one fused projection: one matmul instead of three
        self.qkv_proj = _unfilled_linear(config.hidden_size, q_size + 2 * kv_size)
        self.o_proj = _unfilled_linear(q_size, config.hidden_size)

    def forward(self, x, rope, kv_cache, backend, meta) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        if self.lora.groups:
            self.lora.apply(self.index, "qkv", x, qkv)
        q, k, v = qkv.split(self.sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.ops is not None:
            self.ops.rotary_(q, k, *rope)  # in place, in the projection's output
        else:
            q, k = apply_rotary(q, k, *rope)
        out = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta)
        out = out.reshape(-1, self.num_heads * self.head_dim)
        if self.lora.groups:
            return self.lora.apply(self.index, "o", out, self.o_proj(out))
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, lora: LoraStep, index: int, ops: ModuleType | None):
        super().__init__()
        self.ops = ops
        self.lora, self.index = lora, index
        self.intermediate = config.intermediate_size
        self.gate_up_proj = _unfilled_linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = _unfilled_linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.lora.groups:
            self.lora.apply(self.index, "gate_up", x, gate_up)
        if self.ops is not None:
            h = self.ops.silu_mul(gate_up)
        else:
            gate, up = gate_up.split(self.intermediate, dim=-1)
            h = F.silu(gate) * up
        if self.lora.groups:
            return self.lora.apply(self.index, "down", h, self.down_proj(h))
        return self.down_proj(h)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, lora: LoraStep, index: int, ops: ModuleType | None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = Attention(config, lora, index, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = MLP(config, lora, index, ops)

    def forward(self, x, residual, rope, kv_cache, backend, meta) -> tuple[torch.Tensor, ...]:
        """x: the previous layer's output, not yet added to the residual stream (None in the
        first layer, whose input is the stream itself); returns this layer's output and the
        stream, so that each addition is fused into the norm after it."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn(h, rope, kv_cache, backend, meta)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, max_len: int, ops: ModuleType | None = None):
        """ops: the compiled element-wise ops (engine/cpu_kernels.py), for a model run on CPU."""
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(  # left uninitialised too: `load` fills it
            config.vocab_size,
            config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size),
        )
        self.lora = LoraStep(ops)  # the LoRA adapters of the step being run (engine/lora.py)
        self.layers = nn.ModuleList(
            DecoderLayer(config, self.lora, i, ops) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.rotary = Rotary(config, max_len)
        self.lm_head = _unfilled_linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[LayerKV],  # per layer: K and V pools (engine/kv_cache.py)
        backend,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # a quantized embedding gives float32 rows: the step runs in the norms' dtype
        x = self.embed_tokens(input_ids).to(self.norm.weight.dtype)
        rope = self.rotary(positions, x.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, kv_cache, backend, meta)
        return self.norm.add_forward(x, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load(self, weights: dict[str, Weight]) -> None:
        """HF-named tensors → this module (Q/K/V and gate/up fused). Quantized weights replace
        their layers with quantized ones; everything else is loaded as float."""
        state: dict[str, Weight] = {}
        for i in range(self.config.num_layers):
            p = f"model.layers.{i}."
            attn, mlp = p + "self_attn.", p + "mlp."
            state[f"layers.{i}.self_attn.qkv_proj.weight"] = _fuse(
                [weights[attn + f"{n}_proj.weight"] for n in "qkv"]
            )
            state[f"layers.{i}.self_attn.o_proj.weight"] = weights[attn + "o_proj.weight"]
            state[f"layers.{i}.mlp.gate_up_proj.weight"] = _fuse(
                [weights[mlp + "gate_proj.weight"], weights[mlp + "up_proj.weight"]]
            )
            state[f"layers.{i}.mlp.down_proj.weight"] = weights[mlp + "down_proj.weight"]
            for norm in ("input_layernorm", "post_attention_layernorm"):
                state[f"layers.{i}.{norm}.weight"] = weights[f"{p}{norm}.weight"]
        state["embed_tokens.weight"] = weights["model.embed_tokens.weight"]
        state["norm.weight"] = weights["model.norm.weight"]
        head = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        state["lm_head.weight"] = weights[head]
        laid_out: dict[int, QuantizedTensor] = {}  # a tied embedding and head share one copy
        for name, weight in list(state.items()):
            if isinstance(weight, QuantizedTensor):
                if id(weight) not in laid_out:
                    laid_out[id(weight)] = kernel_layout(weight)
                weight = laid_out[id(weight)]
                path, _, _ = name.rpartition(".")
                parent, _, attr = path.rpartition(".")
                layer = QuantizedEmbedding if attr == "embed_tokens" else QuantizedLinear
                setattr(self.get_submodule(parent), attr, layer(weight))
                del state[name]
        self.load_state_dict(state, strict=True)


def _fuse(parts: list[Weight]) -> Weight:
    """One matrix for projections that read the same input: quantized when they all share a
    layout, else float (a checkpoint that mixes formats across them)."""
    if all(isinstance(p, QuantizedTensor) for p in parts) and all(
        p.same_layout(parts[0]) for p in parts
    ):
        return QuantizedTensor.cat(parts)
    return torch.cat([p.dequantize() if isinstance(p, QuantizedTensor) else p for p in parts])
