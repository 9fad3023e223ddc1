"""Small decode steps on CPU as direct calls of the compiled kernels.

A step of a few decodes on a quantized model reads every weight once (about 9 ms here) and, through
the modules, spends 4-5 ms more in Python: per layer nine module calls, the linear layers'
dispatch, views and splits. One stream waits for every step, so this path runs the same kernels
in the same order with nothing between them: the layer loop of engine/model.py written out once
for this case (a batch-1 step 14.9 → 13.3 ms in-process, bench/RESULTS.md, issue 17). The modules
stay the reference: tests compare the two paths bit for bit.

It serves the steps the modules would run on the kernels alone, on a model whose projections are
all quantized with the kernels built, attended by KernelAttention: where the layers keep bf16
copies (AMX CPUs), steps of fewer than COPY_ROWS tokens (decodes, speculation's short chunks, short
prompts and the tails of prompts whose start is cached); elsewhere, of fewer than DENSE_ROWS
(prefill chunks too). Anything else goes through the modules.
"""

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from tokenyard.engine.attention import AttentionMetadata, KernelAttention, Pool
from tokenyard.engine.kv_cache import Int8Pool, LayerKV
from tokenyard.engine.model import LlamaModel
from tokenyard.engine.quantized_linear import COPY_ROWS, DENSE_ROWS, QuantizedLinear


@dataclass
class _Layer:
    """One decoder layer as this path calls it: norm weights, the projections' kernel calls, and
    the layer's K and V pools, whole and as [slots, kv heads, head dim] views for the writes (an
    int8 pool's scales as [slots, kv heads])."""

    input_norm: torch.Tensor
    qkv: Callable[[torch.Tensor], torch.Tensor]
    k_cache: Pool
    v_cache: Pool
    k_slots: torch.Tensor
    v_slots: torch.Tensor
    k_scales: torch.Tensor | None
    v_scales: torch.Tensor | None
    o: Callable[[torch.Tensor], torch.Tensor]
    post_norm: torch.Tensor
    gate_up: Callable[[torch.Tensor], torch.Tensor]
    down: Callable[[torch.Tensor], torch.Tensor]


def _slots(pool: Pool, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A pool's rows as [slots, kv heads, head dim], and an int8 pool's scales [slots, kv heads]."""
    if isinstance(pool, Int8Pool):
        return pool.values.view(-1, kv_heads, head_dim), pool.scales.view(-1, kv_heads)
    return pool.view(-1, kv_heads, head_dim), None


class CpuDecoder:
    def __init__(self, model: LlamaModel, attention: KernelAttention, kv_caches: list[LayerKV]):
        config = model.config
        self.model = model
        self.ops: ModuleType = model.norm.ops
        self.attend = attention.attend
        self.eps = config.rms_norm_eps
        self.heads, self.kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.sizes = model.layers[0].self_attn.sizes
        # larger steps go through the modules, which multiply the layers' bf16 copies there (or
        # dequantize the weights)
        copies = model.layers[0].self_attn.qkv_proj.copy is not None
        self.max_tokens = COPY_ROWS if copies else DENSE_ROWS
        self.layers = []  # looked up once here rather than at every step
        for layer, cache in zip(model.layers, kv_caches, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            k_cache, v_cache = cache[0], cache[1]
            k_slots, k_scales = _slots(k_cache, self.kv_heads, self.head_dim)
            v_slots, v_scales = _slots(v_cache, self.kv_heads, self.head_dim)
            self.layers.append(
                _Layer(
                    layer.input_layernorm.weight,
                    attn.qkv_proj.multiply,
                    k_cache,
                    v_cache,
                    k_slots,
                    v_slots,
                    k_scales,
                    v_scales,
                    attn.o_proj.multiply,
                    layer.post_attention_layernorm.weight,
                    mlp.gate_up_proj.multiply,
                    mlp.down_proj.multiply,
                )
            )

    @staticmethod
    def fits(model: LlamaModel, attention) -> bool:
        """Whether the model and attention backend are what this path runs."""
        linears = [
            p
            for layer in model.layers
            for p in (
                layer.self_attn.qkv_proj,
                layer.self_attn.o_proj,
                layer.mlp.gate_up_proj,
                layer.mlp.down_proj,
            )
        ]
        return (
            model.norm.ops is not None
            and isinstance(attention, KernelAttention)
            and all(isinstance(p, QuantizedLinear) and p.kernels is not None for p in linears)
        )

    def serves(self, tokens: int) -> bool:
        return tokens < self.max_tokens

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The final hidden states [T, hidden], as LlamaModel.forward gives them."""
        model, ops, n, eps = self.model, self.ops, input_ids.shape[0], self.eps
        x = model.embed_tokens(input_ids).to(model.norm.weight.dtype)
        cos, sin = model.rotary(positions, x.dtype)
        residual = None
        slots = meta.slot_mapping
        lora = model.lora if model.lora.groups else None  # LoRA adapters in this step
        for i, layer in enumerate(self.layers):
            if residual is None:
                residual, h = x, ops.rms_norm(x, None, layer.input_norm, eps)[0]
            else:
                h, residual = ops.rms_norm(x, residual, layer.input_norm, eps)
            qkv = layer.qkv(h)
            if lora:
                lora.apply(i, "qkv", h, qkv)
            q = ops.rotary_to_cache_(
                qkv,
                self.heads,
                self.kv_heads,
                cos,
                sin,
                layer.k_slots,
                layer.v_slots,
                slots,
                layer.k_scales,
                layer.v_scales,
            )
            out = self.attend(q, layer.k_cache, layer.v_cache, meta).view(n, -1)
            o = layer.o(out)
            if lora:
                lora.apply(i, "o", out, o)
            h, residual = ops.rms_norm(o, residual, layer.post_norm, eps)
            gate_up = layer.gate_up(h)
            if lora:
                lora.apply(i, "gate_up", h, gate_up)
            h = ops.silu_mul(gate_up)
            x = layer.down(h)
            if lora:
                lora.apply(i, "down", h, x)
        return ops.rms_norm(x, residual, model.norm.weight, eps)[0]
