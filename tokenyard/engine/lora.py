"""LoRA adapters served beside the base model (vLLM's multi-LoRA): one engine, many fine-tunes.

An adapter is a PEFT directory (adapter_config.json and adapter_model.safetensors): for some of a
layer's projections W, two thin matrices A [r, in] and B [out, r] such that the tuned layer is
W + s·B·A (s = alpha / r, or alpha / √r with rsLoRA). The base weights stay as they are (quantized
included) and shared; a request names an adapter, and in every step each projection's output gets
s·(x·Aᵀ)·Bᵀ added for the rows of the requests using it. A batch may mix adapters and the base
model: each adapter in the step costs two thin matmuls per projection over its own rows only.

The engine fuses Q/K/V and gate/up into one projection each (engine/model.py): an adapter of q_proj
is a part of the fused projection's adapter that adds to its first columns, and so on. On CPU each
part is one call of a compiled op (`lora_add_`, engine/csrc/layer_ops.cpp); elsewhere, PyTorch.
"""

import itertools
import json
import math
import os
import re
import threading
from dataclasses import dataclass, field
from types import ModuleType

import torch

from tokenyard.engine.config import ModelConfig

# the engine's fused projections and the HF projections each one holds, in order
FUSED = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
_PARTS = {part for parts in FUSED.values() for part in parts}
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be served with this model: the message says why; `param`: what of
    a load request is at fault (its name, or the adapter at its path)."""

    def __init__(self, message: str, param: str = "lora_path"):
        super().__init__(message)
        self.param = param


_LOADS = itertools.count()  # each load its own prefix-cache root, even under a reused name


@dataclass
class Part:
    """One HF projection's adapter inside a fused projection: a [r, in], s·b [r, out], and where
    its columns start in the fused output."""

    a: torch.Tensor
    b: torch.Tensor
    offset: int

    def __post_init__(self) -> None:
        # what both sizes are multiples of: the compiled op takes whole vectors of both
        self.multiple = math.gcd(self.a.shape[1], self.b.shape[1])


@dataclass(eq=False)  # identity: a step groups its rows by adapter object
class LoraAdapter:
    """One adapter's matrices in the engine's layout: per layer, per fused projection, its parts."""

    name: str
    rank: int
    layers: list[dict[str, list[Part]]]
    # the prefix cache's root for this adapter's sequences: the same tokens give other K/V here
    cache_root: int = field(default_factory=lambda: hash(("lora", next(_LOADS))))

    def to(self, device: torch.device, dtype: torch.dtype) -> "LoraAdapter":
        for projections in self.layers:
            for part in (p for parts in projections.values() for p in parts):
                part.a, part.b = part.a.to(device, dtype), part.b.to(device, dtype)
        return self


def projection_sizes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of each HF projection."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def load_adapter(name: str, path: str, config: ModelConfig) -> LoraAdapter:
    """A PEFT LoRA directory → its matrices in the engine's layout, checked against the model."""
    settings = _adapter_config(path)
    rank, alpha = settings.get("r"), settings.get("lora_alpha")
    if type(rank) is not int or rank <= 0 or type(alpha) not in (int, float):
        raise AdapterError(
            f"adapter {name!r}: r must be a positive integer and lora_alpha a number"
        )
    if settings.get("bias", "none") != "none" or settings.get("modules_to_save"):
        raise AdapterError(
            f"adapter {name!r}: only LoRA matrices are served (bias and modules_to_save are not)"
        )
    if settings.get("use_dora"):
        raise AdapterError(f"adapter {name!r}: DoRA adapters are not served")
    scale = alpha / math.sqrt(rank) if settings.get("use_rslora") else alpha / rank
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in _tensors(path):
        match = _KEY.search(key)
        if match is None or match.group(2) not in _PARTS:
            raise AdapterError(
                f"adapter {name!r}: {key} is not a LoRA matrix of a Llama "
                "projection the engine can serve"
            )
        layer, proj, which = int(match.group(1)), match.group(2), match.group(3)
        found.setdefault((layer, proj), {})[which] = tensor.float()
    if not found:
        raise AdapterError(f"adapter {name!r}: no LoRA matrices in {path}")
    sizes = projection_sizes(config)
    layers = [
        {
            fused: [
                _part(name, layer, proj, found, sizes, rank, scale, offset)
                for proj, offset in zip(parts, _offsets(parts, sizes), strict=True)
                if (layer, proj) in found
            ]
            for fused, parts in FUSED.items()
            if any((layer, p) in found for p in parts)
        }
        for layer in range(config.num_layers)
    ]
    extra = {layer for layer, _ in found} - set(range(config.num_layers))
    if extra:
        raise AdapterError(
            f"adapter {name!r}: layer {min(extra)} is beyond the model's {config.num_layers}"
        )
    return LoraAdapter(name, rank, layers)


def _offsets(parts: tuple[str, ...], sizes: dict[str, tuple[int, int]]) -> list[int]:
    """Where each part's columns start in the fused projection's output."""
    return list(itertools.accumulate([sizes[p][1] for p in parts[:-1]], initial=0))


