"""The server's own view of itself: what it answers on its port and what its start-up log says it chose.

One read-only call, ``server_view``, sent with the server's own interpreter after discovery found the server:
HTTP GETs on the server's port (short timeouts, no proxy) — SGLang ``/server_info`` (falling back to the
deprecated ``/get_server_info``) and ``/model_info`` (``/get_model_info``); vLLM ``/version`` and
``/server_info?config_format=json``; ``/metrics`` for both (a 404 is "metrics off", not an error) — and the
start-up log: the server's stdout through ``/proc/PID/fd/1`` where that is a regular file, or a log file its
command line names. ``tools.serverinfo`` parses them into one effective configuration. ``server_env`` (optional,
which no hypothesis of the default playbook checks, so ``debugagent snapshot`` sends it and a run does not unless a
playbook asks) adds the versions and environment block of the engine's own report, ``python -m sglang.check_env``
or ``python -m vllm.collect_env``.

Snapshot field ``server_view``; difference paths ``server_view.NAME``, ``server_view.versions.NAME`` and
``server_view.env.VAR`` (what the server runs with, measurements left out); facts ``server_view``,
``baseline_view`` and ``default_changed`` (an effective setting the engine chose by default that differs from
the baseline snapshot's, or from the engine's previous default as the playbook's ``knowledge.default_changes``
knows it, with the flag that pins the old value).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .. import serverinfo as si
from ..errors import ParseError
from ..transport import CommandResult, q
from .base import Add, Call, FactsInput, Gathering, Probe, Tool
from .text import code, collapsed

if TYPE_CHECKING:
    from ..snapshot import Snapshot

# one GET per endpoint (a `|` separates a fallback, asked only when the first answers 404), then the first
# readable log, of which only the last start-up (a log appended across restarts holds every start: a new one begins
# at an engine's first start-up line more than 5 lines after the last); the answer is one JSON object. Histogram
# buckets are dropped from /metrics (the parser reads the gauges and info labels, and a vLLM exposition is mostly
# buckets).
SCRIPT = r"""import json,os,sys,urllib.request as u
h,port,specs,logs=sys.argv[1],int(sys.argv[2]),sys.argv[3],sys.argv[4:]
h="[%s]"%h if ":" in h else h
op=u.build_opener(u.ProxyHandler({}))
out={"endpoints":{},"log":None,"log_path":None}
for spec in filter(None,specs.split(",")):
    for path in spec.split("|"):
        try:
            r=op.open("http://%s:%d%s"%(h,port,path),timeout=3)
            st,b=r.status,r.read(4194304)
        except u.HTTPError as e:
            st,b=e.code,b""
        except Exception as e:
            st,b=0,("%s: %s"%(type(e).__name__,e)).encode()
        if path.startswith("/metrics"):
            b=b"\n".join(x for x in b.splitlines() if b"_bucket{" not in x)
        out["endpoints"][path]={"status":st,"body":b[:262144].decode("utf-8","replace")}
        if st!=404:
            break
M=(b"Attention backend not",b"server_args=ServerArgs(",b"vLLM API server version",b"non-default args:")
for p in logs:
    try:
        if os.path.isfile(p):
            block,n,age=[],0,99
            with open(p,"rb") as f:
                for line in f:
                    n+=len(line)
                    if n>268435456:
                        break
                    age+=1
                    if any(m in line for m in M):
                        if age>5:
                            block=[]
                        age=0
                    if len(block)<20000:
                        block.append(line[:65536])
            out["log"]=b"".join(block)[:2097152].decode("utf-8","replace")
            out["log_path"]=p
            break
    except OSError:
        pass
