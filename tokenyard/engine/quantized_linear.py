"""Linear layers and the token embedding over block-quantized weights (CPU).

A decode step multiplies a few rows by every weight, so it is bound by the bytes of weights read:
the compiled kernels read 4- or 8-bit weights once (engine/csrc/quant_matmul.cpp). With many rows
(a large batch, a prefill chunk) the int8 dot products become compute-bound, and where the CPU has
AMX oneDNN's bf16 matmuls outrun them from about 50 rows (a 3072 x 576 Q4_1 matrix: 372 against
495 us at 32 rows, 768 against 621 at 64; bench/quant_crossover.py), so there, where the
activations are bf16, the layer also keeps a packed bf16 copy of its weight for those steps
(`keep_dense_copy`: 2 more bytes a weight). Without AMX the kernels stay ahead: with AVX512-BF16
alone (AMD Zen 4) they beat the bf16 copy at every step size up to a 512-row chunk (817 against
1,163 us at 128 rows, 3,243 against 4,279 at 512), and with fp32 activations they beat dequantize +
fp32 matmul up to 512 rows too (6.1 against 8.0 ms with AVX-512 VNNI; about even with AVX2), so
only steps from DENSE_ROWS rows dequantize the weight for the call, a cost the rows share.
Without the kernels, PyTorch dequantizes and multiplies (the reference).
"""

import logging

import torch
from torch import nn
from torch.nn import functional as F

from tokenyard.engine.cpu_kernels import quant_isa, quant_matmul
from tokenyard.engine.packed_linear import PackedLinear
from tokenyard.engine.quant import QuantizedTensor, to_panels

log = logging.getLogger("tokenyard.engine")

# rows from which dequantize + fp32 matmul beats the int8 kernels (beyond 512 with VNNI)
DENSE_ROWS = 1024
# rows from which a kept bf16 copy beats them (AMX: between 48 and 64; bench/quant_crossover.py)
COPY_ROWS = 48


def dense_copy_pays() -> bool:
    """Whether a packed bf16 copy of each quantized weight outruns the kernels on this CPU's large
    steps: only where oneDNN multiplies on AMX tiles."""
    return torch.cpu._is_amx_tile_supported()


def effective_quantization(requested: str, device: torch.device) -> str:
    """What the loader should do with `requested` on `device`: quantized weights are CPU work
    (CUDA runs bf16), and as-shipped weights without the kernels would be dequantized at every
    call, so there the weights are dequantized once at load instead."""
    if device.type != "cpu":
        if requested in ("int8", "int4"):
            raise ValueError(f"quantization {requested!r} runs on CPU only")
        return "none"
    if requested == "auto" and quant_matmul() is None:
        log.warning("no quantized matmul kernels: weights dequantized at load")
        return "none"
    return requested


class QuantizedLinear(nn.Module):
    """A bias-free linear layer over a QuantizedTensor [out, in], kept in the kernels' panels
    where they are built (a tied embedding looks its rows up in the same panels).

    The weight is a plain attribute, not a buffer, so that `Module.to(dtype)` leaves its fp32
    scales unrounded; these layers live on the CPU."""

    def __init__(self, weight: QuantizedTensor) -> None:
        super().__init__()
        self.kernels = quant_matmul()
        self.weight = kernel_layout(weight)
        self.out_features, self.in_features = weight.shape
        self.isa = quant_isa()
        self.copy: PackedLinear | None = None

    def keep_dense_copy(self) -> None:
        """Keep a packed bf16 copy of the weight for steps of COPY_ROWS rows or more."""
        if self.kernels is not None:
            self.copy = PackedLinear(self.dense(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.kernels is None:
            y = F.linear(rows, self.weight.dequantize().to(x.dtype))
        elif self.copy is not None and rows.shape[0] >= COPY_ROWS and x.dtype == torch.bfloat16:
            y = self.copy(rows)
        elif rows.shape[0] >= DENSE_ROWS:
            y = F.linear(rows, self.dense(x.dtype))
        else:
            y = self.multiply(rows)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [M, in] @ W.T through the compiled int8 kernels (the layer has them): what a step
        of a few rows runs."""
        w = self.weight
        return self.kernels.panel_linear(
            rows, w.qs, w.scales, _mins(w), w.group, self.out_features, self.isa
        )

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        return _rows(self.kernels, self.weight, dtype)

    def extra_repr(self) -> str:
        w = self.weight
        return f"in={self.in_features}, out={self.out_features}, {w.source} as {w.kind}"


class QuantizedEmbedding(nn.Module):
    """Token embedding rows dequantized as they are looked up (float32): by the kernels from panels
    (the layout a tied LM head multiplies, so the two share one copy), else by the reference."""

    def __init__(self, weight: QuantizedTensor) -> None:
        super().__init__()
        self.kernels = quant_matmul()
        self.weight = kernel_layout(weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight.panel_rows is None:
            return self.weight.dequantize(ids)
        rows = _rows(self.kernels, self.weight, torch.float32, ids.reshape(-1))
        return rows.reshape(*ids.shape, -1)


def kernel_layout(weight: QuantizedTensor) -> QuantizedTensor:
    """`weight` as the kernels read it: in panels where they are built (the model converts each
    tensor once, so a tied embedding and head share the result)."""
    if quant_matmul() is None or weight.panel_rows is not None:
        return weight
    return to_panels(weight)


def _mins(w: QuantizedTensor) -> torch.Tensor:
    return w.mins if w.mins is not None else w.scales.new_empty(0)


def _rows(kernels, w: QuantizedTensor, dtype: torch.dtype, ids: torch.Tensor | None = None):
    """Rows `ids` (all by default) of panel weights `w`, dense, through the kernels."""
    rows, cols = w.shape
    ids = ids if ids is not None else torch.empty(0, dtype=torch.int64)
    return kernels.dequantize(w.qs, w.scales, _mins(w), w.group, rows, cols, dtype, ids)
