"""Block-quantized weights: GGUF's formats converted losslessly into the two layouts the CPU
kernels multiply (engine/csrc/quant_matmul.cpp), quantization of float checkpoints at load, and
the PyTorch reference (dequantize) that tests and machines without the kernels use.

    q4: blocks of 32 weights along a row, w = d * q + m, q in 0..15 two a byte in GGML's order
        (byte j: weight j in the low nibble, weight j + 16 in the high one); d, m per block.
        Holds Q4_0 (m = -8d), Q4_1, Q4_K (d = d_super * scale, m = -dmin_super * min) and int4.
    q8: w = d * q, q int8, d per `group` weights (32; 16 for Q6_K's sub-blocks).
        Holds Q8_0, Q6_K (q - 32 and d * scale, both exact) and int8.
Every conversion is exact: GGUF's fp16 scales times small integer scales fit fp32's mantissa. A
tensor's scales (and offsets) stay fp16 where every one of them is exactly an fp16 (Q4_0, Q4_1 and
Q8_0 as shipped): a decode step streams every weight once, and fp32 scales made a Q4_1 block 24
bytes instead of 20 (bench/RESULTS.md, issue 17).

Those row-major layouts are what loading builds (fusing and reordering rows is simple there) and
what the embedding looks rows up in. A linear layer's kernels multiply the same weights regrouped
in panels of 16 rows (`to_panels`, an exact reordering): engine/csrc/quant_matmul.cpp says why.
"""

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32  # weights per q4 block, and per activation block in the kernels
PANEL = 16  # weight rows per panel: one per int32 lane of an AVX-512 register
QUANTIZATIONS = ("auto", "none", "int8", "int4")
# GGUF tensor types the loader keeps quantized; others (F32, F16, BF16, ...) are dequantized
GGUF_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q6_K")