print(json.dumps(out))
"""

ENDPOINTS: dict[str, list[str]] = {
    "sglang": ["/server_info|/get_server_info", "/model_info|/get_model_info", "/metrics"],
    "vllm": ["/version", "/server_info?config_format=json", "/metrics"],
    "unknown": ["/server_info|/get_server_info", "/version", "/metrics"],
}
DEFAULT_PORT = {"sglang": 30000, "vllm": 8000}
LOG_FLAGS = ("log-file", "log_file", "log-path")


class ServerViewInput(BaseModel):
    """Input of ``server_view``: the interpreter that sends the GETs (the server's), the address, the endpoints
    (``|`` before a fallback), and the log files to try in order (the first regular file is read)."""

    model_config = ConfigDict(extra="forbid")
    python: str
    port: int
    address: str = "127.0.0.1"
    engine: str = "unknown"
    endpoints: list[str] = Field(default_factory=list)
    logs: list[str] = Field(default_factory=list)

    def command(self) -> str:
        args = " ".join(q(a) for a in [self.address, str(int(self.port)), ",".join(self.endpoints), *self.logs])
        return f"{q(self.python)} -I -c {q(SCRIPT)} {args}"


ENV_MODULE = {"sglang": "sglang.check_env", "vllm": "vllm.collect_env"}


class ServerEnvInput(BaseModel):
    """Input of ``server_env``: the engine's own environment report with the server's interpreter
    (``python -m sglang.check_env``, ``python -m vllm.collect_env``)."""

    model_config = ConfigDict(extra="forbid")
    python: str
    engine: Literal["sglang", "vllm"]

    def command(self) -> str:
        return f"timeout 100 {q(self.python)} -m {ENV_MODULE[self.engine]}"


def parse_server_env(inp: ServerEnvInput, r: CommandResult) -> si.EnvReport:
    return si.parse_check_env(r.stdout) if inp.engine == "sglang" else si.parse_collect_env(r.stdout)


class ServerView(BaseModel):
    """What the server said about itself: the answer of each endpoint (0: no answer), whether metrics are on,
    where the log came from, the settings its log says it chose by default, the effective configuration."""

    engine: str | None = None
    port: int | None = None
    endpoints: dict[str, int] = Field(default_factory=dict)
    metrics: Literal["on", "off"] | None = None
    log_path: str | None = None
    defaulted: list[str] = Field(default_factory=list)
    effective: si.EffectiveConfig = Field(default_factory=si.EffectiveConfig)
    notes: list[str] = Field(default_factory=list)


def _try(notes: list[str], path: str, fn: Any, body: str) -> Any:
    try:
        return fn(body)
    except ParseError as exc:
        notes.append(f"{path}: {exc}")
        return None


def parse_server_view(inp: ServerViewInput, r: CommandResult) -> ServerView:
    try:
        raw = json.loads(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
    except ValueError as exc:
        raise ParseError(f"not the probe's JSON: {exc}", tool="server_view", excerpt=r.stdout[:80]) from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("endpoints"), dict):
        raise ParseError("not the probe's JSON object", tool="server_view", excerpt=r.stdout[:80])
    view = ServerView(engine=inp.engine if inp.engine != "unknown" else None, port=inp.port,
                      log_path=raw.get("log_path") if isinstance(raw.get("log_path"), str) else None)
    bodies: dict[str, str] = {}
    for path, ans in raw["endpoints"].items():
        if not isinstance(ans, dict):
            continue
        st = ans.get("status")
        status = st if isinstance(st, int) else 0
        view.endpoints[str(path)] = status
        if status == 200:
            bodies[str(path).split("?")[0]] = str(ans.get("body") or "")
        elif status == 0:
            view.notes.append(f"{path}: no answer ({str(ans.get('body') or '')[:120]})")
    notes = view.notes
    info = next((_try(notes, p, si.parse_sglang_server_info, bodies[p]) for p in ("/server_info", "/get_server_info")
                 if p in bodies and view.engine != "vllm"), None)
    model = next((_try(notes, p, si.parse_sglang_model_info, bodies[p]) for p in ("/model_info", "/get_model_info")
                  if p in bodies), None)
    version = _try(notes, "/version", si.parse_vllm_version, bodies["/version"]) if "/version" in bodies else None
    metrics = _try(notes, "/metrics", si.parse_metrics, bodies["/metrics"]) if "/metrics" in bodies else None
    m_status = view.endpoints.get("/metrics")
    view.metrics = "on" if m_status == 200 else "off" if m_status == 404 else None
    log = _try(notes, "log", si.parse_startup_log, raw["log"]) if isinstance(raw.get("log"), str) else None
    view.effective = si.effective_config(server_info=info, log=log, metrics=metrics, version=version, model_info=model)
    if log is not None:
        if log.attention_backend_default or (log.engine == "vllm" and log.attention_backend
                                             and "attention_backend" not in log.non_default_args):
            view.defaulted.append("attention_backend")
        view.notes += log.notes
    view.engine = view.engine or view.effective.engine
    return view


class Fields(BaseModel):
    server_view: ServerView | None = None


def _second(g: Gathering) -> list[Call]:
    s = g.discovery.server if g.discovery else None
    if s is None:
        return []
    kind = s.kind if s.kind in ENDPOINTS else "unknown"
    flag_port = s.flags.get("port")
    port = s.ports[0] if s.ports else int(flag_port) if isinstance(flag_port, str) and flag_port.isdigit() else \
        DEFAULT_PORT.get(kind, 30000)
    bind = s.flags.get("host")
    address = bind if isinstance(bind, str) and bind not in ("", "0.0.0.0", "::", "[::]", "localhost") else "127.0.0.1"
    logs = [f"/proc/{s.pid}/fd/1"]
    logs += [str(s.flags[f]) for f in LOG_FLAGS if isinstance(s.flags.get(f), str)]
    logs += [a for a in s.argv if re.fullmatch(r"/\S+\.log", a) and a not in logs]
    python = g.python or s.python or "python3"
    calls: list[Call] = [("server_view", ServerViewInput(python=python, port=port, address=address, engine=kind,
                                                         endpoints=ENDPOINTS[kind], logs=logs),
                          "what the server says it runs with: its endpoints and its start-up log")]
    if kind in ENV_MODULE:
        calls.append(("server_env", ServerEnvInput(python=python, engine=kind),  # type: ignore[arg-type]
                      f"the versions the engine's own report names (python -m {ENV_MODULE[kind]})"))
    return calls


def _fill(g: Gathering) -> dict[str, Any]:
    view: ServerView | None = g.output("server_view")
    env: si.EnvReport | None = g.output("server_env")
    if view is not None and env is not None:   # the versions and environment block of the engine's own report
        eff = view.effective.model_copy(update={"versions": dict(env.versions), "env": dict(env.env),
                                                "sources": {**view.effective.sources, "versions": env.tool}})
        view = view.model_copy(update={"effective": eff})
    return {"server_view": view}


def _diff(a: Snapshot, b: Snapshot, add: Add) -> None:
    if a.server_view is None or b.server_view is None:
        return
    engine = b.server_view.engine or ""
    for c in si.diff_configs(a.server_view.effective, b.server_view.effective):
        name = engine if c.path == "version" else c.path[len("versions."):] if c.path.startswith("versions.") else None
        if name and (_pkg_version(a, name), _pkg_version(b, name)) == (c.before, c.after):
            continue   # a version change that packages.NAME.version (or driver.version) reports already
        add(f"server_view.{c.path}", c.before, c.after, note=b.server_view.effective.sources.get(c.path.split(".")[0], ""))


def _pkg_version(snap: Snapshot, name: str) -> str | None:
    """The version of the distribution a report names ``name`` (``flashinfer`` is ``flashinfer-python``), or of
    the driver, as the snapshot's own probes read them."""
    if name == "driver":
        return snap.driver.get("version") or None
    if not name or snap.packages is None:
        return None
    p = snap.packages.get(name) or snap.packages.get(f"{name}-python")
    return p.version if p is not None else None


def _version(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(v or ""))[:4])


