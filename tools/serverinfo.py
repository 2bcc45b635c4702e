"""What an inference server says about itself, parsed into one effective configuration.

Pure functions over text (the probes fetch it):

* SGLang ``GET /server_info`` (the deprecated ``/get_server_info`` answers the same), ``/model_info``
  (``/get_model_info``), and the ``internal_states`` inside ``server_info``: what the scheduler
  actually runs (``attention_backend`` resolved from ``None`` to ``fa3``, ``memory_usage``,
  ``last_gen_throughput``, ``avg_spec_accept_length``);
* Prometheus ``/metrics`` text (``vllm:`` and ``sglang:`` names; the labels of ``vllm:cache_config_info``);
* vLLM ``/version``;
* start-up log lines of either engine (``server_args=ServerArgs(…)``, ``non-default args: {…}``,
  the attention backend chosen, CUDA graph batch sizes, KV cache tokens);
* ``python -m sglang.check_env`` and ``vllm collect-env`` (or ``python -m torch.utils.collect_env``).

``effective_config`` merges what was read into an ``EffectiveConfig``; ``diff_configs`` lists
what differs between two (a baseline's and now), the evidence for a changed default.
Every parser returns a model or raises ``ParseError``.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from .errors import ParseError, parser

Engine = Literal["sglang", "vllm"]
_MAX_DEPTH = 40


# ---------------------------------------------------------------- Python reprs: ServerArgs(...), {...}, kwargs
class _Repr:
    """A tolerant reader of the Python reprs engines log: literals, lists, tuples, dicts, ``Name(k=v, …)``
    calls (read as a dict with ``__type__``), bare words (``torch.bfloat16``, ``LoadFormat.AUTO``,
    ``cuda:1``) and JSON's ``true``/``false``/``null``."""

    def __init__(self, s: str) -> None:
        self.s, self.i = s, 0

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def peek(self) -> str:
        self.ws()
        return self.s[self.i] if self.i < len(self.s) else ""

    def expect(self, c: str) -> None:
        if self.peek() != c:
            raise ValueError(f"expected {c!r} at {self.i}")
        self.i += 1

    def value(self, depth: int = 0, stop: str = ",)]}") -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError("nested too deep")
        c = self.peek()
        if c in ("'", '"'):
            return self.string()
        if c == "[":
            return self.seq("[", "]", depth)
        if c == "(":
            return tuple(self.seq("(", ")", depth))
        if c == "{":
            return self.mapping(depth)
        if c == "":
            raise ValueError("value expected")
        return self.bare(depth, stop)

    def string(self) -> str:
        q, start = self.s[self.i], self.i
        self.i += 1
        while self.i < len(self.s) and self.s[self.i] != q:
            self.i += 2 if self.s[self.i] == "\\" else 1
        if self.i >= len(self.s):
            raise ValueError("unterminated string")
        self.i += 1
        raw = self.s[start:self.i]
        try:
            v = ast.literal_eval(raw)
            return v if isinstance(v, str) else raw[1:-1]
        except (ValueError, SyntaxError):
            return raw[1:-1]

    def seq(self, open_: str, close: str, depth: int) -> list[Any]:
        self.expect(open_)
        out: list[Any] = []
        while self.peek() != close:
            out.append(self.value(depth + 1))
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != close:
                raise ValueError(f"expected , or {close} at {self.i}")
        self.i += 1
        return out

    def mapping(self, depth: int) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}
        while self.peek() != "}":
            k = self.value(depth + 1, stop=",:)]}")
            self.expect(":")
            out[str(k)] = self.value(depth + 1)
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != "}":
                raise ValueError(f"expected , or }} at {self.i}")
        self.i += 1
        return out

    def kwargs(self, depth: int, close: str | None) -> dict[str, Any]:
        """``k=v, k=v`` up to ``close`` (or the end of the text, keeping what was read when a value breaks)."""
        out: dict[str, Any] = {}
        args: list[Any] = []
        while self.peek() not in ("", close):
            m = re.compile(r"\s*([A-Za-z_][\w.]*)\s*=(?!=)").match(self.s, self.i)
            try:
                if m:
                    self.i = m.end()
                    out[m.group(1)] = self.value(depth + 1)
                else:
                    args.append(self.value(depth + 1))
            except ValueError:
                if close is None:
                    break
                raise
            if self.peek() == ",":
                self.i += 1
            elif self.peek() not in ("", close):
                if close is None:
                    break
                raise ValueError(f"expected , at {self.i}")
        if close is not None:
            self.expect(close)
        if args:
            out["__args__"] = args
        return out

    def bare(self, depth: int, stop: str) -> Any:
        start = self.i
        while self.i < len(self.s) and self.s[self.i] not in stop and self.s[self.i] not in "([{":
            if self.s[self.i] == "<":  # <object at 0x…>: to its '>'
                end = self.s.find(">", self.i)
                self.i = end + 1 if end > 0 else len(self.s)
                continue
            self.i += 1
        word = self.s[start:self.i].strip()
        if self.i < len(self.s) and self.s[self.i] == "(" and re.fullmatch(r"[A-Za-z_][\w.]*", word):
            self.i += 1
            call = self.kwargs(depth, ")")
            return {"__type__": word, **call}
        if self.i < len(self.s) and self.s[self.i] in "[{" and not word:
            return self.value(depth)
        return _word(word)


