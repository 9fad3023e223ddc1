"""The engine's compiled CPU kernels (decode attention, and bf16 prefill attention where the CPU has
AVX512-BF16, both reading the paged KV pool in place), built
on first use with the machine's C++ compiler through torch's cpp_extension and cached under
TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions), keyed by the source. Built for the CPU
it runs on (-march=native), so a cache must not move between CPU models. Without a compiler the
engine attends with PyTorch SDPA instead, and says so once.

    python -m engine.cpu_kernels   # build now (`make install` does)
"""

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

log = logging.getLogger("tokenyard.engine")

SOURCES = [
    str(Path(__file__).parent / "csrc" / name)
    for name in ("paged_attention.cpp", "prefill_attention.cpp")
]
HEAD_DIMS = (64, 128)  # what the kernel is instantiated for
# -ffast-math at compile time only (vectorized exp over finite scores): linking with it would set
# flush-to-zero for the whole process
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]


@functools.cache
def paged_attention() -> ModuleType | None:
    """The compiled module (`paged_decode`; `paged_prefill` where the CPU has AVX512-BF16), or
    None where it cannot be built."""
    try:
        import ninja  # the pip package; cpp_extension runs `ninja` from PATH, which may lack it
        from torch.utils.cpp_extension import load

        if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        log.info("loading the CPU attention kernel (built on first use: ~30 s)")
        return load(
            "tokenyard_paged_attention",
            SOURCES,
            extra_cflags=CFLAGS,
            extra_ldflags=["-fopenmp"],
        )
    except Exception as exc:  # no compiler or ninja: the PyTorch path serves
        log.warning("CPU attention kernel not built (%s): decoding with PyTorch SDPA", exc)
        return None


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    module = paged_attention()
    print(f"CPU attention kernel: {module.__file__ if module else 'not available'}")
