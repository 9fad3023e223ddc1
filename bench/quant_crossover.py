"""Where the quantized matmul kernels stop paying: one Q4_1-shaped matrix (SmolLM2's gate_up,
3072 x 576) times 1-512 activation rows (in the engine's dtype on this CPU) through the int8
kernel, a packed bf16 copy (oneDNN, where it packs bf16) and dequantize-per-call + matmul, 30
distinct matrices in turn so the weights stream from memory as they do in a decode step.
engine/quantized_linear.py's COPY_ROWS and DENSE_ROWS come from this.

    .venv/bin/python bench/quant_crossover.py [--rounds 3]
"""

import argparse
import timeit

import torch
from engine_vs_llamacpp import cpu_flags
from torch.nn import functional as F

from tokenyard.engine.cpu_kernels import quant_isa, quant_matmul
from tokenyard.engine.model_runner import resolve_dtype
from tokenyard.engine.packed_linear import PackedLinear, packable
from tokenyard.engine.quant import pack_q4
from tokenyard.engine.quantized_linear import QuantizedLinear

N, K, MATRICES = 3072, 576, 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if quant_matmul() is None:
        raise SystemExit("the quantized kernels are not built here")
    print(f"CPU: {cpu_flags()}; kernel path {quant_isa()} (2: AVX-512 VNNI, 1: AVX2)")
    torch.manual_seed(0)
    layers = [
        QuantizedLinear(
            pack_q4(
                torch.randint(0, 16, (N, K), dtype=torch.uint8).numpy(),
                (torch.rand(N, K // 32) * 0.01).half().numpy(),
                (-torch.rand(N, K // 32) * 0.1).half().numpy(),
                "Q4_1",
            )
        )
        for _ in range(MATRICES)
    ]
    # activations in the dtype the engine runs here (bf16 where the CPU has bf16 dot products,
    # else fp32); the bf16 copy only where the engine can keep one (oneDNN packs bf16)
    dtype = resolve_dtype("auto", torch.device("cpu"))
    copies = (
        [PackedLinear(layer.dense(torch.bfloat16)) for layer in layers]
        if packable(torch.bfloat16)
        else None
    )
    print(f"activations {dtype}")
    print(f"{'rows':>4} {'q4 kernel':>10} {'bf16 copy':>10} {'dequantize':>11}  (us per matrix)")
    for rows in (1, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512):
        x = torch.randn(rows, K, dtype=dtype)
        paths = {
            "kernel": lambda x=x: [layer.multiply(x) for layer in layers],
            "copy": lambda x=x: [c(x.bfloat16()) for c in copies],
            "dequantize": lambda x=x: [F.linear(x, layer.dense(x.dtype)) for layer in layers],
        }
        if copies is None:
            del paths["copy"]
        us = {}
        for name, run in paths.items():
            run()
            us[name] = timeit.timeit(run, number=args.rounds) / args.rounds / MATRICES * 1e6
        copy = f"{us['copy']:>10.0f}" if "copy" in us else f"{'-':>10}"
        print(f"{rows:>4} {us['kernel']:>10.0f} {copy} {us['dequantize']:>11.0f}")


if __name__ == "__main__":
    main()