def _word(w: str) -> Any:
    low = w.lower()
    if low in ("none", "null"):
        return None
    if low == "true":
        return True
    if low == "false":
        return False
    if re.fullmatch(r"[-+]?\d+", w):
        return int(w)
    try:
        return float(w) if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?inf|nan", low) else w
    except ValueError:
        return w


@parser("python_repr")
def parse_repr(text: str) -> Any:
    """One Python repr value (``ServerArgs(model_path='m', tp_size=1)`` -> ``{'__type__': 'ServerArgs', …}``)."""
    r = _Repr(text.strip())
    v = r.value()
    return v


@parser("python_kwargs")
def parse_kwargs(text: str) -> dict[str, Any]:
    """``k=v, k=v, …`` as vLLM's ``with config:`` line writes it; a truncated line keeps what was read."""
    return _Repr(text).kwargs(0, None)


# ---------------------------------------------------------------- SGLang endpoints
class SglangServerInfo(BaseModel):
    """``/server_info``: the server args as given, what the scheduler runs (``internal_states``), the version."""

    version: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    internal: dict[str, Any] = Field(default_factory=dict)   # internal_states[0], the scheduler's view
    max_total_num_tokens: int | None = None
    role: str | None = None   # "decode" when read from a PD-disaggregated router's answer


