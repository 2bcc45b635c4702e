#!/usr/bin/env python3
"""A decode-like GPU step for a real host: 32 layers of small bf16 matmuls at batch 8,
timed eagerly for --seconds; prints `decode_step_ms=VALUE ms` (METRIC=VALUE UNIT).
``setup`` and ``step_ms`` let another benchmark (bench/nvml) time the same step in-process."""

from __future__ import annotations

import argparse
import time

import torch


def setup() -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    return x, [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(32)]


def step_ms(state: tuple[torch.Tensor, list[torch.Tensor]], seconds: float) -> float:
    """The mean time of one decode step over ``seconds`` of steps, in ms."""
    x, ws = state
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        h = x
        for w in ws:
            h = h @ w
        torch.cuda.synchronize()
        steps += 1
    return (time.perf_counter() - t0) * 1000 / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    print(f"decode_step_ms={step_ms(setup(), a.seconds):.3f} ms")


if __name__ == "__main__":
    main()
