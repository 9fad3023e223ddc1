"""Linear layers with weights packed once into oneDNN's blocked layout (CPU).

`F.linear` on CPU hands oneDNN (bf16) or MKL (fp32) a plain row-major weight, which is reordered
inside every call; for the few-row matmuls of decode steps that costs as much as the math (packed:
1.2-2.3x faster at 1-64 rows, the same at 512; bench/RESULTS.md). PyTorch's own compiler packs
weights through the same two ops when it freezes a model for CPU.
"""

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
    try:  # one trial against F.linear: fails where oneDNN lacks the dtype on this CPU
        probe = targets[0][2]
        x = torch.randn(2, probe.in_features, dtype=probe.weight.dtype)
        torch.testing.assert_close(PackedLinear(probe.weight)(x), probe(x), rtol=1e-2, atol=1e-2)
    except (RuntimeError, AttributeError, AssertionError) as exc:
        log.warning("linear weights left unpacked (%s)", exc)
        return 0
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child.weight))
    return len(targets)