def _json_object(text: str, tool: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        low = (text or "").lower()
        what = "an HTML page" if "<html" in low else "not JSON"
        raise ParseError(f"{what}: {exc}", tool=tool, excerpt=text[:80]) from exc
    if not isinstance(obj, dict):
        raise ParseError(f"a JSON {type(obj).__name__}, not an object", tool=tool, excerpt=text[:80])
    return obj


# what every SGLang /server_info answer holds (its server args, the scheduler's states, the version)
SGLANG_INFO_KEYS = frozenset({"model_path", "internal_states", "version", "tp_size"})


@parser("sglang_server_info")
def parse_sglang_server_info(text: str) -> SglangServerInfo:
    obj = _json_object(text, "sglang_server_info")
    role = None
    if isinstance(obj.get("decode"), list) and obj["decode"] and isinstance(obj["decode"][0], dict):
        obj, role = obj["decode"][0], "decode"
    if not SGLANG_INFO_KEYS & set(obj):
        # a server that answers every path with one JSON object (a small HTTP server's catch-all) is not SGLang
        raise ParseError(f"not SGLang's server info: none of {', '.join(sorted(SGLANG_INFO_KEYS))} in it",
                         tool="sglang_server_info", excerpt=text[:80])
    states = obj.get("internal_states")
    internal = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    args = {k: v for k, v in obj.items() if k not in ("internal_states", "version", "prefill", "decode")}
    mt = obj.get("max_total_num_tokens")
    return SglangServerInfo(version=str(obj["version"]) if obj.get("version") is not None else None, args=args,
                            internal=internal, max_total_num_tokens=mt if isinstance(mt, int) else None, role=role)


class ModelInfo(BaseModel):
    model_path: str | None = None
    tokenizer_path: str | None = None
    is_generation: bool | None = None
    weight_version: str | None = None
    model_type: str | None = None
    architectures: list[str] = Field(default_factory=list)


@parser("sglang_model_info")
def parse_sglang_model_info(text: str) -> ModelInfo:
    obj = _json_object(text, "sglang_model_info")
    arch = obj.get("architectures")

    def s(k: str) -> str | None:
        return None if obj.get(k) is None else str(obj[k])

    return ModelInfo(model_path=s("model_path"), tokenizer_path=s("tokenizer_path"),
                     is_generation=obj.get("is_generation") if isinstance(obj.get("is_generation"), bool) else None,
                     weight_version=s("weight_version"), model_type=s("model_type"),
                     architectures=[str(a) for a in arch] if isinstance(arch, list) else [])


@parser("vllm_version")
def parse_vllm_version(text: str) -> str:
    """``GET /version`` -> ``{"version": "0.9.2"}``."""
    obj = _json_object(text, "vllm_version")
    if not isinstance(obj.get("version"), str):
        raise ParseError("no `version` string", tool="vllm_version", excerpt=text[:80])
    return obj["version"]


# ---------------------------------------------------------------- Prometheus /metrics
class Sample(BaseModel):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    value: float


class Metrics(BaseModel):
    samples: list[Sample] = Field(default_factory=list)

    def get(self, name: str, **labels: str) -> float | None:
        """The first sample of ``name`` whose labels include ``labels``."""
        for s in self.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        return None

    def labels_of(self, name: str) -> dict[str, str]:
        """The labels of an info metric (``vllm:cache_config_info``): where such metrics keep their values."""
        return next((dict(s.labels) for s in self.samples if s.name == name), {})


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _prom_value(v: str) -> float:
    return {"+Inf": float("inf"), "-Inf": float("-inf"), "NaN": float("nan")}.get(v) or float(v)


@parser("metrics")
def parse_metrics(text: str) -> Metrics:
    """Prometheus text exposition: ``name{label="v",…} value [timestamp]``; ``#`` lines are comments."""
    out: list[Sample] = []
    bad = 0
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            bad += 1
            continue
        labels: dict[str, str] = {}
        raw = m.group("labels") or ""
        pos = 0
        while pos < len(raw):
            lm = _LABEL.match(raw, pos)
            if not lm:
                break
            labels[lm.group(1)] = lm.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            pos = lm.end()
        try:
            value = _prom_value(m.group("value"))
        except ValueError:
            bad += 1
            continue
        out.append(Sample(name=m.group("name"), labels=labels, value=value))
    if bad and not out:
        raise ParseError("not Prometheus text (no `name value` line)", tool="metrics", excerpt=(text or "")[:80])
    return Metrics(samples=out)


# ---------------------------------------------------------------- start-up logs
class LogFacts(BaseModel):
    """What a server's start-up log says it chose."""

    engine: Engine | None = None
    version: str | None = None
    server_args: dict[str, Any] = Field(default_factory=dict)    # SGLang ServerArgs(…), every field
    non_default_args: dict[str, Any] = Field(default_factory=dict)  # vLLM: only what was given
    engine_config: dict[str, Any] = Field(default_factory=dict)  # vLLM "with config: …"
    attention_backend: str | None = None
    attention_backend_default: bool | None = None  # True when the log says it was not specified and chose
    attention_backend_candidates: list[str] = Field(default_factory=list)
    flash_attn_version: int | None = None           # vLLM: "Using FlashAttention version 3"
    cuda_graph_bs: list[int] | None = None
    cuda_graph_seconds: float | None = None
    architecture: str | None = None                 # SGLang "Load weight end. type=…"
    dtype: str | None = None                        # the dtype the weights were loaded in
    kv_cache_tokens: int | None = None
    kv_cache_dtype: str | None = None
    max_concurrency: float | None = None
    notes: list[str] = Field(default_factory=list)


_SGL_DEFAULT_ATTN = re.compile(r"Attention backend not (?:explicitly )?specified\. Use (\S+?) backend by default")
_SGL_CUDA_GRAPH = re.compile(r"Capture cuda graph bs (\[[^\]]*\])")
_SGL_GRAPH_END = re.compile(r"Capture cuda graph end\. Time elapsed: ([\d.]+) s")
_SGL_KV = re.compile(r"KV Cache is allocated\.(?: dtype: ([\w.]+),)? #tokens: (\d+)")
_SGL_KV_DTYPE = re.compile(r"Using KV cache dtype: ([\w.]+)")
_VLLM_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_VLLM_ENGINE = re.compile(r"Initializing a V\d LLM engine \(v([^)]+)\) with config: (.*)$")
_VLLM_SERVER_VERSION = re.compile(r"vLLM API server version (\S+)")
_VLLM_ATTN = re.compile(r"Using (\S+) attention backend out of potential backends: (\[[^\]]*\])")
_VLLM_ATTN_OLD = re.compile(r"(?:cuda|selector)\.py:\d+\] Using ([\w ]+?) backend(?: on V1 engine)?\.\s*$")
_VLLM_FA_VERSION = re.compile(r"Using FlashAttention version (\d+)")
_SGL_WEIGHTS = re.compile(r"Load weight end\. type=(\w+), dtype=([\w.]+)")
_VLLM_KV = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_VLLM_GRAPH = re.compile(r"Graph capturing finished in ([\d.]+) secs?")
_VLLM_CONCURRENCY = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x")


def _first(facts: LogFacts, field: str, value: Any, line: str) -> None:
    """Keep the first value a log gives (every TP rank repeats the line); note a rank that disagrees."""
    old = getattr(facts, field)
    if old is None or old == [] or old == {}:
        setattr(facts, field, value)
    elif old != value and len(facts.notes) < 20:
        facts.notes.append(f"{field}: {value!r} in a later line ({line.strip()[:80]}), {old!r} kept")


def _int_list(text: str) -> list[int] | None:
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return None
    return [int(x) for x in v] if isinstance(v, list) and all(isinstance(x, int) for x in v) else None


@parser("startup_log")
def parse_startup_log(text: str) -> LogFacts:
    """The facts an SGLang or vLLM start-up log states, whichever engine wrote it."""
    f = LogFacts()
    for line in (text or "").splitlines():
        if "server_args=ServerArgs(" in line:
            f.engine = f.engine or "sglang"
            try:
                args = parse_repr(line[line.index("ServerArgs("):])
            except ParseError:
                args = parse_kwargs(line[line.index("ServerArgs(") + len("ServerArgs("):])
                f.notes.append("server_args: the ServerArgs(…) line is cut short; the fields before the cut are read")
            if isinstance(args, dict):
                _first(f, "server_args", {k: v for k, v in args.items() if k != "__type__"}, line)
            continue
        if m := _SGL_DEFAULT_ATTN.search(line):
            f.engine = f.engine or "sglang"
            _first(f, "attention_backend", m.group(1), line)
            f.attention_backend_default = True
        elif m := _SGL_CUDA_GRAPH.search(line):
            f.engine = f.engine or "sglang"
            _first(f, "cuda_graph_bs", _int_list(m.group(1)), line)
        elif m := _SGL_GRAPH_END.search(line):
            _first(f, "cuda_graph_seconds", float(m.group(1)), line)
        elif m := _SGL_KV.search(line):
            f.engine = f.engine or "sglang"
            _first(f, "kv_cache_tokens", int(m.group(2)), line)
            if m.group(1):
                _first(f, "kv_cache_dtype", m.group(1), line)
        elif m := _SGL_KV_DTYPE.search(line):
            _first(f, "kv_cache_dtype", m.group(1), line)
        elif m := _VLLM_NON_DEFAULT.search(line):
            f.engine = f.engine or "vllm"
            try:
                v = parse_repr(m.group(1))
            except ParseError:
                v = None
                f.notes.append("non-default args: not a readable dict")
            if isinstance(v, dict):
                _first(f, "non_default_args", v, line)
        elif m := _VLLM_ENGINE.search(line):
            f.engine = f.engine or "vllm"
            _first(f, "version", m.group(1), line)
            _first(f, "engine_config", parse_kwargs(m.group(2)), line)
        elif m := _VLLM_SERVER_VERSION.search(line):
            f.engine = f.engine or "vllm"
            _first(f, "version", m.group(1), line)
        elif m := _VLLM_ATTN.search(line):
            f.engine = f.engine or "vllm"
            _first(f, "attention_backend", m.group(1), line)
            try:
                cands = _Repr(m.group(2)).value()
            except ValueError:
                cands = None
            if isinstance(cands, list) and not f.attention_backend_candidates:
                f.attention_backend_candidates = [str(c) for c in cands]
        elif m := _VLLM_ATTN_OLD.search(line):
            f.engine = f.engine or "vllm"
            _first(f, "attention_backend", m.group(1), line)
        elif m := _VLLM_FA_VERSION.search(line):
            _first(f, "flash_attn_version", int(m.group(1)), line)
        elif m := _SGL_WEIGHTS.search(line):
            _first(f, "architecture", m.group(1), line)
            _first(f, "dtype", m.group(2), line)
        elif m := _VLLM_KV.search(line):
            f.engine = f.engine or "vllm"
            _first(f, "kv_cache_tokens", int(m.group(1).replace(",", "")), line)
        elif m := _VLLM_GRAPH.search(line):
            _first(f, "cuda_graph_seconds", float(m.group(1)), line)
        elif m := _VLLM_CONCURRENCY.search(line):
            _first(f, "max_concurrency", float(m.group(1)), line)
    if f.server_args and f.attention_backend is None and f.server_args.get("attention_backend"):
        f.attention_backend, f.attention_backend_default = str(f.server_args["attention_backend"]), False
    return f


# ---------------------------------------------------------------- check_env / collect-env
class EnvReport(BaseModel):
    """``sglang.check_env`` or ``vllm collect-env``: versions by canonical name, and the rest as written."""

    tool: Literal["sglang.check_env", "collect_env"]
    versions: dict[str, str] = Field(default_factory=dict)   # sglang, sgl_kernel, flashinfer, triton, torch, cuda, driver, vllm …
    fields: dict[str, str] = Field(default_factory=dict)     # every `Key: value` line (the environment block)
    gpus: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)        # environment variables collect-env lists
    packages: dict[str, str] = Field(default_factory=dict)   # [pip3] / [conda] lines
    missing: list[str] = Field(default_factory=list)         # "Module Not Found"