def _part(name, layer, proj, found, sizes, rank, scale, offset) -> Part:
    pair = found[(layer, proj)]
    if set(pair) != {"A", "B"}:
        raise AdapterError(f"adapter {name!r}: layer {layer} {proj} lacks lora_A or lora_B")
    a, b = pair["A"], pair["B"]
    fan_in, fan_out = sizes[proj]
    if a.shape != (rank, fan_in) or b.shape != (fan_out, rank):
        raise AdapterError(
            f"adapter {name!r}: layer {layer} {proj} has A {tuple(a.shape)} and B "
            f"{tuple(b.shape)}; this model needs ({rank}, {fan_in}) and ({fan_out}, {rank})"
        )
    return Part(a.contiguous(), (b.T * scale).contiguous(), offset)


def _adapter_config(path: str) -> dict:
    file = os.path.join(path, "adapter_config.json")
    try:
        with open(file) as f:
            settings = json.load(f)
    except FileNotFoundError:
        raise AdapterError(f"{path}: no adapter_config.json (a PEFT LoRA directory)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{file}: not JSON ({exc})") from None
    except OSError as exc:
        raise AdapterError(f"{file}: cannot be read ({exc.strerror})") from None
    if not isinstance(settings, dict):
        raise AdapterError(f"{file}: not a JSON object")
    if settings.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{file}: peft_type {settings.get('peft_type')!r}, not LORA")
    return settings


def _tensors(path: str) -> list[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.exists(file):
        raise AdapterError(f"{path}: no adapter_model.safetensors")
    try:
        with safe_open(file, framework="pt") as f:
            return [(key, f.get_tensor(key)) for key in f.keys()]  # noqa: SIM118 (not a dict)
    except (OSError, SafetensorError) as exc:
        raise AdapterError(f"{file}: not a readable safetensors file ({exc})") from None


# rows from which PyTorch's matmuls (blocked GEMMs) outrun the compiled op, which reads an
# adapter's matrices once per 4 rows: per part at 128 rows 77 against 90 µs (576 → 576) and 112
# against 117 (576 → 1536), at 256 rows 142 against 112 and 222 against 162 (bench/RESULTS.md)
GEMM_ROWS = 128


class LoraStep:
    """The adapters of the step being run and each one's rows; every projection of the model
    (engine/model.py, engine/cpu_decode.py) passes its output through `apply`."""

    def __init__(self, ops: ModuleType | None = None) -> None:
        self.ops = ops  # the compiled layer ops (engine/cpu_kernels.py), on CPU
        # (adapter, its rows; None: every row of the step)
        self.groups: list[tuple[LoraAdapter, torch.Tensor | None]] = []

    def set(self, groups: list[tuple[LoraAdapter, torch.Tensor | None]]) -> None:
        self.groups = groups

    def apply(self, layer: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (the base projection of x) plus each adapter's term on its rows, in place."""
        lanes = self.ops.LANES if self.ops is not None else 0
        for adapter, rows in self.groups:
            few = (x.shape[0] if rows is None else rows.shape[0]) < GEMM_ROWS
            for part in adapter.layers[layer].get(proj, ()):
                if few and lanes and part.multiple % lanes == 0:
                    self.ops.lora_add_(y, x, part.a, part.b, rows, part.offset)
                else:
                    _add(y, x, part, rows)
        return y


def _add(y: torch.Tensor, x: torch.Tensor, part: Part, rows: torch.Tensor | None) -> None:
    """What lora_add_ does, in PyTorch."""
    columns = y[:, part.offset : part.offset + part.b.shape[1]]
    if rows is None:
        columns.add_((x @ part.a.T) @ part.b)
    else:
        columns.index_add_(0, rows, ((x.index_select(0, rows) @ part.a.T) @ part.b).to(y.dtype))


@dataclass
class Adapters:
    """The adapters an engine serves, by the name requests use in `model`."""

    config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    max_loras: int = 8
    reserved: tuple[str, ...] = ()  # the base model's names: an adapter under one would be shadowed
    by_name: dict[str, LoraAdapter] = field(default_factory=dict)
    # loads at run time come from the HTTP server's threads
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, path: str) -> LoraAdapter:
        with self.lock:
            self._room_for(name)  # before reading the files, to fail fast
        adapter = load_adapter(name, path, self.config).to(self.device, self.dtype)
        with self.lock:  # not held while loading: the server's event loop lists adapters
            self._room_for(name)  # again: another load may have come first
            self.by_name[name] = adapter
        return adapter

    def _room_for(self, name: str) -> None:
        if not name or name in self.reserved:
            raise AdapterError(
                f"an adapter cannot be named {name!r}: empty or the base model's", "lora_name"
            )
        if name in self.by_name:
            raise AdapterError(f"an adapter named {name!r} is already loaded", "lora_name")
        if len(self.by_name) >= self.max_loras:
            raise AdapterError(
                f"{self.max_loras} adapters are loaded, the most this engine serves (max_loras)",
                "lora_name",
            )

    def remove(self, name: str) -> None:
        """Requests already running keep the adapter they started with until they finish."""
        with self.lock:
            if self.by_name.pop(name, None) is None:
                raise AdapterError(f"no adapter named {name!r} is loaded")

    def get(self, name: str) -> LoraAdapter | None:
        return self.by_name.get(name)

    def names(self) -> list[str]:
        """A snapshot: a load on another thread may change the dict while a caller iterates."""
        with self.lock:
            return list(self.by_name)
