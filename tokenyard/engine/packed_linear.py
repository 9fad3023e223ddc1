"""Linear layers with weights packed once into oneDNN's blocked layout (CPU).

`F.linear` on CPU hands oneDNN (bf16) or MKL (fp32) a plain row-major weight, which is reordered
inside every call; for the few-row matmuls of decode steps that costs as much as the math (packed:
1.2-2.3x faster at 1-64 rows, the same at 512; bench/RESULTS.md). PyTorch's own compiler packs
weights through the same two ops when it freezes a model for CPU.
"""

import functools
import logging

import torch
from torch import nn

log = logging.getLogger("tokenyard.engine")

# the row count oneDNN tunes its blocking for: a decode batch's order (within 10% of the best
# hint for every row count measured)
ROWS_HINT = 64


class PackedLinear(nn.Module):
    """A bias-free linear layer over a packed copy of `weight` ([out, in])."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [None], "")


@functools.cache
def packable(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies packed weights of `dtype` on this CPU, and agrees with F.linear
    (bf16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT: an AVX2-only CPU has neither); one trial."""
    weight = torch.randn(32, 64).to(dtype)
    x = torch.randn(2, 64).to(dtype)
    try:
        packed = PackedLinear(weight)(x)
        expected = torch.nn.functional.linear(x, weight)
    except (RuntimeError, AttributeError) as exc:
        log.warning("oneDNN cannot multiply %s weights here (%s)", dtype, exc)
        return False
    # allclose, not torch.testing.assert_close: that imports torch.distributed.tensor, ~1 s of an
    # engine's start (bench/engine_startup.py)
    if not torch.allclose(packed.float(), expected.float(), rtol=1e-2, atol=1e-2):
        log.warning("oneDNN's %s matmul disagrees with F.linear here", dtype)
        return False
    return True


def pack_linears(module: nn.Module) -> int:
    """Swap every bias-free `nn.Linear` under `module` for a PackedLinear; the count swapped (0
    where this PyTorch build or CPU cannot run oneDNN in the weights' dtype)."""
    targets = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and child.bias is None
    ]
    if not targets or targets[0][2].weight.device.type != "cpu":
        return 0
    if not packable(targets[0][2].weight.dtype):
        return 0
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child.weight))
    return len(targets)