# name as the tool prints it -> canonical version name
_VERSION_KEYS = {"sglang": "sglang", "sgl_kernel": "sgl_kernel", "sgl-kernel": "sgl_kernel", "flashinfer": "flashinfer",
                 "flashinfer_python": "flashinfer", "flashinfer-python": "flashinfer", "triton": "triton",
                 "pytorch": "torch", "torch": "torch", "pytorch version": "torch", "vllm": "vllm",
                 "vllm version": "vllm", "transformers": "transformers", "cuda driver version": "driver",
                 "nvidia driver version": "driver", "cuda runtime version": "cuda", "nvcc": "cuda",
                 "cuda used to build pytorch": "torch_cuda", "python": "python", "python version": "python",
                 "xgrammar": "xgrammar", "flashinfer_cubin": "flashinfer_cubin", "nvidia-nccl-cu12": "nccl",
                 "nvidia-nccl-cu13": "nccl", "nccl": "nccl", "numpy": "numpy"}
_FIELD = re.compile(r"^(?P<key>[A-Za-z][\w .()/+-]*?)\s*:\s?(?P<value>.*)$")
_PKG = re.compile(r"^\[(?P<mgr>pip3?|conda)\]\s+(?P<name>[\w.\-]+)(?:==|\s+)(?P<ver>\S+)")
_ENV = re.compile(r"^(?P<key>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")
_SECTION = re.compile(r"^=+\s*$")


