#!/usr/bin/env python3
"""A decode-like GPU step for a real host: 32 layers of small bf16 matmuls at batch 8,
timed for --seconds; prints `decode_step_ms=VALUE ms` (METRIC=VALUE UNIT).
Eager by default (launch-bound: the host's CPU launches 32 kernels a step); with --graph the
step is captured once in a CUDA graph and replayed, as serving engines run decode, so the step
is bound by the GPU and the CPU only launches the graph and waits.
``setup`` and ``step_ms`` let another benchmark (bench/nvml) time the same step in-process."""

from __future__ import annotations

import argparse
import time

import torch


def setup(graph: bool = False) -> dict:
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(32)]
    state: dict = {"x": x, "ws": ws, "graph": None}
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up on a side stream, as capture requires
            for _ in range(3):
                _layers(x, ws)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            state["out"] = _layers(x, ws)
        state["graph"] = g
    return state


def _layers(x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
    h = x
    for w in ws:
        h = h @ w
    return h


def step_ms(state: dict, seconds: float) -> float:
    """The mean time of one decode step over ``seconds`` of steps, in ms (each step waits for the GPU)."""
    x, ws, g = state["x"], state["ws"], state["graph"]
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if g is not None:
            g.replay()
        else:
            _layers(x, ws)
        torch.cuda.synchronize()
        steps += 1
    return (time.perf_counter() - t0) * 1000 / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--graph", action="store_true", help="replay the step as one CUDA graph (GPU-bound)")
    a = ap.parse_args()
    print(f"decode_step_ms={step_ms(setup(a.graph), a.seconds):.3f} ms")


if __name__ == "__main__":
    main()