@dataclass
class QuantizedTensor:
    """A [rows, cols] weight matrix in one of the kernels' layouts."""

    kind: str  # "q4" | "q8"
    qs: torch.Tensor  # q4: uint8 [rows, cols / 2]; q8: int8 [rows, cols]
    scales: torch.Tensor  # float16 or float32 [rows, cols / group]
    mins: torch.Tensor | None  # q4: [rows, cols / 32], in the scales' dtype
    group: int  # weights per scale
    source: str  # the GGUF type it came from, or int8 / int4 when quantized at load
    # the row count of a tensor in panels (`to_panels`: qs [panels, cols / 32, bytes a block],
    # scales and mins [panels, cols / 32, (32 / group), 16]); None in the row-major layout
    panel_rows: int | None = None

    @property
    def shape(self) -> tuple[int, int]:
        if self.panel_rows is not None:
            return self.panel_rows, self.qs.shape[1] * BLOCK
        rows, width = self.qs.shape
        return rows, width * 2 if self.kind == "q4" else width

    @property
    def nbytes(self) -> int:
        parts = (self.qs, self.scales, self.mins)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def values(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """The integer levels q of `rows` as float32 [n, cols]."""
        if self.panel_rows is not None:
            return from_panels(self).values(rows)
        qs = self.qs[rows]
        if self.kind == "q8":
            return qs.float()
        blocks = qs.reshape(qs.shape[0], -1, BLOCK // 2)
        return torch.stack((blocks & 0x0F, blocks >> 4), dim=2).reshape(qs.shape[0], -1).float()

    def dequantize(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """The reference: float32 [n, cols] of `rows` (all of them by default)."""
        if self.panel_rows is not None:
            return from_panels(self).dequantize(rows)
        q = self.values(rows)
        n, cols = q.shape
        grouped = q.reshape(n, cols // self.group, self.group) * self.scales[rows].unsqueeze(-1)
        if self.mins is not None:
            grouped = grouped + self.mins[rows].unsqueeze(-1)
        return grouped.reshape(n, cols)

    def permute_rows(self, order: torch.Tensor) -> "QuantizedTensor":
        """The same weights with rows reordered (blocks run along rows, so rows move whole)."""
        assert self.panel_rows is None, "rows are reordered before the panels are made"
        mins = None if self.mins is None else self.mins[order]
        return QuantizedTensor(
            self.kind, self.qs[order], self.scales[order], mins, self.group, self.source
        )

    @staticmethod
    def cat(parts: list["QuantizedTensor"]) -> "QuantizedTensor":
        """Row-wise concatenation (fused projections) of tensors of one layout."""
        first = parts[0]
        assert all(p.panel_rows is None for p in parts), "fused before the panels are made"
        # one dtype for the fused scales: fp16 only where every part has it
        half = all(p.scales.dtype == torch.float16 for p in parts)
        dtype = torch.float16 if half else torch.float32
        mins = None if first.mins is None else torch.cat([p.mins.to(dtype) for p in parts])
        return QuantizedTensor(
            first.kind,
            torch.cat([p.qs for p in parts]),
            torch.cat([p.scales.to(dtype) for p in parts]),
            mins,
            first.group,
            "+".join(sorted({p.source for p in parts})),
        )

    def same_layout(self, other: "QuantizedTensor") -> bool:
        return (self.kind, self.group) == (other.kind, other.group)


# ---------------------------------------------------------------- panels


def to_panels(w: QuantizedTensor) -> QuantizedTensor:
    """The same weights in the kernels' layout (engine/csrc/quant_matmul.cpp): rows in panels of
    16 (the last padded with zero rows), each block of a panel's 16 rows stored together, its
    scales (and offsets) after it as 16-lane vectors."""
    assert w.panel_rows is None
    rows, cols = w.shape
    pad, blocks, groups = -rows % PANEL, cols // BLOCK, BLOCK // w.group

    def panels(x: torch.Tensor, *inner: int) -> torch.Tensor:  # [rows, ...] -> [P, 16, *inner]
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
        return x.reshape(-1, PANEL, *inner)

    if w.kind == "q4":
        # [P, row, block, chunk, low/high nibble, byte] -> [P, block, chunk, row, byte, nibble]
        levels = panels(w.values().to(torch.uint8), blocks, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
        qs = levels[..., 0] | (levels[..., 1] << 4)
    else:  # [P, row, block, chunk, byte] -> [P, block, chunk, row, byte]
        qs = panels(w.qs, blocks, 8, 4).permute(0, 2, 3, 1, 4)
    lanes = (0, 2, 3, 1)  # [P, row, block, group] -> [P, block, group, row]
    scales = panels(w.scales, blocks, groups).permute(*lanes)
    mins = None if w.mins is None else panels(w.mins, blocks, 1).permute(*lanes).contiguous()
    return QuantizedTensor(
        w.kind,
        qs.reshape(qs.shape[0], blocks, -1).contiguous(),
        scales.contiguous(),
        mins,
        w.group,
        w.source,
        panel_rows=rows,
    )


def from_panels(w: QuantizedTensor) -> QuantizedTensor:
    """The row-major layout of a tensor in panels (the inverse of `to_panels`)."""
    rows, cols = w.shape
    count, blocks = w.qs.shape[:2]

    def unpanel(x: torch.Tensor) -> torch.Tensor:  # [P, block, group, row] -> [rows, -1]
        return x.permute(0, 3, 1, 2).reshape(count * PANEL, -1)[:rows].contiguous()

    if w.kind == "q4":
        chunks = w.qs.reshape(count, blocks, 4, PANEL, 4)  # [P, block, chunk, row, byte]
        levels = torch.stack((chunks & 0x0F, chunks >> 4), dim=-1)
        levels = levels.permute(0, 3, 1, 2, 5, 4).reshape(count * PANEL, cols)[:rows]
        blocked = levels.reshape(rows, blocks, 2, BLOCK // 2)
        qs = (blocked[:, :, 0] | (blocked[:, :, 1] << 4)).reshape(rows, cols // 2)
    else:
        chunks = w.qs.reshape(count, blocks, 8, PANEL, 4)
        qs = chunks.permute(0, 3, 1, 2, 4).reshape(count * PANEL, cols)[:rows]
    mins = None if w.mins is None else unpanel(w.mins)
    return QuantizedTensor(w.kind, qs.contiguous(), unpanel(w.scales), mins, w.group, w.source)


# ---------------------------------------------------------------- packing


def pack_q4(levels: np.ndarray, d: np.ndarray, m: np.ndarray, source: str) -> QuantizedTensor:
    """levels: uint8 [rows, cols] in 0..15; d, m: per block of 32, [rows, cols / 32]."""
    rows, cols = levels.shape
    blocks = levels.reshape(rows, cols // BLOCK, 2, BLOCK // 2)
    qs = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(rows, cols // 2)
    return QuantizedTensor(
        "q4",
        torch.from_numpy(np.ascontiguousarray(qs, dtype=np.uint8)),
        *_scales(rows, d, m),
        BLOCK,
        source,
    )


def pack_q8(levels: np.ndarray, d: np.ndarray, group: int, source: str) -> QuantizedTensor:
    rows = levels.shape[0]
    qs = torch.from_numpy(np.ascontiguousarray(levels, dtype=np.int8))
    (scales,) = _scales(rows, d)
    return QuantizedTensor("q8", qs, scales, None, group, source)


def _scales(rows: int, *arrays: np.ndarray) -> list[torch.Tensor]:
    """The arrays as [rows, -1] tensors: fp16 when every value of them is exact in fp16, else
    fp32."""
    exact = [np.asarray(x, dtype=np.float32) for x in arrays]
    with np.errstate(over="ignore"):
        fits = all(np.array_equal(x.astype(np.float16).astype(np.float32), x) for x in exact)
    dtype = np.float16 if fits else np.float32
    return [torch.from_numpy(np.ascontiguousarray(x, dtype=dtype).reshape(rows, -1)) for x in exact]


# ---------------------------------------------------------------- GGUF blocks → layouts


def from_gguf(raw: np.ndarray, type_name: str, rows: int, cols: int) -> QuantizedTensor:
    """A GGUF tensor's raw blocks (uint8, as gguf's reader gives them) in a kernel layout."""
    blocks = np.ascontiguousarray(raw).reshape(rows * cols // _BLOCK_WEIGHTS[type_name], -1)
    return _CONVERTERS[type_name](blocks, rows, cols)


def _f16(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """GGML packs runs of `width` bytes: low nibbles are the run's first `width` weights, high
    nibbles the next `width`."""
    runs = qs.reshape(qs.shape[0], -1, 1, width) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (runs & 0x0F).reshape(qs.shape[0], -1)


def _q4_0(blocks: np.ndarray, rows: int, cols: int) -> QuantizedTensor:
    d = _f16(blocks[:, :2])
    levels = _nibbles(blocks[:, 2:], BLOCK // 2)
    return pack_q4(levels.reshape(rows, cols), d, -8 * d, "Q4_0")


def _q4_1(blocks: np.ndarray, rows: int, cols: int) -> QuantizedTensor:
    levels = _nibbles(blocks[:, 4:], BLOCK // 2)
    return pack_q4(levels.reshape(rows, cols), _f16(blocks[:, :2]), _f16(blocks[:, 2:4]), "Q4_1")


def _q8_0(blocks: np.ndarray, rows: int, cols: int) -> QuantizedTensor:
    levels = np.ascontiguousarray(blocks[:, 2:]).view(np.int8)
    return pack_q8(levels.reshape(rows, cols), _f16(blocks[:, :2]), BLOCK, "Q8_0")


def _q4_k(blocks: np.ndarray, rows: int, cols: int) -> QuantizedTensor:
    # 256 weights: d, dmin (fp16), 8 six-bit (scale, min) pairs packed in 12 bytes, 128 bytes of
    # nibbles in runs of 32; sub-block j: w = d * scale_j * q - dmin * min_j
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    packed = blocks[:, 4:16].reshape(-1, 3, 4)
    lo, hi, mixed = packed[:, 0], packed[:, 1], packed[:, 2]
    scale = np.concatenate([lo & 0x3F, (mixed & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    minimum = np.concatenate([hi & 0x3F, (mixed >> 4) | ((hi >> 2) & 0x30)], axis=-1)
    levels = _nibbles(blocks[:, 16:], BLOCK)
    return pack_q4(
        levels.reshape(rows, cols),
        (d * scale.astype(np.float32)).reshape(rows, -1),
        (-(dmin * minimum.astype(np.float32))).reshape(rows, -1),
        "Q4_K",
    )


def _q6_k(blocks: np.ndarray, rows: int, cols: int) -> QuantizedTensor:
    # 256 weights: 128 bytes of low nibbles (runs of 64), 64 bytes of high 2-bit pairs (runs of
    # 32, four shifts), 16 int8 scales (one per 16 weights), d (fp16); w = d * scale * (q - 32)
    n = blocks.shape[0]
    low = _nibbles(blocks[:, :128], 64).reshape(n, -1, 32)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    high = ((blocks[:, 128:192].reshape(n, -1, 1, 32) >> shifts) & 0x03).reshape(n, -1, 32)
    levels = (low | (high << 4)).astype(np.int8) - np.int8(32)
    scale = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(blocks[:, 208:210]) * scale
    return pack_q8(levels.reshape(rows, cols), d.reshape(rows, -1), 16, "Q6_K")


_CONVERTERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q6_K": _q6_k}
_BLOCK_WEIGHTS = {"Q4_0": 32, "Q4_1": 32, "Q8_0": 32, "Q4_K": 256, "Q6_K": 256}


# ---------------------------------------------------------------- float → layouts, at load


def quantize(weight: torch.Tensor, kind: str, source: str = "") -> QuantizedTensor:
    """A float [rows, cols] weight (cols a multiple of 32) as int8 (symmetric, a scale per 32) or
    int4 (a scale and an offset per 32, spanning the block's min..max); `source` names where the
    values came from (default: the kind)."""
    w = weight.detach().float().reshape(weight.shape[0], -1, BLOCK)
    rows = w.shape[0]
    if kind == "int8":
        d = w.abs().amax(-1) / 127
        levels = torch.round(w / torch.where(d > 0, d, 1).unsqueeze(-1))
        levels_q8 = levels.reshape(rows, -1).to(torch.int8).numpy()
        return pack_q8(levels_q8, d.numpy(), BLOCK, source or kind)
    if kind != "int4":
        raise ValueError(f"quantize to int8 or int4, not {kind!r}")
    low, high = w.amin(-1), w.amax(-1)
    d = (high - low) / 15
    levels = torch.round((w - low.unsqueeze(-1)) / torch.where(d > 0, d, 1).unsqueeze(-1))
    levels = levels.clamp(0, 15).reshape(rows, -1).to(torch.uint8).numpy()
    return pack_q4(levels, d.numpy(), low.numpy(), source or kind)