def _version_value(key: str, value: str) -> str | None:
    v = value.strip()
    if not v or v.lower() in ("module not found", "could not collect", "n/a", "none"):
        return None
    if key == "cuda" and "release" in v:       # NVCC: Cuda compilation tools, release 12.2, V12.2.140
        m = re.search(r"V(\d+\.\d+\.\d+)", v) or re.search(r"release (\d+\.\d+)", v)
        return m.group(1) if m else v
    if key == "python":
        return v.split()[0]
    return v.split()[0] if key in ("driver",) else v


def _env_report(text: str, tool: Literal["sglang.check_env", "collect_env"]) -> EnvReport:
    r = EnvReport(tool=tool)
    skip_block = False   # lscpu's block (CPU:) and the topology matrix are kept out of the fields
    section = ""
    for raw in (text or "").splitlines():
        line = raw.rstrip()
        s = line.strip()
        if not s:
            skip_block = False
            continue
        if _SECTION.match(s):
            continue
        if s in ("CPU:", "CPU Info") or s.endswith("Topology:") or s.endswith("Topology") or s == "Legend:":
            skip_block, section = True, s
            continue
        if re.fullmatch(r"[A-Za-z][\w ]+", s) and not raw.startswith(" ") and ":" not in s and len(s) < 40:
            section = s          # a section header of the newer collect-env ("Environment Variables")
            skip_block = s in ("CPU Info", "GPU Topology")
            continue
        if skip_block:
            continue
        if m := _PKG.match(s):
            r.packages[m.group("name")] = m.group("ver")
            canon = _VERSION_KEYS.get(m.group("name").lower())
            if canon and canon not in r.versions:
                r.versions[canon] = m.group("ver")
            continue
        if (m := _ENV.match(s)) and (section == "Environment Variables" or tool == "collect_env"):
            r.env[m.group("key")] = m.group("value")
            continue
        if re.match(r"^GPU \d+(?:,\d+)*: ", s) and "Compute Capability" not in s:
            r.gpus.append(s.split(": ", 1)[1])
            continue
        m = _FIELD.match(s)
        if not m:
            continue
        key, value = m.group("key").strip(), m.group("value").strip()
        if key in r.fields:
            continue
        r.fields[key] = value
        canon = _VERSION_KEYS.get(key.lower())
        if value.lower() == "module not found":
            r.missing.append(key)
        if canon:
            v = _version_value(canon, value)
            if v is not None:
                r.versions.setdefault(canon, v)
    if "GPU models and configuration" in r.fields and not r.gpus and r.fields["GPU models and configuration"]:
        r.gpus.append(re.sub(r"^GPU \d+: ", "", r.fields["GPU models and configuration"]))
    return r


