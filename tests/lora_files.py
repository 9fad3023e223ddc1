"""LoRA adapter directories as PEFT writes them, with random matrices, for the engine's tests."""

import json
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from tokenyard.engine.lora import projection_sizes

# the packaged model's shapes (SmolLM2-135M), for tests that start the engine in another process
SMOLLM2 = SimpleNamespace(
    hidden_size=576, intermediate_size=1536, num_heads=9, num_kv_heads=3, head_dim=64, num_layers=30
)

PROJECTIONS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def lora_tensors(config, rank: int, targets, seed: int) -> dict[str, torch.Tensor]:
    """Random LoRA matrices named as PEFT saves them, large enough to change the output."""
    gen = torch.Generator().manual_seed(seed)
    shapes = projection_sizes(config)
    tensors = {}
    for layer in range(config.num_layers):
        for proj in targets:
            fan_in, fan_out = shapes[proj]
            prefix = f"base_model.model.model.layers.{layer}.{PROJECTIONS[proj]}.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            )
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 0.02
    return tensors


def write_adapter(path, tensors, rank: int, alpha: float, targets, **settings) -> str:
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(targets),
        "bias": "none",
        **settings,
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "adapter_model.safetensors"))
    return str(path)
