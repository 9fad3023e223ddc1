"""Linear layers and the token embedding over block-quantized weights (CPU).

A decode step multiplies a few rows by every weight, so it is bound by the bytes of weights read:
the compiled kernels read 4- or 8-bit weights once (engine/csrc/quant_matmul.cpp). A prefill step
multiplies hundreds of rows, where oneDNN's float matmuls outrun int8 dot products: there the
weight is dequantized into the activations' dtype for the call, a cost that hundreds of rows
share. Without the kernels, PyTorch dequantizes and multiplies (the reference).
"""

import logging

import torch
from torch import nn
from torch.nn import functional as F

from engine.cpu_kernels import quant_isa, quant_matmul
from engine.quant import QuantizedTensor

log = logging.getLogger("tokenyard.engine")

# rows from which dequantize + float matmul beats the int8 kernels (bench: quant crossover)
DENSE_ROWS = 48


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
    """A bias-free linear layer over a QuantizedTensor [out, in].

    The weight is a plain attribute, not a buffer, so that `Module.to(dtype)` leaves its fp32
    scales unrounded; these layers live on the CPU."""

    def __init__(self, weight: QuantizedTensor) -> None:
        super().__init__()
        self.weight = weight
        self.out_features, self.in_features = weight.shape
        self.kernels = quant_matmul()
        self.isa = quant_isa()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.kernels is None:
            y = F.linear(rows, self.weight.dequantize().to(x.dtype))
        elif rows.shape[0] >= DENSE_ROWS:
            y = F.linear(rows, self.dense(x.dtype))
        elif self.weight.kind == "q4":
            w = self.weight
            y = self.kernels.q4_linear(rows, w.qs, w.scales, w.mins, self.isa)
        else:
            w = self.weight
            y = self.kernels.q8_linear(rows, w.qs, w.scales, w.group, self.isa)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        w = self.weight
        mins = w.mins if w.mins is not None else w.scales.new_empty(0)
        return self.kernels.dequantize(w.qs, w.scales, mins, w.group, self.in_features, dtype)

    def extra_repr(self) -> str:
        w = self.weight
        return f"in={self.in_features}, out={self.out_features}, {w.source} as {w.kind}"


class QuantizedEmbedding(nn.Module):
    """Token embedding rows dequantized as they are looked up (float32)."""

    def __init__(self, weight: QuantizedTensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.dequantize(ids)