@parser("sglang_check_env")
def parse_check_env(text: str) -> EnvReport:
    """``python -m sglang.check_env``: ``Key: value`` lines (``sglang: 0.4.4.post2``, ``CUDA Driver Version: …``),
    then the ``NVIDIA Topology`` matrix (left out)."""
    r = _env_report(text, "sglang.check_env")
    if not r.fields:
        raise ParseError("no `Key: value` line", tool="sglang_check_env", excerpt=(text or "")[:80])
    return r


@parser("collect_env")
def parse_collect_env(text: str) -> EnvReport:
    """``vllm collect-env`` / ``python -m torch.utils.collect_env``, the older ``Key: value`` layout and the newer
    sectioned ``Key   : value`` one; ``[pip3] name==version`` lines; the environment variables it lists."""
    r = _env_report(text, "collect_env")
    if not r.fields and not r.packages:
        raise ParseError("no `Key: value` or `[pip3]` line", tool="collect_env", excerpt=(text or "")[:80])
    return r


# ---------------------------------------------------------------- the effective configuration
class EffectiveConfig(BaseModel):
    """What the server actually runs with, from whichever sources were read; ``sources`` says where each came from."""

    engine: Engine | None = None
    version: str | None = None
    model: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    tp_size: int | None = None
    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    flash_attn_version: int | None = None
    sampling_backend: str | None = None
    cuda_graph_bs: list[int] | None = None
    cuda_graph_disabled: bool | None = None
    kv_cache_tokens: int | None = None
    kv_cache_dtype: str | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    speculative_algorithm: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    # measured, not configured: shown, never diffed
    avg_spec_accept_length: float | None = None
    last_gen_throughput: float | None = None
    memory_usage: dict[str, float] = Field(default_factory=dict)
    sources: dict[str, str] = Field(default_factory=dict)


