"""The denominator of the logged MFU (train/mfu): ``trainer.peak_flops`` if set, else on CPU
the fp32 matmul rate measured right now, on a GPU its datasheet peak for half precision
(:data:`GPU_PEAK_FLOPS`); 0 (no MFU) where none applies."""

from __future__ import annotations

import sys

#: Dense bf16/fp16 tensor-core peak FLOP/s by GPU name (datasheets, no sparsity): the MFU
#: denominator on a GPU when trainer.peak_flops is null. Matched as substrings, in order.
GPU_PEAK_FLOPS: list[tuple[str, float]] = [
    ("H200", 989.4e12), ("H100 PCIe", 756.0e12), ("H100", 989.4e12), ("H800", 989.4e12),
    ("GH200", 989.4e12), ("B200", 2250e12), ("A100", 312e12), ("A800", 312e12),
    ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("A10G", 70e12), ("A10", 125e12),
    ("RTX 4090", 165.2e12), ("RTX 3090", 71e12), ("V100", 125e12), ("T4", 65e12),
]


def device_peak_flops(name: str, precision: str) -> float | None:
    """The datasheet peak of GPU ``name`` for a half-precision run (``bf16-*`` / ``16-*``), or
    None (unknown GPU, or full precision: no single datasheet number applies)."""
    if not precision.startswith(("bf16", "16")):
        return None
    return next((peak for key, peak in GPU_PEAK_FLOPS if key in name), None)


def peak_flops_for(t: object) -> float:
    """The MFU denominator of trainer config ``t``: ``trainer.peak_flops`` if set, else the
    measured fp32 matmul rate on CPU or the datasheet number of the detected GPU (0 = no MFU)."""
    if t.peak_flops:
        return t.peak_flops
    if t.accelerator == "cpu":
        return measure_peak_flops()
    import torch

    if not torch.cuda.is_available():
        return 0.0
    peak = device_peak_flops(torch.cuda.get_device_name(), t.precision)
    if peak is None:
        print(f"warning: no train/mfu: peak FLOP/s of {torch.cuda.get_device_name()} at "
              f"trainer.precision={t.precision} unknown; set trainer.peak_flops", file=sys.stderr)
    return peak or 0.0


def measure_peak_flops(n: int = 1024, reps: int = 3) -> float:
    """The fp32 matmul rate of this CPU right now (best of a few n×n products): the
    denominator of the logged MFU on CPU, where no datasheet number applies."""
    import time

    import torch

    g = torch.Generator().manual_seed(0)  # never draw from the global RNG (init, dropout)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best
