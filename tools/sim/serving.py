"""What a simulated host's ``python -m sglang.bench_serving`` measures: one benchmark run against the running
server, in the result format SGLang's ``bench_serving`` writes (``--output-file F``: one JSON line a run).

The number comes from the same measurement as ``gpu-bench``'s ``METRIC=VALUE UNIT`` (the scenario's base,
the effect of each factor now at its bad value, the run's noise); this module only spreads it over the
requests of the workload the client was given, so every key of the line moves with the server:

- the step time ``d`` (ms a decode step of one request): the measured value where the scenario's metric is
  a time (``verify 30ms``), ``1000 / value`` where it is a rate (``decode 89 tok/s``); where the metric is a
  time to first token (``ttft 1.9 s``) it is that time over the prefill's steps;
- a request of ``I`` prompt tokens and ``O`` output tokens: its first token after ``1 + ceil(I / 512)`` steps
  (a chunked prefill, 512 tokens a step), then ``O - 1`` steps, each request with its own jitter of the
  scenario's ``noise_pct``;
- at most ``--max-concurrency`` requests at once (all of them without it), the next starting when one ends;
  ``duration`` is when the last one ends, and the throughputs are the tokens over it.

The keys, their order and their meaning are those of ``benchmark()``'s ``result`` dict in
sgl-project/sglang ``python/sglang/bench_serving.py`` (commit 0033168, the version the test vectors in
``tests/vectors/engines/`` follow); the statistics as its ``calculate_metrics`` takes them (numpy's mean,
median, population std and linear percentile).
"""

from __future__ import annotations

import heapq
import json
import math
import random
import statistics
from typing import TYPE_CHECKING, Any

from ..host import parse_flags
from ..units import unit_family

if TYPE_CHECKING:
    from .scenario import Scenario

PROGRAM = "sglang.bench_serving"   # the name the host's client asks the GPU service under

PREFILL_CHUNK = 512   # prompt tokens a prefill step takes (SGLang's chunked prefill)
ITL_SAMPLES = 16      # inter-token gaps kept a request (the statistics of a long run converge well before)


def step_ms(metric: str, unit: str, value: float, input_len: int) -> float:
    """The decode step time, in ms, that the scenario's measured ``value`` stands for."""
    fam = unit_family(unit)
    if fam is None:
        raise ValueError(f"the scenario's unit `{unit}` is neither a time nor a rate")
    family, scale = fam
    if family == "time":
        ms = value * scale
        if "ttft" in metric.lower() or "first" in metric.lower():
            return ms / prefill_steps(input_len)
        return ms
    return 1000.0 / (value * scale)


def prefill_steps(input_len: int) -> int:
    return 1 + math.ceil(max(input_len, 0) / PREFILL_CHUNK)


def percentile(xs: list[float], p: float) -> float:
    """numpy's default (linear) percentile."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _stats(name: str, xs: list[float], which: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for w in which:
        if w == "mean":
            out[f"mean_{name}_ms"] = statistics.fmean(xs)
        elif w == "median":
            out[f"median_{name}_ms"] = statistics.median(xs)
        elif w == "std":
            out[f"std_{name}_ms"] = statistics.pstdev(xs)
        else:
            out[f"{w}_{name}_ms"] = percentile(xs, float(w[1:]))
    return out


def result(args: dict[str, Any], metric: str, unit: str, value: float, noise_pct: float,
           seed: str) -> tuple[dict[str, Any], float]:
    """The ``bench_serving`` result line of one run whose measured value (in the scenario's metric) is ``value``,
    and the largest inter-token gap (the table prints it; the line has no key for it)."""
    n = int(args.get("num_prompts") or 1000)
    random_ds = str(args.get("dataset_name") or "sharegpt").startswith("random")
    i_len = int(args.get("random_input_len") or 1024)
    o_len = int(args.get("random_output_len") or 1024) if random_ds else int(args.get("sharegpt_output_len") or 256)
    conc = int(args["max_concurrency"]) if args.get("max_concurrency") not in (None, True) else None
    slots = max(1, min(n, int(conc))) if conc else n
    d = step_ms(metric, unit, value, i_len)
    rng = random.Random(seed)
    jitter = noise_pct / 100.0
    ttfts, tpots, e2es, itls = [], [], [], []
    free = [0.0] * slots   # when each slot frees, in ms from the start
    end = 0.0
    for _ in range(n):
        start = heapq.heappop(free)
        di = d * max(0.2, 1 + rng.gauss(0, jitter))
        ttft = di * prefill_steps(i_len)
        e2e = ttft + di * max(o_len - 1, 0)
        ttfts.append(ttft)
        e2es.append(e2e)
        if o_len > 1:
            tpots.append((e2e - ttft) / (o_len - 1))
            itls += [di * max(0.2, 1 + rng.gauss(0, jitter)) for _ in range(min(o_len - 1, ITL_SAMPLES))]
        heapq.heappush(free, start + e2e)
        end = max(end, start + e2e)
    dur = end / 1000.0
    total_in, total_out = n * i_len, n * o_len
    rate = args.get("request_rate")
    out: dict[str, Any] = {
        "backend": args.get("backend") or "sglang", "dataset_name": args.get("dataset_name") or "sharegpt",
        "request_rate": float(rate) if rate is not None else math.inf, "max_concurrency": conc,
        "sharegpt_output_len": int(args["sharegpt_output_len"]) if args.get("sharegpt_output_len") else None, "random_input_len": i_len,
        "random_output_len": int(args.get("random_output_len") or 1024),
        "random_range_ratio": float(args.get("random_range_ratio") or 0.0),
        "duration": dur, "completed": n, "total_input_tokens": total_in, "total_output_tokens": total_out,
        "total_output_tokens_retokenized": total_out, "request_throughput": n / dur,
        "input_throughput": total_in / dur, "output_throughput": total_out / dur,
    }
    out.update(_stats("e2e_latency", e2es, ("mean", "median", "std", "p99")))
    out.update(_stats("ttft", ttfts, ("mean", "median", "std", "p99")))
    out.update(_stats("tpot", tpots or [0.0], ("mean", "median", "std", "p99")))
    out.update(_stats("itl", itls or [0.0], ("mean", "median", "std", "p95", "p99")))
    out["concurrency"] = sum(e2es) / 1000.0 / dur
    out["accept_length"] = None
    return out, max(itls or [0.0])


def reply(measured: dict[str, Any], argv: list[str], scenario: Scenario) -> dict[str, Any]:
    """The GPU service's answer to the host's ``bench_serving``: ``out`` is ``{"result": LINE, "max_itl_ms": X}``
    (the client prints the table and appends the line to its ``--output-file``), or the measurement's error.
    ``argv`` is the client's options as it parsed them (``--num-prompts 200 …``, defaults included)."""
    if measured.get("rc") != 0 or "value" not in measured:
        return {k: measured.get(k, "") for k in ("out", "err", "rc")}
    args: dict[str, Any] = {k.replace("-", "_"): v for k, v in parse_flags(argv, dashes=False).items()}
    spec = scenario.bench
    try:
        line, max_itl = result(args, spec.metric, spec.unit, float(measured["value"]), spec.noise_pct,
                               f"{scenario.name}:serving:{measured.get('run')}")
    except (ValueError, TypeError) as exc:
        return {"out": "", "err": f"bench_serving: {exc}\n", "rc": 1}
    return {"out": json.dumps({"result": line, "max_itl_ms": max_itl}), "err": "", "rc": 0}