VOLATILE = ("avg_spec_accept_length", "last_gen_throughput", "memory_usage", "sources")


def _set(cfg: EffectiveConfig, field: str, value: Any, source: str) -> None:
    """Set ``field`` unless a more trusted source (an earlier call) already did; ``auto`` (an argument left to
    the engine) gives way to the value a later source says was chosen."""
    old = getattr(cfg, field)
    if value is None or value == "" or (old not in (None, [], {}) and not (old == "auto" and value != "auto")):
        return
    setattr(cfg, field, value)
    cfg.sources[field] = source


def _str(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, dict) and "__type__" in v:
        return str(v["__type__"])
    s = str(v)
    return s[len("torch."):] if s.startswith("torch.") else s


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _from_sglang_args(cfg: EffectiveConfig, a: dict[str, Any], source: str) -> None:
    _set(cfg, "model", _str(a.get("model_path")), source)
    _set(cfg, "dtype", _str(a.get("dtype")), source)
    _set(cfg, "quantization", _str(a.get("quantization")), source)
    _set(cfg, "tp_size", _int(a.get("tp_size")), source)
    for f in ("attention_backend", "prefill_attention_backend", "decode_attention_backend", "sampling_backend",
              "speculative_algorithm"):
        _set(cfg, f, _str(a.get(f)), source)
    bs = a.get("cuda_graph_bs")
    if isinstance(bs, list) and all(isinstance(x, int) for x in bs):
        _set(cfg, "cuda_graph_bs", bs, source)
    if isinstance(a.get("disable_cuda_graph"), bool):
        _set(cfg, "cuda_graph_disabled", a["disable_cuda_graph"], source)
    _set(cfg, "kv_cache_dtype", _str(a.get("kv_cache_dtype")), source)
    _set(cfg, "max_running_requests", _int(a.get("max_running_requests")), source)
    _set(cfg, "chunked_prefill_size", _int(a.get("chunked_prefill_size")), source)


