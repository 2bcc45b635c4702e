"""``python -m sglang.bench_serving`` on a simulated host: the options of SGLang's benchmark client, its
``Serving Benchmark Result`` table on stdout, and its result line appended to ``--output-file`` (JSONL).

The run itself is asked of the host's GPU service (the protocol of ``client.py``: program, then arguments),
which measures the running server as it measures ``gpu-bench`` and answers the result line; nothing in this
file knows what the host's numbers are.
"""

import argparse
import json
import os
import socket
import sys
from datetime import datetime

SERVICE = "/run/nvidia-gpu/service.sock"
PROGRAM = "sglang.bench_serving"


def service() -> str:
    """The host's GPU service, under the root the interpreter lives under (the host's ``/``)."""
    d = os.path.dirname(os.path.abspath(sys.executable))
    while True:
        p = os.path.join(d, SERVICE.lstrip("/"))
        if os.path.exists(p) or d == os.path.dirname(d):
            return p
        d = os.path.dirname(d)


def options() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    ap.add_argument("--backend", type=str, default="sglang",
                    choices=["sglang", "sglang-native", "sglang-oai", "sglang-oai-chat", "vllm", "vllm-chat",
                             "lmdeploy", "lmdeploy-chat", "trt", "gserver", "truss"])
    ap.add_argument("--base-url", type=str, default=None)
    ap.add_argument("--host", type=str, default="0.0.0.0")
    ap.add_argument("--port", type=int)
    ap.add_argument("--dataset-name", type=str, default="sharegpt",
                    choices=["sharegpt", "random", "random-ids", "generated-shared-prefix", "mmmu", "burstgpt"])
    ap.add_argument("--dataset-path", type=str, default="")
    ap.add_argument("--model", type=str)
    ap.add_argument("--tokenizer", type=str)
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--sharegpt-output-len", type=int, default=None)
    ap.add_argument("--sharegpt-context-len", type=int, default=None)
    ap.add_argument("--random-input-len", type=int, default=1024)
    ap.add_argument("--random-output-len", type=int, default=1024)
    ap.add_argument("--random-range-ratio", type=float, default=0.0)
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--output-file", type=str)
    ap.add_argument("--output-details", action="store_true")
    ap.add_argument("--disable-tqdm", action="store_true")
    ap.add_argument("--disable-stream", action="store_true")
    ap.add_argument("--return-logprob", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--disable-ignore-eos", action="store_true")
    ap.add_argument("--extra-request-body", type=str)
    ap.add_argument("--apply-chat-template", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--lora-name", type=str, nargs="*", default=None)
    ap.add_argument("--prompt-suffix", type=str, default="")
    ap.add_argument("--pd-separated", action="store_true")
    ap.add_argument("--flush-cache", action="store_true")
    ap.add_argument("--warmup-requests", type=int, default=1)
    ap.add_argument("--tokenize-prompt", action="store_true")
    return ap


def readn(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def ask(args: argparse.Namespace) -> tuple[int, str, str]:
    """The GPU service's run of this workload: (exit code, stdout, stderr)."""
    argv = []
    for k, v in vars(args).items():
        if v is None or v is False or isinstance(v, list):
            continue
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    payload = b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in [PROGRAM, *argv])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(service())
        s.sendall(len(payload).to_bytes(4, "big") + payload)
        rc = int.from_bytes(readn(s, 4), "big", signed=True)
        out = readn(s, int.from_bytes(readn(s, 4), "big")).decode()
        err = readn(s, int.from_bytes(readn(s, 4), "big")).decode()
    except (OSError, EOFError) as exc:
        return 1, "", f"Failed to fetch model from http://{args.host}:{args.port}/v1/models. Error: {exc}\n"
    finally:
        s.close()
    return rc, out, err


def table(args: argparse.Namespace, r: dict, max_itl: float) -> None:
    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<40} {:<10}".format("Backend:", args.backend))
    print("{:<40} {:<10}".format("Traffic request rate:", args.request_rate))
    print("{:<40} {:<10}".format("Max request concurrency:", args.max_concurrency if args.max_concurrency else "not set"))
    print("{:<40} {:<10}".format("Successful requests:", r["completed"]))
    print("{:<40} {:<10.2f}".format("Benchmark duration (s):", r["duration"]))
    print("{:<40} {:<10}".format("Total input tokens:", r["total_input_tokens"]))
    print("{:<40} {:<10}".format("Total generated tokens:", r["total_output_tokens"]))
    print("{:<40} {:<10}".format("Total generated tokens (retokenized):", r["total_output_tokens_retokenized"]))
    for label, key in (("Request throughput (req/s):", "request_throughput"),
                       ("Input token throughput (tok/s):", "input_throughput"),
                       ("Output token throughput (tok/s):", "output_throughput")):
        print(f"{label:<40} {r[key]:<10.2f}")
    print("{:<40} {:<10.2f}".format("Total token throughput (tok/s):", r["input_throughput"] + r["output_throughput"]))
    print("{:<40} {:<10.2f}".format("Concurrency:", r["concurrency"]))
    sections = (("End-to-End Latency", (("Mean E2E Latency (ms):", "mean_e2e_latency_ms"),
                                        ("Median E2E Latency (ms):", "median_e2e_latency_ms"))),
                ("Time to First Token", (("Mean TTFT (ms):", "mean_ttft_ms"), ("Median TTFT (ms):", "median_ttft_ms"),
                                         ("P99 TTFT (ms):", "p99_ttft_ms"))),
                ("Inter-Token Latency", (("Mean ITL (ms):", "mean_itl_ms"), ("Median ITL (ms):", "median_itl_ms"),
                                         ("P95 ITL (ms):", "p95_itl_ms"), ("P99 ITL (ms):", "p99_itl_ms"))))
    for title, rows in sections:
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        for label, key in rows:
            print(f"{label:<40} {r[key]:<10.2f}")
    print("{:<40} {:<10.2f}".format("Max ITL (ms):", max_itl))
    print("=" * 50)


def main() -> int:
    args = options().parse_args()
    print(f"benchmark_args={args}", flush=True)
    rc, out, err = ask(args)
    if rc != 0:
        sys.stdout.write(out)
        sys.stderr.write(err)
        return rc
    answer = json.loads(out)
    r = answer["result"]
    print(f"#Input tokens: {r['total_input_tokens']}\n#Output tokens: {r['total_output_tokens']}")
    print(f"Starting warmup with {args.warmup_requests} sequences...")
    print(f"Warmup completed with {args.warmup_requests} sequences. Starting main benchmark run...")
    table(args, r, answer["max_itl_ms"])
    name = args.output_file
    if not name:
        now = datetime.now().strftime("%m%d")
        name = (f"{args.backend}_{now}_{args.num_prompts}_{args.random_input_len}_{args.random_output_len}.jsonl"
                if args.dataset_name.startswith("random") else f"{args.backend}_{now}_{args.num_prompts}_sharegpt.jsonl")
    with open(name, "a") as f:
        f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