def default_changed(snap: Snapshot, fx: FactsInput) -> list[dict[str, Any]]:
    """The effective settings the engine chose itself (no flag sets them; ``logged``: its start-up log says so) that
    differ from what the good state ran: the baseline snapshot's effective value where it has one (``how: baseline``), else the engine's previous
    default from ``knowledge.default_changes`` (``how: knowledge``); each with the flag that pins the old value."""
    view = snap.server_view
    if view is None:
        return []
    flags = snap.server.flags if snap.server else {}
    known: list[dict[str, Any]] = [k for k in fx.knowledge.get("default_changes") or [] if isinstance(k, dict)]
    pin = {str(k.get("setting")): str(k.get("flag")) for k in known if k.get("flag")}
    pin.update({str(k): str(v) for k, v in (fx.knowledge.get("effective_flags") or {}).items()})
    cur = view.effective.model_dump()
    out: list[dict[str, Any]] = []
    base = fx.baseline.server_view if fx.baseline is not None else None
    if base is not None:
        bflags = fx.baseline.server.flags if fx.baseline is not None and fx.baseline.server else {}
        for c in si.diff_configs(base.effective, view.effective):
            flag = pin.get(c.path)
            if flag is None or flag in flags or flag in bflags:
                continue   # not a setting a flag pins, or one given on the command line (a flag's change, not a default's)
            out.append({"setting": c.path, "flag": flag, "before": c.before, "after": c.after, "how": "baseline",
                        "source": view.effective.sources.get(c.path, ""), "why": "", "since": None,
                        "logged": c.path in view.defaulted})
        return out
    for k in known:
        setting, flag = str(k.get("setting")), str(k.get("flag") or "")
        # no flag sets it, so the engine chose it: the start-up log says so where it was read (``logged``)
        if k.get("engine") not in (None, view.engine) or not flag or flag in flags:
            continue
        if str(cur.get(setting)) != str(k.get("now")) or str(k.get("before")) == str(k.get("now")):
            continue
        since = k.get("since")
        if since and view.effective.version and _version(view.effective.version) < _version(since):
            continue
        out.append({"setting": setting, "flag": flag, "before": k.get("before"), "after": cur.get(setting),
                    "how": "knowledge", "source": view.effective.sources.get(setting, ""), "why": k.get("why") or "",
                    "since": since, "logged": setting in view.defaulted})
    return out