def effective_config(*, server_info: SglangServerInfo | None = None, log: LogFacts | None = None,
                     env: EnvReport | None = None, metrics: Metrics | None = None, version: str | None = None,
                     model_info: ModelInfo | None = None) -> EffectiveConfig:
    """Merge what was read, most trusted first: what the running scheduler reports (``internal_states``), the
    metrics' info labels, the start-up log's choices, then the arguments as given."""
    cfg = EffectiveConfig()
    if server_info is not None:
        cfg.engine = "sglang"
        st = server_info.internal
        _from_sglang_args(cfg, st, "server_info.internal_states")
        if isinstance(st.get("avg_spec_accept_length"), (int, float)):
            cfg.avg_spec_accept_length = float(st["avg_spec_accept_length"])
        if isinstance(st.get("last_gen_throughput"), (int, float)):
            cfg.last_gen_throughput = float(st["last_gen_throughput"])
        mu = st.get("memory_usage")
        if isinstance(mu, dict):
            cfg.memory_usage = {str(k): float(v) for k, v in mu.items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool)}
        _set(cfg, "version", server_info.version, "server_info")
    if metrics is not None:
        cache = metrics.labels_of("vllm:cache_config_info")
        if cache:
            cfg.engine = cfg.engine or "vllm"
            try:
                blocks, size = int(cache.get("num_gpu_blocks", "")), int(cache.get("block_size", ""))
                _set(cfg, "kv_cache_tokens", blocks * size, "metrics vllm:cache_config_info")
            except ValueError:
                pass
            _set(cfg, "kv_cache_dtype", cache.get("cache_dtype"), "metrics vllm:cache_config_info")
        mt = metrics.get("sglang:max_total_num_tokens")
        if mt is not None and mt == mt:
            _set(cfg, "kv_cache_tokens", int(mt), "metrics sglang:max_total_num_tokens")
    if server_info is not None and server_info.max_total_num_tokens:
        _set(cfg, "kv_cache_tokens", server_info.max_total_num_tokens, "server_info")
    if log is not None:
        cfg.engine = cfg.engine or log.engine
        src = "startup log"
        _set(cfg, "attention_backend", log.attention_backend, src)
        _set(cfg, "cuda_graph_bs", log.cuda_graph_bs, src)
        _set(cfg, "kv_cache_tokens", log.kv_cache_tokens, src)
        _set(cfg, "kv_cache_dtype", _str(log.kv_cache_dtype), src)
        _set(cfg, "dtype", _str(log.dtype), src)
        _set(cfg, "flash_attn_version", log.flash_attn_version, src)
        _set(cfg, "version", log.version, src)
        ec = log.engine_config
        if ec:
            _set(cfg, "model", _str(ec.get("model")), src)
            _set(cfg, "dtype", _str(ec.get("dtype")), src)
            _set(cfg, "quantization", _str(ec.get("quantization")), src)
            _set(cfg, "tp_size", _int(ec.get("tensor_parallel_size")), src)
            _set(cfg, "kv_cache_dtype", _str(ec.get("kv_cache_dtype")), src)
            if isinstance(ec.get("enforce_eager"), bool):
                _set(cfg, "cuda_graph_disabled", ec["enforce_eager"], src)
            cc = ec.get("compilation_config")
            sizes = cc.get("cudagraph_capture_sizes") if isinstance(cc, dict) else None
            if isinstance(sizes, list) and all(isinstance(x, int) for x in sizes):
                _set(cfg, "cuda_graph_bs", sorted(sizes), src)
        if log.server_args:
            _from_sglang_args(cfg, log.server_args, "startup log server_args")
    if server_info is not None:
        _from_sglang_args(cfg, server_info.args, "server_info (arguments)")
    if model_info is not None:
        _set(cfg, "model", model_info.model_path, "model_info")
    _set(cfg, "version", version, "version endpoint")
    if env is not None:
        cfg.versions = dict(env.versions)
        cfg.env = dict(env.env)
        cfg.sources["versions"] = env.tool
        if cfg.version is None and cfg.engine and cfg.engine in env.versions:
            _set(cfg, "version", env.versions[cfg.engine], env.tool)
    return cfg


class ConfigChange(BaseModel):
    path: str
    before: Any = None
    after: Any = None


def diff_configs(before: EffectiveConfig, after: EffectiveConfig, ignore: tuple[str, ...] = VOLATILE) -> list[ConfigChange]:
    """What differs between two effective configurations (``versions.flashinfer``, ``attention_backend`` …);
    a value one side did not read is not a change."""
    a, b = before.model_dump(), after.model_dump()
    out: list[ConfigChange] = []
    for key in a:
        if key in ignore:
            continue
        va, vb = a[key], b[key]
        if isinstance(va, dict):
            for k in sorted(set(va) & set(vb)):
                if va[k] != vb[k]:
                    out.append(ConfigChange(path=f"{key}.{k}", before=va[k], after=vb[k]))
        elif va is not None and vb is not None and va != vb:
            out.append(ConfigChange(path=key, before=va, after=vb))
    return out
