"""A corpus for measuring the redactor: real host outputs, realistic generated ones, and fake secrets.

Two kinds of document:

* clean: outputs a diagnosis reads (the real H200 captures in ``../shared/vectors`` and
  ``tests/vectors``, and generated process tables, environment dumps, ``pip list``,
  ``nvidia-smi`` and ``git log`` outputs full of flags and names that *look* like secrets:
  ``--max-num-batched-tokens``, ``TOKENIZERS_PARALLELISM``, ``--auth-required``, sha256 hashes);
  every redaction in them is a false positive;
* planted: the same kinds of output with fake secrets of realistic shapes (Hugging Face and
  OpenAI tokens, AWS keys, bearer headers, URLs with passwords, ``--api-key X``,
  ``API_KEY=…``); every secret with a trace left is a false negative.

``measure(redact_text_fn)`` runs a fresh redaction over each document and counts. The fake
secrets are generated from a fixed seed; none is real.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VECTOR_DIRS = [ROOT.parent / "shared" / "vectors", Path("/work/shared/vectors"), ROOT / "tests" / "vectors"]
MARK = "[REDACTED]"


@dataclass
class Doc:
    name: str
    text: str
    secrets: list[str] = field(default_factory=list)  # planted values that must leave no trace


# ---------------------------------------------------------------- fake secrets of real shapes
class Fakes:
    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)

    def _s(self, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def hf(self) -> str:
        return "hf_" + self._s(34)

    def openai(self) -> str:
        return "sk-proj-" + self._s(48, string.ascii_letters + string.digits + "_-")

    def openai_legacy(self) -> str:
        return "sk-" + self._s(48)

    def anthropic(self) -> str:
        return "sk-ant-api03-" + self._s(93, string.ascii_letters + string.digits + "_-") + "AA"

    def aws_id(self) -> str:
        return "AKIA" + self._s(16, string.ascii_uppercase + string.digits)

    def aws_secret(self) -> str:
        return self._s(40, string.ascii_letters + string.digits + "+/")

    def github(self) -> str:
        return "ghp_" + self._s(36)

    def hex40(self) -> str:
        return self._s(40, "0123456789abcdef")

    def password(self) -> str:
        return self._s(6, string.ascii_letters) + self._s(4, string.digits) + self.rng.choice("!%^*_") + self._s(5)

    def opaque(self) -> str:
        return self._s(32, string.ascii_letters + string.digits)

    def jwt(self) -> str:
        return "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJ" + self._s(40) + "." + self._s(43, string.ascii_letters + string.digits + "_-")


# ---------------------------------------------------------------- clean, realistic outputs
SERVER_LINES = [
    "/root/ml-env/bin/python3 -m sglang.launch_server --model-path moonshotai/Kimi-K2.5 --tp 8 --speculative-algorithm "
    "EAGLE3 --speculative-num-steps 2 --speculative-eagle-topk 4 --speculative-num-draft-tokens 4 "
    "--speculative-attention-mode prefill --max-running-requests 64 --chunked-prefill-size 8192 --port 30000",
    "/opt/venv/bin/python3 /opt/venv/bin/vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-batched-tokens 8192 "
    "--max-model-len 32768 --tokenizer-mode auto --kv-cache-dtype fp8 --enable-prefix-caching --gpu-memory-utilization 0.9 "
    "--max-num-seqs 256 --tensor-parallel-size 2 --disable-log-requests --port 8000",
    "python3 -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-72B-Instruct --tokenizer Qwen/Qwen2.5-72B-Instruct "
    "--max-seq-len-to-capture 8192 --num-scheduler-steps 8 --enforce-eager --served-model-name qwen --api-key-file "
    "/etc/vllm/keyfile --ssl-keyfile /etc/ssl/private/server.key --ssl-certfile /etc/ssl/certs/server.pem",
    "/usr/bin/python3 -m sglang.launch_server --model deepseek-ai/DeepSeek-V3 --tp 8 --enable-dp-attention --dp 8 "
    "--attention-backend fa3 --cuda-graph-max-bs 128 --disable-cuda-graph-padding --enable-torch-compile "
    "--torch-compile-max-bs 8 --mem-fraction-static 0.85 --max-prefill-tokens 16384 --auth-required --enable-auth",
    "trtllm-serve /models/llama-70b --backend pytorch --max_batch_size 64 --max_num_tokens 8192 --kv_cache_free_gpu_memory_fraction 0.9 "
    "--tp_size 4 --host 0.0.0.0 --port 8000",
    "tritonserver --model-repository=/models --http-port=8000 --grpc-port=8001 --metrics-port=8002 --log-verbose=0",
    "/usr/sbin/sshd -D -o AuthorizedKeysFile=.ssh/authorized_keys -o PubkeyAuthentication=yes -o PasswordAuthentication=no",
    "/usr/bin/containerd-shim-runc-v2 -namespace moby -id 9f1c0b4d6e8a2f3b7c5d1e9a0b2c4d6e8f0a1b3c5d7e9f1a3b5c7d9e1f3a5b7c "
    "-address /run/containerd/containerd.sock",
    "ray::WorkerDict.actor_fn --object-store-name=/tmp/ray/session_2026-11-30_10-11-12_123456_789/sockets/plasma_store "
    "--raylet-name=/tmp/ray/session_latest/sockets/raylet --node-manager-port=40123",
    "/usr/lib/systemd/systemd-logind",
    "nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose",
    "gpg-agent --homedir /root/.gnupg --use-standard-socket --daemon",
    "ssh-agent -s",
    "/root/ml-env/bin/python3 bench_serving.py --backend sglang --dataset-name random --random-input-len 1024 "
    "--random-output-len 256 --num-prompts 200 --request-rate 8 --max-concurrency 32 --tokenize-prompt",
    "torchrun --nproc_per_node 8 --master_addr 127.0.0.1 --master_port 29500 train.py --max-tokens 4096 "
    "--keyframe-interval 4 --key-dim 128 --hash-seed 0",
    "/root/ml-env/bin/python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7) "
    "--multiprocessing-fork",
]

ENV_LINES = [
    "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", "NCCL_DEBUG=INFO", "NCCL_IB_DISABLE=0", "NCCL_P2P_LEVEL=NVL",
    "NCCL_SOCKET_IFNAME=eth0", "NCCL_NVLS_ENABLE=0", "NCCL_CUMEM_ENABLE=0", "TORCH_CUDA_ARCH_LIST=9.0",
    "TOKENIZERS_PARALLELISM=false", "VLLM_MAX_TOKENS_PER_EXPERT=8192", "VLLM_ATTENTION_BACKEND=FLASHINFER",
    "VLLM_USE_V1=1", "VLLM_WORKER_MULTIPROC_METHOD=spawn", "SGLANG_ENABLE_TORCH_COMPILE=1",
    "SGL_ENABLE_JIT_DEEPGEMM=1", "HF_HOME=/root/.cache/huggingface", "HF_HUB_ENABLE_HF_TRANSFER=1",
    "HF_HUB_OFFLINE=1", "HUGGINGFACE_HUB_CACHE=/root/.cache/huggingface/hub", "TRANSFORMERS_CACHE=/root/.cache/huggingface",
    "HF_TOKEN_PATH=/root/.cache/huggingface/token", "SSH_AUTH_SOCK=/tmp/ssh-XXXXabcd/agent.1234",
    "GPG_AGENT_INFO=/run/user/0/gnupg/S.gpg-agent:0:1", "KEYTIMEOUT=1", "PYTHONHASHSEED=0",
    "AWS_DEFAULT_REGION=us-east-1", "AWS_PROFILE=inference", "AWS_SHARED_CREDENTIALS_FILE=/root/.aws/credentials",
    "GOOGLE_APPLICATION_CREDENTIALS=/var/run/secrets/gcp/key.json", "KUBERNETES_SERVICE_HOST=10.96.0.1",
    "KUBERNETES_SERVICE_PORT_HTTPS=443", "MAX_JOBS=16", "OMP_NUM_THREADS=8", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64", "PATH=/root/ml-env/bin:/usr/local/sbin:/usr/local/bin:/usr/bin",
    "CUDA_LAUNCH_BLOCKING=0", "CUDA_DEVICE_MAX_CONNECTIONS=1", "TORCHINDUCTOR_CACHE_DIR=/root/.cache/inductor",
    "TRITON_CACHE_DIR=/root/.triton/cache", "MODEL_ID=meta-llama/Llama-3.1-8B-Instruct", "MAX_INPUT_TOKENS=4096",
    "MAX_TOTAL_TOKENS=8192", "MAX_BATCH_PREFILL_TOKENS=16384", "NUM_SHARD=8", "PORT=8000", "HOSTNAME=gpu-node-3",
    "KEY_PATH=/etc/ssl/private/server.key", "TLS_KEY_FILE=/etc/ssl/private/tls.key", "AUTH_METHOD=oidc",
    "AUTH_REQUIRED=true", "SECRET_NAME=prod/inference", "TOKEN_COUNT=128", "API_KEY_HEADER_NAME=X-API-Key",
    "HOME=/root", "LANG=C.UTF-8", "SHELL=/bin/bash", "TERM=xterm-256color", "USER=root",
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "NVIDIA_VISIBLE_DEVICES=all", "NV_LIBCUBLAS_VERSION=12.8.4.1-1",
    "CUDA_VERSION=12.8.1", "PIP_INDEX_URL=https://pypi.org/simple", "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128",
    "WANDB_MODE=disabled", "RAY_ADDRESS=127.0.0.1:6379", "MASTER_ADDR=10.1.230.174", "MASTER_PORT=29500",
]

PIP_NAMES = [("keyring", "25.5.0"), ("tokenizers", "0.21.1"), ("sentencepiece", "0.2.0"), ("python-jose", "3.3.0"),
             ("pycryptodome", "3.21.0"), ("cryptography", "44.0.2"), ("oauthlib", "3.2.2"), ("google-auth", "2.38.0"),
             ("authlib", "1.4.1"), ("tiktoken", "0.9.0"), ("hf-transfer", "0.1.9"), ("hf_xet", "1.1.2"),
             ("secretstorage", "3.3.3"), ("pyjwt", "2.10.1"), ("passlib", "1.7.4"), ("bcrypt", "4.3.0"),
             ("torch", "2.9.1+cu130"), ("flashinfer-python", "0.5.3"), ("sgl-kernel", "0.3.21"), ("vllm", "0.11.2"),
             ("triton", "3.5.1"), ("nvidia-nccl-cu12", "2.27.5"), ("transformers", "4.57.1"), ("xgrammar", "0.1.27")]

GIT_SUBJECTS = [
    "Fix token counting for speculative decoding", "Add --api-key support to the OpenAI server",
    "Rename max_num_batched_tokens to max_num_tokens", "Bump flashinfer to 0.5.3", "Validate LoRA requests",
    "[Perf] Skip the tokenizer on the hot path", "Revert \"Use the fused MoE kernel for FP8\"",
    "Support auth tokens for private models (#1234)", "Key the radix cache by (token ids, lora id)",
    "Remove the secret sauce comment", "Improve CI for diffusion models", "Use bearer auth in the router",
]


def _ps(rng: random.Random, lines: list[str]) -> str:
    out = ["    PID    PPID STARTED                  COMMAND"]
    pid = 1
    for ln in lines:
        pid += rng.randint(3, 900)
        out.append(f"{pid:>7} {rng.randint(1, pid):>7} Mon Nov 30 10:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} 2026 {ln}")
    return "\n".join(out) + "\n"


def _pip(rng: random.Random) -> str:
    out = ["Package                  Version", "------------------------ -----------"]
    out += [f"{n:<24} {v}" for n, v in PIP_NAMES]
    out.append("")
    out.append("Name: torch\nVersion: 2.9.1+cu130\nSummary: Tensors and Dynamic neural networks in Python with strong GPU acceleration\n"
               "Home-page: https://pytorch.org/\nAuthor: PyTorch Team\nAuthor-email: packages@pytorch.org\nLicense: BSD-3-Clause\n"
               "Location: /root/ml-env/lib/python3.11/site-packages\nRequires: filelock, fsspec, jinja2, networkx, sympy, triton\n")
    return "\n".join(out)


def _git_log(rng: random.Random) -> str:
    out = []
    for i, s in enumerate(GIT_SUBJECTS):
        sha = "".join(rng.choice("0123456789abcdef") for _ in range(40))
        out.append(f"commit {sha}\nAuthor: Dev {i} <dev{i}@example.com>\nDate:   Sun Nov 29 0{i % 10}:00:00 2026 +0000\n\n    {s}\n\n"
                   f"    Signed-off-by: Dev {i} <dev{i}@example.com>\n")
    out.append(f"{''.join(rng.choice('0123456789abcdef') for _ in range(7))} HEAD@{{0}}: pull origin main: Fast-forward")
    out.append("3207427 HEAD@{1}: clone: from https://github.com/sgl-project/sglang.git")
    return "\n".join(out) + "\n"


def _nvsmi_apps(rng: random.Random) -> str:
    return "\n".join(f"GPU-{rng.getrandbits(32):08x}-bfc3-9e86-112e-e6cf153df3fe, {rng.randint(1000, 90000)}, "
                     f"/root/ml-env/bin/python3, {rng.randint(1000, 120000)}" for _ in range(8)) + "\n"


def _sofiles(rng: random.Random) -> str:
    return "\n".join(f"{rng.randint(10**5, 10**9):>11} {rng.getrandbits(64):016x}  torch/lib/lib{n}.so" for n in
                     ("torch_cuda", "torch_cpu", "c10", "c10_cuda", "torch_python", "shm", "caffe2_nvrtc")) + "\n"


def _json_facts() -> str:
    return ('{"server": {"argv": ["--max-num-batched-tokens", "8192", "--speculative-num-draft-tokens", "4"], '
            '"env": {"TOKENIZERS_PARALLELISM": "false", "KEY_PATH": "/etc/ssl/private/server.key"}}, '
            '"max_tokens": 256, "token_count": 128, "key_id": "gpu-node-3", "hash": '
            '"afa6ae1067b9ab68", "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}\n')


def clean_docs() -> list[Doc]:
    """Real captures and generated outputs that hold no secret."""
    docs = []
    seen: set[Path] = set()
    for d in VECTOR_DIRS:
        if not d.is_dir():
            continue
        for p in sorted(d.rglob("*")):
            if p.is_file() and p.suffix in (".txt", ".csv", ".json", ".md", "") and p.resolve() not in seen:
                seen.add(p.resolve())
                docs.append(Doc(f"vectors:{p.name}", p.read_text(errors="replace")))
    rng = random.Random(3)
    docs += [
        Doc("ps", _ps(rng, SERVER_LINES)),
        Doc("environ", "\n".join(ENV_LINES) + "\n"),
        Doc("environ+", "\n".join("+" + e for e in ENV_LINES) + "\n"),
        Doc("export", "\n".join("export " + e for e in ENV_LINES) + "\n"),
        Doc("pip", _pip(rng)),
        Doc("git-log", _git_log(rng)),
        Doc("nvsmi-apps", _nvsmi_apps(rng)),
        Doc("sofiles", _sofiles(rng)),
        Doc("facts-json", _json_facts()),
        Doc("bench", "[bench] warmup 3 iters, measure 10 iters\nthroughput=4839.2 tok/s\nverify=20.4 ms\n"
                     "Total token throughput (tok/s): 5120.33\nOutput token throughput (tok/s): 2101.7\n"
                     "Mean TPOT (ms): 11.2\nP99 ITL (ms): 31.9\n"),
        Doc("curl", "curl -s -X POST http://127.0.0.1:30000/generate -H 'Content-Type: application/json' "
                    "-d '{\"text\": \"hi\", \"sampling_params\": {\"max_new_tokens\": 64}}'\n"),
    ]
    return docs


# ---------------------------------------------------------------- the same, with planted secrets
def planted_docs(seed: int = 7) -> list[Doc]:
    """Realistic outputs each holding fake secrets; every one must be hidden."""
    f = Fakes(seed)
    docs: list[Doc] = []

    def add(name: str, text: str, *secrets: str) -> None:
        docs.append(Doc(name, text, list(secrets)))

    rng = random.Random(seed)
    for i in range(3):   # each shape a few times, with fresh values
        hf, oa, oal, ant, aid, asec, gh, pw, opq, jwt = (f.hf(), f.openai(), f.openai_legacy(), f.anthropic(), f.aws_id(),
                                                         f.aws_secret(), f.github(), f.password(), f.opaque(), f.jwt())
        wandb = f.hex40()
        add(f"env-{i}", "\n".join([*ENV_LINES[:10], f"HF_TOKEN={hf}", f"OPENAI_API_KEY={oa}", f"AWS_ACCESS_KEY_ID={aid}",
                                   f"AWS_SECRET_ACCESS_KEY={asec}", f"WANDB_API_KEY={wandb}", f"API_KEY={opq}",
                                   f"ANTHROPIC_API_KEY={ant}", f"GITHUB_TOKEN={gh}", *ENV_LINES[10:20]]) + "\n",
            hf, oa, aid, asec, wandb, opq, ant, gh)
        add(f"environ+-{i}", "\n".join(["+CUDA_VISIBLE_DEVICES=0", f"+HUGGING_FACE_HUB_TOKEN={hf}",
                                        f"+DATABASE_URL=postgresql://infer:{pw}@db.internal:5432/metrics",
                                        f"+REDIS_URL=redis://:{opq}@cache.internal:6379/0", "+NCCL_DEBUG=WARN"]) + "\n",
            hf, pw, opq)
        add(f"ps-api-key-{i}", _ps(rng, [SERVER_LINES[1] + f" --api-key {opq}", SERVER_LINES[0] + f" --api-key={oal}",
                                         SERVER_LINES[3] + f" --admin-api-key {pw}",
                                         f"/root/ml-env/bin/python3 -m sglang_router.launch_router --api-key {ant} --port 30001",
                                         SERVER_LINES[2] + f" --hf-token {hf}"]), opq, oal, pw, ant, hf)
        add(f"curl-bearer-{i}", f"curl -sS https://api.openai.com/v1/models -H \"Authorization: Bearer {oa}\"\n"
                                f"curl -H 'x-api-key: {ant}' https://api.anthropic.com/v1/messages\n"
                                f"wget --header='Authorization: Bearer {jwt}' http://10.0.0.5:8000/v1/completions\n",
            oa, ant, jwt)
        add(f"urls-{i}", f"PIP_INDEX_URL=https://deploy:{pw}@pypi.internal.example.com/simple\n"
                         f"git remote -v\norigin\thttps://oauth2:{gh}@github.com/org/sglang.git (fetch)\n"
                         f"3207427 HEAD@{{3}}: clone: from https://dev:{opq}@gitlab.example.com/ml/sglang.git\n"
                         f"--llm https://user:{pw}X@llm.internal:8443/v1\n", pw, gh, opq, pw + "X")
        facts = {"server": {"env": {"HF_TOKEN": hf, "OPENAI_API_KEY": oa}, "argv": ["--api-key", opq]},
                 "aws": {"aws_access_key_id": aid, "aws_secret_access_key": asec}}
        add(f"json-{i}", json.dumps(facts) + "\n",
            hf, oa, opq, aid, asec)
        add(f"free-{i}", f"export HF_TOKEN={hf}\nhuggingface-cli login --token {hf}\n"
                         f"the key {aid} was rotated; token {gh} too\n"
                         f"python serve.py --model m --api-key \"{opq}\" --port 8000\n", hf, aid, gh, opq)
    return docs


# ---------------------------------------------------------------- measuring
@dataclass
class Score:
    secrets: int = 0
    hidden: int = 0
    false_positives: int = 0
    misses: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)   # lines changed that held no secret
    docs: int = 0
    chars: int = 0

    @property
    def precision(self) -> float:
        return self.hidden / (self.hidden + self.false_positives) if self.hidden + self.false_positives else 1.0

    @property
    def recall(self) -> float:
        return self.hidden / self.secrets if self.secrets else 1.0


def trace_left(secret: str, text: str, window: int = 10) -> bool:
    """Whether any ``window`` characters of ``secret`` (past a well-known prefix) are still in ``text``."""
    body = secret
    for prefix in ("sk-ant-api03-", "sk-proj-", "sk-", "hf_", "ghp_", "AKIA", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJ"):
        if body.startswith(prefix):
            body = body[len(prefix):]
            break
    return any(body[i:i + window] in text for i in range(0, max(1, len(body) - window + 1)))


def measure(make: Callable[[], Callable[[str], str]], docs: list[Doc]) -> Score:
    """Redact each document with a fresh redactor (``make()`` returns its text function) and count."""
    s = Score()
    for d in docs:
        out = make()(d.text)
        s.docs += 1
        s.chars += len(d.text)
        for secret in d.secrets:
            s.secrets += 1
            if trace_left(secret, out):
                s.misses.append(f"{d.name}: {secret[:14]}…")
            else:
                s.hidden += 1
        text = d.text   # a secret over several lines (a PEM block) is hidden as one mark
        multi = sorted((x for x in d.secrets if "\n" in x), key=len, reverse=True)
        for secret in multi:
            text = text.replace(secret, MARK)
        before, after = text.split("\n"), out.split("\n")
        if len(before) != len(after):
            s.false_positives += 1
            s.wrong.append(f"{d.name}: the line count changed")
            continue
        for a, b in zip(before, after, strict=True):
            if a == b:
                continue
            held = sum(a.count(x) for x in d.secrets)
            extra = b.count(MARK) - a.count(MARK) - held
            if extra > 0 or (not held and not (multi and MARK in a) and a != b):
                s.false_positives += max(extra, 1)
                s.wrong.append(f"{d.name}: {a[:160]!r} -> {b[:160]!r}")
    return s


# ---------------------------------------------------------------- held out: written after the fixes above
def heldout_docs(seed: int = 11) -> list[Doc]:
    """More shapes, written after the redactor was fixed on the two sets above (so they measure it fresh)."""
    f = Fakes(seed)
    r = random.Random(seed)
    docs: list[Doc] = []
    for i in range(3):
        pw, opq, hexk, oa = f.password(), f.opaque(), f._s(32, "0123456789abcdef"), f.openai()[:40]
        nv = "nvapi-" + f._s(64, string.ascii_letters + string.digits + "_-")
        r8, gsk = "r8_" + f._s(37), "gsk_" + f._s(52)
        slack = "https://hooks.slack.com/services/T" + f._s(8, string.ascii_uppercase + string.digits) + "/B" + \
            f._s(10, string.ascii_uppercase + string.digits) + "/" + f._s(24)
        sentry = f._s(32, "0123456789abcdef")
        docs.append(Doc(f"h-env-{i}", "\n".join([
            f"NGC_API_KEY={nv}", f"AZURE_OPENAI_API_KEY={hexk}", f"REPLICATE_API_TOKEN={r8}", f"GROQ_API_KEY={gsk}",
            f"PGPASSWORD={pw}", f"SENTRY_DSN=https://{sentry}@o{r.randint(10**5, 10**6)}.ingest.sentry.io/{r.randint(10**5, 10**6)}",
            f"SLACK_WEBHOOK={slack}", f"MONGO_URL=mongodb+srv://svc:{pw}@cluster0.abcd.mongodb.net/db",
            f"HF_API_TOKEN={opq}", "TOKENIZER_PATH=/models/tokenizer", "PASSWORD_FILE=/run/secrets/db_password",
            "TOKEN_BUCKET_RATE=100", "VLLM_KEY_CACHE_DTYPE=fp8", "NCCL_ALGO=Ring", "HF_HUB_DISABLE_TELEMETRY=1"]) + "\n",
            [nv, hexk, r8, gsk, pw, sentry, slack.rsplit("/", 1)[1], opq]))
        docs.append(Doc(f"h-argv-{i}", _ps(r, [
            f"/opt/venv/bin/vllm serve m --hf_token {opq} --max-tokens-per-batch 4096 --tokenizer-pool-size 4",
            f"docker login -u svc --password={pw} nvcr.io",
            f"mysql -h db -u root -p{pw} metrics",
            f"python3 client.py --openai-api-key {oa} --keep-alive 5 --trust-remote-code",
            "python3 -m sglang.launch_server --auth-token-file /run/secrets/token --key-cache-dtype fp8 --token-budget 8192",
        ]), [opq, pw, oa]))
        docs.append(Doc(f"h-log-{i}", "INFO Using tokenizer from /models/tokenizer\nWARNING Authorization header missing; "
                                      "the request was refused\nINFO token budget 8192, key cache fp8\n"
                                      '{"api_key": null, "credentials": null, "max_tokens": 512}\n'
                                      f"curl -b 'session={opq}' http://127.0.0.1:8000/metrics\n"
                                      f"Cookie: sessionid={hexk}\n", [opq, hexk]))
    return docs


# ---------------------------------------------------------------- the audit's kinds (issues 29 and 30), secret and readable
def _sa_json(f: Fakes) -> str:
    """A Google service-account key file (fake), as JSON."""
    key = "\n".join(f._s(64, string.ascii_letters + string.digits + "+/") for _ in range(6))
    return json.dumps({"type": "service_account", "project_id": "infer-prod-" + f._s(6, string.digits),
                       "private_key_id": f.hex40(), "private_key": f"-----BEGIN PRIVATE KEY-----\n{key}\n-----END PRIVATE KEY-----\n",
                       "client_email": "svc@infer-prod.iam.gserviceaccount.com", "client_id": f._s(21, string.digits),
                       "token_uri": "https://oauth2.googleapis.com/token"})


def _b64(text: str, wrap: int = 0) -> str:
    import base64
    b = base64.b64encode(text.encode()).decode()
    return "\n".join(b[i:i + wrap] for i in range(0, len(b), wrap)) if wrap else b


def _pem(f: Fakes, kind: str = "RSA PRIVATE KEY") -> str:
    body = "\n".join(f._s(64, string.ascii_letters + string.digits + "+/") for _ in range(5))
    return f"-----BEGIN {kind}-----\n{body}\n{f._s(24)}==\n-----END {kind}-----"


# what the audit found over-redacted: each line must come back exactly as it went in
AUDIT_READABLE = [
    "/root/ml-env/bin/python3 -m sglang.launch_server --model m --speculative-token-tree 1,2,2,1 --attention-key-scale 0.125 "
    "--speculative-num-draft-tokens 4 --num-draft-tokens 4 --sig-figs 3 --salt-rounds 12 --port 30000",
    "MAX_SESSION_TOKENS=8192",
    "error: cannot read the key /etc/passwd: permission denied",
    "error: cannot read the key /etc/passwd: [Errno 13] Permission denied: '/etc/passwd'",
    "playbook `broken-key.yaml:12`: mapping values are not allowed here",
    "broken-key.yaml:12:3: expected a mapping",
    "scenario broken-token.yml:7: unknown field `tokn`",
]


def audit_docs(seed: int = 29) -> list[Doc]:
    """Every kind of secret the audit of issues 29 and 30 saw leak, in the outputs it leaked from, beside the
    names and messages it saw over-redacted (which must stay exactly as they are)."""
    f = Fakes(seed)
    r = random.Random(seed)
    docs: list[Doc] = []
    for i in range(3):
        pw, pw2, opq, oa, hf, gh, aid = f.password(), f.password(), f.opaque(), f.openai(), f.hf(), f.github(), f.aws_id()
        slash_pw = f._s(5) + "/" + f._s(6) + "/" + f._s(3)
        at_pw = f._s(6) + "@" + f._s(6)
        pat = "github_pat_" + f._s(22) + "_" + f._s(59)
        azure = f._s(86, string.ascii_letters + string.digits + "+/") + "=="
        ya29 = "ya29.a0" + f._s(120, string.ascii_letters + string.digits + "_-")
        sa, sa_wrapped = _b64(_sa_json(f)), _b64(_sa_json(f), 76)
        jwt, pem, bench_key = f.jwt(), _pem(f), f.opaque()
        docs.append(Doc(f"a-environ-{i}", "\n".join([
            "+CUDA_VISIBLE_DEVICES=0,1", f"+PGPASSWORD={pw}", f"+MYSQL_PWD={pw2}", f"+REDIS_PASS={opq[:20]}",
            f"+MY_PASS={pw}X", "+MAX_SESSION_TOKENS=8192", f"+HF_TOKEN={hf}", f"+DATABASE_URL=postgresql://infer:{slash_pw}@db:5432/m",
            f"+AZURE_STORAGE_CONNECTION_STRING=DefaultEndpointsProtocol=https;AccountName=inferlogs;AccountKey={azure};"
            "EndpointSuffix=core.windows.net",
            f"+GOOGLE_OAUTH_ACCESS_TOKEN={ya29}", f"+GCP_SA_KEY={sa}", f"+GH={gh}", f"+GH_FINE={pat}",
            f"+AWS_ACCESS_KEY_ID={aid}", "+PWD=/root/sglang", "+NCCL_DEBUG=INFO"]) + "\n",
            [pw, pw2, opq[:20], pw + "X", hf, slash_pw, azure, ya29, sa, gh, pat, aid]))
        docs.append(Doc(f"a-ps-{i}", _ps(r, [
            AUDIT_READABLE[0] + f" --pass {pw2}",
            f"/root/ml-env/bin/python3 -m debugagent run --host gpu-3 --bench 'python3 bench_serving.py --backend sglang "
            f"--api-key {bench_key} --num-prompts 200' --symptom 'decode 69 tok/s'",
            f"/usr/bin/python3 client.py --openai-api-key {oa} --num-draft-tokens 4",
        ]), [pw2, bench_key, oa]))
        docs.append(Doc(f"a-reflog-{i}", "\n".join([
            f"{f.hex40()[:7]} HEAD@{{0}}: pull: Fast-forward",
            f"{f.hex40()[:7]} HEAD@{{1}}: pull: from https://deploy:{slash_pw}@git.internal.example.com/ml/sglang.git",
            f"{f.hex40()[:7]} HEAD@{{2}}: fetch: from https://ci:{at_pw}@gitlab.example.com/ml/sglang.git",
            f"{f.hex40()[:7]} HEAD@{{3}}: clone: from https://github.com/sgl-project/sglang.git",
            "url = https://registry.npmjs.org:443/@scope/pkg",
        ]) + "\n", [slash_pw, at_pw]))
        docs.append(Doc(f"a-messages-{i}", "\n".join([
            *AUDIT_READABLE[2:],
            f"wget --header='Authorization: Bearer {jwt}' http://10.0.0.5:8000/v1/models",
            f'{{"tls.key": "{_b64(pem)}"}}',
            pem,
            f'{{"private_key": {json.dumps(pem)}}}',
        ]) + "\n", [jwt, _b64(pem), pem, json.dumps(pem)[1:-1]]))
        docs.append(Doc(f"a-sa-wrapped-{i}", f"$ cat /run/secrets/gcp.b64\n{sa_wrapped}\n$ echo done\ndone\n", [sa_wrapped]))
    docs.append(Doc("a-readable", "\n".join(AUDIT_READABLE) + "\n"))
    return docs


# ---------------------------------------------------------------- new names and shapes, written for this corpus
OWN_READABLE = [
    # the shell's folders and helpers: named like secrets, none is one
    "PWD=/work/sglang", "OLDPWD=/root", "SSH_ASKPASS=/usr/libexec/openssh/gnome-ssh-askpass",
    "GIT_ASKPASS=/usr/lib/git-core/git-gui--askpass", "PASSWORD_STORE_DIR=/root/.password-store",
    "DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/0/bus", "XDG_SESSION_ID=3", "XDG_SESSION_TYPE=tty",
    "XDG_SESSION_CLASS=user", "SESSION_MANAGER=local/gpu-node-3:@/tmp/.ICE-unix/2211,unix/gpu-node-3:/tmp/.ICE-unix/2211",
    "XAUTHORITY=/root/.Xauthority", "GNOME_KEYRING_CONTROL=/run/user/0/keyring", "PIP_KEYRING_PROVIDER=subprocess",
    "COOKIE_MAX_AGE=3600", "TOKEN_BUCKET_CAPACITY=100", "AUTH_USER=svc-infer", "SECRET_ARN=arn:aws:secretsmanager:us-east-1:1:secret:x",
    "VLLM_KEY_CACHE_DTYPE=fp8", "MAX_KEY_LEN=64", "NUM_KEY_VALUE_HEADS=8", "SESSION_TIMEOUT=600",
    # flags a diagnosis reads
    "python3 -m sglang.launch_server --model m --eos-token '</s>' --pad-token '<|pad|>' --sort-key name --key-heads 8 "
    "--session-len 8192 --max-session-len 16384 --cookie-max-age 3600 --token-latency-ms 50 --auth-config /etc/infer/auth.yaml "
    "--compilation-config '{\"pass_config\": {\"enable_fusion\": true}}' --speculative-token-map /models/map.pt --port 8000",
    "vllm serve m --ssl-keyfile /etc/ssl/private/k.pem --api-key-file /etc/vllm/keyfile --return-tokens-as-token-ids",
    # messages and tracebacks
    "KeyError: 'model.layers.0.self_attn.k_proj.weight'",
    "InvalidToken: the signature has expired",
    '    token = os.environ["HF_TOKEN"]',
    "    key = self._make_key(args, kwds, typed)",
    '  File "/root/sglang/python/sglang/srt/managers/tokenizer_manager.py", line 512, in _handle_session',
    "unit tests: pass: 12, fail: 0, skip: 1",
    "tokenizer_config.json:3: missing `eos_token`",
]


def own_docs(seed: int = 31) -> list[Doc]:
    """Secret names and shapes neither the earlier sets nor the audit held, beside readable look-alikes."""
    f = Fakes(seed)
    docs: list[Doc] = []
    for i in range(3):
        pw, pw2, opq, opq2 = f.password(), f.password(), f.opaque(), f.opaque()
        vault = "hvs." + f._s(90, string.ascii_letters + string.digits + "_-")
        refresh = "1//0" + f._s(96, string.ascii_letters + string.digits + "_-")
        sig = f._s(43, string.ascii_letters + string.digits + "%")
        docker = _b64(json.dumps({"auths": {"nvcr.io": {"auth": _b64("$oauthtoken:" + opq)}}}))
        docs.append(Doc(f"o-env-{i}", "\n".join([
            f"RABBITMQ_DEFAULT_PASS={pw}", f"SMTP_PASS={pw2}", f"LDAP_BIND_PW={opq[:16]}", f"DB_PW={opq2[:12]}",
            f"POSTGRES_PASSWORD_PROD={pw}Z", f"MINIO_ROOT_PASSWORD={opq2}", f"VAULT_TOKEN={vault}",
            f"CONSUL_HTTP_TOKEN={opq[:8]}-{opq[8:12]}-{opq[12:16]}-{opq[16:28]}", f"NGROK_AUTHTOKEN={opq}Q",
            f"GOOGLE_REFRESH={refresh}", f"DOCKER_AUTH_CONFIG={{\"auths\":{{\"nvcr.io\":{{\"auth\":\"{_b64('u:' + pw2)}\"}}}}}}",
            *OWN_READABLE[:21]]) + "\n",
            [pw, pw2, opq[:16], opq2[:12], pw + "Z", opq2, vault, opq[16:28], opq + "Q", refresh, _b64("u:" + pw2)]))
        aid, asec, sas = f.aws_id(), f.aws_secret(), f"sv=2022-11-02&ss=b&srt=sco&sp=rl&sig={sig}"
        docs.append(Doc(f"o-files-{i}", "\n".join([
            "== ~/.aws/credentials", "[default]", f"aws_access_key_id = {aid}", f"aws_secret_access_key = {asec}",
            "region = us-east-1", "== ~/.netrc", f"machine pypi.internal login deploy password {pw}",
            "== odbc", f"Driver={{ODBC Driver 18 for SQL Server}};Server=tcp:db,1433;UID=sa;PWD={pw2};Encrypt=yes;",
            "== sas", f"BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature={sas}",
            "== k8s secret", "data:", f"  .dockerconfigjson: {docker}",
            "== pip.conf", "[global]", f"index-url = https://deploy:{opq2}@pypi.internal/simple",
        ]) + "\n", [aid, asec, pw, pw2, sas, docker, opq2]))
        docs.append(Doc(f"o-argv-{i}", "\n".join([
            f"redis-server --requirepass {pw} --port 6379", f"mongod --db-pass={pw2} --port 27017",
            f"python3 worker.py --redis-pass {opq[:14]} --smtp-password '{pw} x' --num-workers 4",
            f"curl -H 'X-Vault-Token: {vault}' https://vault:8200/v1/secret/data/infer",
            "/usr/bin/gnome-keyring-daemon --start --components=secrets,pkcs11",
        ]) + "\n", [pw, pw2, opq[:14], f"{pw} x", vault]))
    docs.append(Doc("o-readable", "\n".join(OWN_READABLE) + "\n"))
    return docs


# ---------------------------------------------------------------- fresh: written after the rules above were fixed
# (measured once before any change they led to: 22 of 25 secrets hidden, 29 of 30 readable lines kept; the misses
# were curl's `-u USER:PW` and PGPASS, the over-redaction `Auth: OK`)
FRESH_SECRETS = [
    ("curl -u deploy:Fr3shPw01x https://h/api", "Fr3shPw01x"),
    ("curl --user deploy:Fr3shPw02x https://h/api", "Fr3shPw02x"),
    ('export DATABASE_PASSWORD="p@ss Fr3shPw03x"', "Fr3shPw03x"),
    ("TF_VAR_db_password=Fr3shPw04x", "Fr3shPw04x"),
    ("spring.datasource.password=Fr3shPw05x", "Fr3shPw05x"),
    ('OPENAI_API_KEY = "Fr3shPw06xyzabc"', "Fr3shPw06x"),
    ("--mongo-uri mongodb://u:Fr3shPw07x@h:27017/db", "Fr3shPw07x"),
    ("ssh://git:Fr3shPw08x@host/repo.git", "Fr3shPw08x"),
    ('{"auths": {"r": {"auth": "ZGVwbG95OkZyM3NoUHcwOXg="}}}', "ZGVwbG95OkZyM3NoUHcwOXg"),
    ("Cookie: lang=en; session=Fr3shPw10x", "Fr3shPw10x"),
    ("wget --http-password=Fr3shPw11x http://h/f", "Fr3shPw11x"),
    ("-----BEGIN EC PRIVATE KEY-----\nFr3shPw12xMHcCAQEE\n-----END EC PRIVATE KEY-----",
     "-----BEGIN EC PRIVATE KEY-----\nFr3shPw12xMHcCAQEE\n-----END EC PRIVATE KEY-----"),
    ("ARTIFACTORY_API_KEY=AKCp8Fr3shPw13x", "Fr3shPw13x"),
    ("+SMTP_PASSWD=Fr3shPw14x", "Fr3shPw14x"),
    ("+KC_DB_PASSWORD=Fr3shPw15x", "Fr3shPw15x"),
    ("+LANGCHAIN_API_KEY=lsv2_pt_Fr3shPw16x", "Fr3shPw16x"),
    ("+RUNPOD_API_KEY=Fr3shPw17xyz", "Fr3shPw17x"),
    ("python3 -m sglang.launch_server --model m --api-key=Fr3shPw18x", "Fr3shPw18x"),
    ("--admin-token Fr3shPw19x", "Fr3shPw19x"),
    ("Authorization: Token Fr3shPw20xabcdef12", "Fr3shPw20x"),
    ("https://h/download?X-Amz-Signature=Fr3shPw21xabc&X-Amz-Expires=3600", "Fr3shPw21x"),
    ("+ETCD_ROOT_PASSWORD=Fr3shPw22x", "Fr3shPw22x"),
    ("+PGPASS=Fr3shPw23x", "Fr3shPw23x"),
    ("+DB_PASSWD=Fr3shPw24x", "Fr3shPw24x"),
    ("+MONGO_INITDB_ROOT_PASSWORD=Fr3shPw25x", "Fr3shPw25x"),
]
FRESH_READABLE = [
    "docker run -u 1000:1000 --gpus all img",
    "ps -u root -o pid,args",
    "Token indices sequence length is longer than the specified maximum sequence length for this model (5000 > 4096)",
    "Setting `pad_token_id` to `eos_token_id`:2 for open-end generation.",
    "The attention mask and the pad token id were not set.",
    'INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "vllm serve m --tokenizer-revision main --revision abc123 --hf-config-path /models/cfg --enable-auto-tool-choice",
    "python3 -m sglang.launch_server --tokenizer-worker-num 4 --hicache-ratio 2 --kv-cache-dtype fp8_e5m2",
    "[sudo] password for root:\nSorry, try again.",
    "Auth: OK",
    "Password:\nSorry, try again.",
    "first pass: collecting candidates",
    "2nd pass: 0.3 s",
    "Enter passphrase for key '/root/.ssh/id_ed25519':",
    "Permission denied (publickey,password).",
    "KeyboardInterrupt",
    "NCCL_IB_HCA=mlx5_0,mlx5_1",
    "SGLANG_TORCH_PROFILER_DIR=/tmp/prof",
    "    run_id = f\"{folder.name}-{secrets.token_hex(3)}\"",
    "loaded tokenizer: LlamaTokenizerFast(name_or_path='m', vocab_size=128000)",
    "keys: 12, values: 12",
    "Cache key: sha256:0f3a",
    "special_tokens_map.json: 100%|██████████| 1.2k/1.2k",
    "--session-affinity on --sticky-session",
    "tokens/s: 4839.2",
    "SECRET_MANAGER=vault",
    "AUTH_DISABLED=1",
    "KEY_BITS=2048",
    "KEYRING_BACKEND=file",
    "git log --grep='token'",
    "Fix leaked token in logs (#4411)",
]


def fresh_docs() -> list[Doc]:
    """One document per fresh case: a secret to hide, or a line to keep as it is."""
    return ([Doc(f"f-secret-{i}", text + "\n", [secret]) for i, (text, secret) in enumerate(FRESH_SECRETS)]
            + [Doc(f"f-readable-{i}", text + "\n") for i, text in enumerate(FRESH_READABLE)])


# A set written after every rule above, from what an inference host's environment, flags, logs and
# shell history hold. Its first 30 secrets and 25 readable lines were measured before any rule was
# changed for it (30/30 hidden, 0 changed); the engines' start-up lines below them were not (two
# secrets leaked and one line lost a word) and the two rules they needed came after.
UNSEEN_SECRETS = [
    ("+WANDB_API_KEY=3f9c2a7be41d0c5e8a6f7b2d9e1c4a0b5d6e7f80", "3f9c2a7be41d0c5e8a6f7b2d9e1c4a0b5d6e7f80"),
    ("+NGC_API_KEY=nvapi-Unse3nPw01xQ9zLm2Kp7Rt", "Unse3nPw01xQ9zLm2Kp7Rt"),
    ("vllm serve m --hf-token hf_Unse3nPw02xAbCdEfGhIjKlMnOpQrStUv", "Unse3nPw02xAbCdEfGhIjKlMnOpQrStUv"),
    ("+VLLM_API_KEY=Unse3nPw03xk", "Unse3nPw03xk"),
    ("remote.origin.url=https://oauth2:glpat-Unse3nPw04xAbCdEfGh@gitlab.example/grp/repo.git", "Unse3nPw04xAbCdEfGh"),
    ("+SLACK_WEBHOOK_URL=https://hooks.slack.com/services/T0AAA/B0BBB/Unse3nPw05xAbCdEfGhIj", "Unse3nPw05xAbCdEfGhIj"),
    ("+DD_API_KEY=Unse3nPw06x0a1b2c3d4e5f6a7b8c9d0", "Unse3nPw06x0a1b2c3d4e5f6a7b8c9d0"),
    ("+PAYMENTS=sk_live_Unse3nPw07xAbCdEfGhIjKlMn", "Unse3nPw07xAbCdEfGhIjKlMn"),
    ("+AZURE_OPENAI_KEY=Unse3nPw08x9f8e7d6c5b4a3f2e1d0c", "Unse3nPw08x9f8e7d6c5b4a3f2e1d0c"),
    ("--cache-url redis://:Unse3nPw09x@redis:6379/0", "Unse3nPw09x"),
    ("+SQLALCHEMY_URL=postgresql+psycopg2://app:Unse3nPw10x@db:5432/serve", "Unse3nPw10x"),
    ("python3 -m router --redis-password Unse3nPw11x --port 9000", "Unse3nPw11x"),
    ("+MINIO_ROOT_PASSWORD=Unse3nPw12x", "Unse3nPw12x"),
    ("machine artifacts.example login ci password Unse3nPw13x", "Unse3nPw13x"),
    ("aws_secret_access_key = Unse3nPw14xAbCdEfGhIjKlMnOpQrStUvWxYz01", "Unse3nPw14xAbCdEfGhIjKlMnOpQrStUvWxYz01"),
    ("+NEPTUNE_API_TOKEN=Unse3nPw15xeyJhcGlfYWRkcmVzcyI6", "Unse3nPw15xeyJhcGlfYWRkcmVzcyI6"),
    ("curl -s -H 'x-api-key: Unse3nPw16xAbCdEf' http://127.0.0.1:8000/v1/models", "Unse3nPw16xAbCdEf"),
    ("curl -H \"Authorization: Basic dXNlcjpVbnNlM25QdzE3eA==\" http://127.0.0.1:8000/metrics", "dXNlcjpVbnNlM25QdzE3eA"),
    ("+OPENROUTER_API_KEY=sk-or-v1-Unse3nPw18x0a1b2c3d4e5f6a7b8c9d0e1f2", "Unse3nPw18x0a1b2c3d4e5f6a7b8c9d0e1f2"),
    ("+NPM_TOKEN=npm_Unse3nPw19xAbCdEfGhIjKlMnOpQrSt", "Unse3nPw19xAbCdEfGhIjKlMnOpQrSt"),
    ("+TWINE_PASSWORD=pypi-AgEIcHlwaS5vcmcUnse3nPw20x", "Unse3nPw20x"),
    ("git clone https://x-access-token:ghs_Unse3nPw21xAbCdEfGhIjKlMnOp@github.com/o/r", "Unse3nPw21xAbCdEfGhIjKlMnOp"),
    ("+PRIVATE_KEY_PASSPHRASE=Unse3nPw22x", "Unse3nPw22x"),
    ("+ANTHROPIC_API_KEY=sk-ant-api03-Unse3nPw23xAbCdEfGhIjKlMnOpQrStUv", "Unse3nPw23xAbCdEfGhIjKlMnOpQrStUv"),
    ("+LLM_GATEWAY_CREDENTIALS={\"client_id\": \"serve\", \"client_secret\": \"Unse3nPw24xAbCd\"}", "Unse3nPw24xAbCd"),
    ("python3 bench.py --base-url http://127.0.0.1:8000 --api-key=Unse3nPw25x --num-prompts 200", "Unse3nPw25x"),
    ("+HF_TOKEN_PATH=/root/.cache/huggingface/token\n+HUGGINGFACE_HUB_TOKEN=hf_Unse3nPw26xAbCdEfGhIjKlMnOpQrS",
     "Unse3nPw26xAbCdEfGhIjKlMnOpQrS"),
    ("+RAY_REDIS_PASSWORD=Unse3nPw27x", "Unse3nPw27x"),
    ("+GRAFANA_SERVICE_ACCOUNT_TOKEN=glsa_Unse3nPw28xAbCdEfGhIjKlMnOp_0a1b2c3d", "Unse3nPw28xAbCdEfGhIjKlMnOp"),
    ("+CLOUDFLARE_API_TOKEN=Unse3nPw29xAbCdEfGhIjKlMnOpQrStUvWx", "Unse3nPw29xAbCdEfGhIjKlMnOpQrStUvWx"),
    # the engines' own start-up lines (these two leaked before the rule for a list of quoted values)
    ("INFO 12-03 10:14:07 [api_server.py:1] non-default args: {'model': '/models/m', 'api_key': ['Unse3nPw30xAbc']}",
     "Unse3nPw30xAbc"),
    ("non-default args: {'api_key': [\"Unse3nPw31xAbc\", 'Unse3nPw32xAbc'], 'max_num_seqs': 256}\n"
     "client used Unse3nPw32xAbc", "Unse3nPw32xAbc"),
    ("server_args=ServerArgs(model_path='/models/m', api_key='Unse3nPw33xAbc', tp_size=1)", "Unse3nPw33xAbc"),
]
UNSEEN_READABLE = [
    "vllm serve m --max-num-batched-tokens 8192 --num-speculative-tokens 5 --tokenizer-pool-size 4",
    "+SGLANG_ENABLE_TORCH_COMPILE=1",
    "python3 -m sglang.launch_server --speculative-token-map /models/map.pt --kv-cache-dtype fp8_e4m3",
    "+VLLM_ATTENTION_BACKEND=FLASHINFER",
    "+TOKENIZERS_PARALLELISM=false",
    "+HF_HUB_OFFLINE=1",
    "+PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "flashinfer/data/libflashinfer.so sha256=cca51d421ad719dd8e0f2c3b4a59687766554433221100ffeeddccbbaa998877",
    "9f1c2e3d4b5a69788776655443322110fedcba98 perf: fuse rope into the attention kernel (#8812)",
    "GPU 0: NVIDIA H200 (UUID: GPU-3f2a1b6c-9d8e-4f70-a1b2-c3d4e5f60718)",
    "+CUDA_VISIBLE_DEVICES=GPU-3f2a1b6c-9d8e-4f70-a1b2-c3d4e5f60718",
    "image: nvcr.io/nvidia/pytorch:24.05-py3@sha256:5c7e0e9d1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5",
    "--served-model-name meta-llama/Llama-3.1-8B-Instruct --tokenizer-mode auto",
    'INFO 12-03 10:14:07 [logger.py:41] Received request cmpl-9f8e7d6c5b4a39281706f5e4d3c2b1a0: prompt: \'hi\'',
    "+VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
    "--enable-prefix-caching --max-num-seqs 256 --num-lookahead-slots 4",
    "+NCCL_SOCKET_IFNAME=eth0",
    "--speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 3}'",
    "KV cache: 1,234,567 tokens; keys and values in fp8",
    "avg_spec_accept_length: 3.12, last_gen_throughput: 4812.5",
    "+SGLANG_SET_CPU_AFFINITY=1",
    "Loading safetensors checkpoint shards: 100% 4/4",
    "pip: tokenizers==0.21.1 keyring==25.5.0 python-jose==3.3.0",
    "--max-session-len 4096 --session-timeout 600",
    "+VLLM_USE_V1=1",
    # (this one lost `None,` to the mark before `None` was read as no value in a repr)
    "server_args=ServerArgs(model_path='/models/m', admin_api_key=None, tp_size=1, attention_backend='flashinfer')",
]


def unseen_docs() -> list[Doc]:
    """One document per case of the set written last: a secret to hide, or a line to keep as it is."""
    return ([Doc(f"u-secret-{i}", text + "\n", [secret]) for i, (text, secret) in enumerate(UNSEEN_SECRETS)]
            + [Doc(f"u-readable-{i}", text + "\n") for i, text in enumerate(UNSEEN_READABLE)])
