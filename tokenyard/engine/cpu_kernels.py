"""The engine's compiled CPU kernels, built on first use with the machine's C++ compiler through
torch's cpp_extension and cached under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions),
keyed by the source:
- attention (paged_attention.cpp, prefill_attention_fp32.cpp, prefill_attention.cpp): decode
  attention, fp32 prefill attention, and bf16 prefill attention where the CPU has AVX512-BF16,
  all reading the paged KV pool in place. Built for the CPU it runs on (-march=native), so a
  cache must not move between CPU models.
- element-wise layer ops (layer_ops.cpp): residual add + RMSNorm, rotary in place (also with the
  step's K/V written into the pool), SiLU * up, a LoRA adapter's term, each one call instead of
  several PyTorch ops (rounded as PyTorch rounds: no fast math).
- quantized matmuls (quant_matmul.cpp): AVX-512 VNNI and AVX2 paths both compiled (function target
  attributes) and chosen at run time (`quant_isa`).
Without a compiler the engine attends with PyTorch SDPA and multiplies quantized weights through
PyTorch (dequantize, then matmul) instead, and says so once.

    python -m tokenyard.engine.cpu_kernels   # build now (`make install` does)
"""

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

log = logging.getLogger("tokenyard.engine")

CSRC = Path(__file__).parent / "csrc"
HEAD_DIMS = (64, 128)  # what the kernel is instantiated for
# -ffast-math at compile time only (vectorized exp over finite scores): linking with it would set
# flush-to-zero for the whole process
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]
# no fast math and no contraction of a * b + c into one rounding: rounding must be exact
# (activations to int8; layer ops as PyTorch rounds); -march=native vectorizes the plain loops, the
# dot products carry their own targets
QUANT_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"]
# names for `quant_isa`'s codes (the kernel's `isa` argument); TOKENYARD_QUANT_ISA forces one
QUANT_ISAS = {"avx512_vnni": 2, "avx2": 1}


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """cpp_extension runs `ninja` from PATH, which may lack the pip package's; PATH is put back
    afterwards so that the build leaves the process's environment (and its children's) as it was."""
    import ninja

    before = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join(p for p in (ninja.BIN_DIR, before) if p)
    try:
        yield
    finally:
        if before is None:
            del os.environ["PATH"]
        else:
            os.environ["PATH"] = before


def _build(name: str, sources: list[str], cflags: list[str]) -> ModuleType:
    from torch.utils.cpp_extension import load

    log.info("loading the CPU kernels %s (built on first use: ~30 s)", name)
    with _ninja_on_path():
        return load(name, sources, extra_cflags=cflags, extra_ldflags=["-fopenmp"])


@functools.cache
def paged_attention() -> ModuleType | None:
    """The compiled module (`paged_decode`; `paged_prefill`, in bf16 where `PREFILL_BF16`: the
    CPU has AVX512-BF16), or None where it cannot be built."""
    try:
        names = ("paged_attention.cpp", "prefill_attention.cpp", "prefill_attention_fp32.cpp")
        sources = [str(CSRC / name) for name in names]
        return _build("tokenyard_paged_attention", sources, CFLAGS)
    except Exception as exc:  # no compiler or ninja: the PyTorch path serves
        log.warning("CPU attention kernel not built (%s): decoding with PyTorch SDPA", exc)
        return None


@functools.cache
def layer_ops() -> ModuleType | None:
    """The compiled element-wise ops (`rms_norm`, `rotary_`, `rotary_to_cache_`, `silu_mul`), or
    None where they cannot be built (the model then runs the same arithmetic as PyTorch ops)."""
    try:
        return _build("tokenyard_layer_ops", [str(CSRC / "layer_ops.cpp")], QUANT_CFLAGS)
    except Exception as exc:  # no compiler or ninja
        log.warning("CPU layer ops not built (%s): using PyTorch", exc)
        return None


def layer_ops_for(hidden_size: int, head_dim: int) -> ModuleType | None:
    """The layer ops where the model's shapes suit them: they work in whole vectors of LANES
    floats, across the hidden size and across half a head (the other path is PyTorch's)."""
    ops = layer_ops()
    if ops is None or (hidden_size % ops.LANES == 0 and head_dim % (2 * ops.LANES) == 0):
        return ops
    log.info(
        "hidden size %d or head size %d not in whole vectors: layer ops through PyTorch",
        hidden_size,
        head_dim,
    )
    return None


@functools.cache
def quant_matmul() -> ModuleType | None:
    """The compiled quantized matmuls (`q4_linear`, `q8_linear`, `dequantize`), or None where they
    cannot be built or the CPU has neither AVX2 nor AVX-512 VNNI."""
    try:
        module = _build("tokenyard_quant_matmul", [str(CSRC / "quant_matmul.cpp")], QUANT_CFLAGS)
    except Exception as exc:  # no compiler, or not x86
        log.warning("quantized matmul kernels not built (%s): using PyTorch", exc)
        return None
    if module.best_isa() == 0:
        log.warning("CPU without AVX2: quantized matmuls through PyTorch")
        return None
    return module


def quant_isa() -> int:
    """The kernel path for this CPU: AVX-512 VNNI where present, else AVX2; TOKENYARD_QUANT_ISA
    (avx512_vnni | avx2) picks a path the CPU has (tests force AVX2 this way)."""
    module = quant_matmul()
    best = module.best_isa() if module else 0
    forced = os.environ.get("TOKENYARD_QUANT_ISA")
    if forced:
        if forced not in QUANT_ISAS:
            raise ValueError(f"TOKENYARD_QUANT_ISA={forced!r}: one of {sorted(QUANT_ISAS)}")
        return min(QUANT_ISAS[forced], best)
    return best


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    attention, ops, quant = paged_attention(), layer_ops(), quant_matmul()
    print(f"CPU attention kernel: {attention.__file__ if attention else 'not available'}")
    print(f"CPU layer ops: {ops.__file__ if ops else 'not available'}")
    print(f"quantized matmul kernel: {quant.__file__ if quant else 'not available'}")