def _facts(snap: Snapshot, fx: FactsInput) -> dict[str, Any]:
    return {"server_view": snap.server_view.model_dump() if snap.server_view else None,
            "baseline_view": fx.baseline is not None and fx.baseline.server_view is not None,
            "default_changed": default_changed(snap, fx)}


def _summary(ev: dict[str, Any]) -> list[str] | None:
    out = ev.get("output")
    if not out:
        return None
    eff = out.get("effective") or {}
    shown = [f"{k} {code(str(v))}" for k, v in eff.items()
             if k not in ("sources", "versions", "env", "memory_usage") and v not in (None, [], {})]
    answers = ", ".join(f"{p} {s or 'no answer'}" for p, s in (out.get("endpoints") or {}).items()) or "none"
    head = (f"Output: endpoints {answers}; metrics {out.get('metrics') or 'not read'}; start-up log "
            f"{code(out['log_path']) if out.get('log_path') else 'not readable'}")
    if out.get("defaulted"):
        head += f"; chosen by default: {', '.join(out['defaulted'])}"
    lines = [head, "Effective: " + ("; ".join(shown) or "nothing read")]
    return lines + [f"Note: {n}" for n in out.get("notes") or []] + collapsed(ev.get("stdout") or "", "the answers in full")


def _env_summary(ev: dict[str, Any]) -> list[str] | None:
    out = ev.get("output")
    if not out:
        return None
    versions = "; ".join(f"{k} {code(str(v))}" for k, v in (out.get("versions") or {}).items()) or "none read"
    return [f"Output: versions {versions}" + (f"; not installed: {', '.join(out['missing'])}" if out.get("missing") else ""),
            *collapsed(ev.get("stdout") or "", "the report in full")]


PROBE = Probe(
    "server_view",
    tools=(Tool("server_view", ServerViewInput, parse_server_view, timeout=30.0, summary=_summary, optional=True,
                wave=2, check=True),
           Tool("server_env", ServerEnvInput, parse_server_env, timeout=120.0, summary=_env_summary, optional=True,
                wave=2, check=True)),
    second=_second, fill=_fill, diff=_diff, facts=_facts,
    quiet=("No module named", "exit 124"),   # an engine without its report module, or one too slow to answer
    diff_paths=("server_view.NAME", "server_view.versions.NAME", "server_view.env.VAR"),
)
