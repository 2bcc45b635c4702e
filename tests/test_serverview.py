"""The server's own view (`server_view`): real HTTP servers on 127.0.0.1 answering as SGLang and vLLM do, their
start-up logs, the snapshot field and its diff, the facts the changed_default hypothesis reads, and replays of
recordings made before the probe existed."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from debugagent.agent.playbook import load_playbook
from debugagent.agent.transcript import read_events
from debugagent.tools import probes
from debugagent.tools.host import ServerInfo
from debugagent.tools.probes.base import FactsInput, Gathering
from debugagent.tools.probes.serverview import ENDPOINTS, ServerView, ServerViewInput, default_changed
from debugagent.tools.registry import Runner
from debugagent.tools.replay import ReplayTransport
from debugagent.tools.serverinfo import EffectiveConfig
from debugagent.tools.snapshot import Snapshot, collect, diff
from debugagent.tools.transport import LocalTransport

ROOT = Path(__file__).resolve().parent.parent
V = ROOT / "tests" / "vectors" / "engines"
KNOWLEDGE = load_playbook(None).knowledge


def serve(routes: dict[str, str]) -> Iterator[int]:
    """A real HTTP server on 127.0.0.1 answering ``routes`` (path -> body) with 200, anything else 404."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            data = (body or '{"detail":"Not Found"}').encode()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args) -> None:  # noqa: A002
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def old_sglang() -> Iterator[int]:
    """An SGLang that only has the deprecated /get_server_info and /get_model_info, metrics off."""
    yield from serve({"/get_server_info": (V / "sglang_get_server_info.json").read_text(),
                      "/get_model_info": (V / "sglang_model_info.json").read_text()})


@pytest.fixture
def vllm() -> Iterator[int]:
    yield from serve({"/version": (V / "vllm_version.json").read_text(), "/metrics": (V / "vllm_metrics.txt").read_text()})


def call(inp: ServerViewInput):
    return Runner(LocalTransport()).call("server_view", inp)


def test_sglang_deprecated_endpoints_and_metrics_off(old_sglang, tmp_path):
    """/server_info 404 falls back to /get_server_info (and /model_info to /get_model_info); /metrics 404 is
    "metrics off", no error; the log file is the first readable one; the backend it chose by default is named."""
    log = tmp_path / "server.log"
    log.write_text((V / "sglang_startup.log").read_text())
    o = call(ServerViewInput(python="python3", port=old_sglang, engine="sglang", endpoints=ENDPOINTS["sglang"],
                             logs=[str(tmp_path / "missing.log"), str(log)]))
    assert o.ok, o.error
    v: ServerView = o.output
    assert v.endpoints == {"/server_info": 404, "/get_server_info": 200, "/model_info": 404, "/get_model_info": 200,
                           "/metrics": 404}
    assert v.metrics == "off" and v.log_path == str(log) and v.defaulted == ["attention_backend"]
    assert v.effective.attention_backend == "fa3" and v.effective.sources["attention_backend"] == "server_info.internal_states"
    assert v.effective.version == "0.5.6" and v.effective.kv_cache_tokens == 712440 and v.notes == []


def test_vllm_version_metrics_and_its_log(vllm, tmp_path):
    """vLLM: /version, the cache config's labels from /metrics, the backend from the log (no flag chose it)."""
    log = tmp_path / "vllm.log"
    log.write_text((V / "vllm_startup.log").read_text())
    o = call(ServerViewInput(python="python3", port=vllm, engine="vllm", endpoints=ENDPOINTS["vllm"], logs=[str(log)]))
    v: ServerView = o.output
    assert o.ok and v.endpoints["/version"] == 200 and v.endpoints["/server_info?config_format=json"] == 404
    assert v.metrics == "on" and v.effective.version == "0.11.0" and v.effective.attention_backend == "FLASH_ATTN"
    assert v.defaulted == ["attention_backend"] and v.effective.kv_cache_tokens


def test_a_server_that_does_not_answer_is_noted_not_fatal(tmp_path):
    """Nothing listening: each endpoint is "no answer" in the notes; the view still holds the log's facts."""
    with _closed_port() as port:
        log = tmp_path / "s.log"
        log.write_text("[t] Attention backend not specified. Use flashinfer backend by default.\n")
        o = call(ServerViewInput(python="python3", port=port, engine="sglang", endpoints=ENDPOINTS["sglang"],
                                 logs=[str(log)]))
    assert o.ok and set(o.output.endpoints.values()) == {0} and o.output.metrics is None
    assert any("no answer" in n for n in o.output.notes) and o.output.effective.attention_backend == "flashinfer"


class _closed_port:
    """A port on 127.0.0.1 that nothing listens on."""

    def __enter__(self) -> int:
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *a: object) -> None:
        pass


def _snap(view: ServerView | None, flags: dict[str, str | bool] | None = None) -> Snapshot:
    server = ServerInfo(pid=5, argv=["python3", "-m", "sglang.launch_server"], flags=flags or {}, kind="sglang")
    return Snapshot(host="h", server=server, server_view=view)


def _view(backend: str, defaulted: bool = True, version: str = "0.5.6", engine: str = "sglang") -> ServerView:
    return ServerView(engine=engine, defaulted=["attention_backend"] if defaulted else [],
                      effective=EffectiveConfig(engine=engine, version=version, attention_backend=backend,  # type: ignore[arg-type]
                                                sources={"attention_backend": "server_info.internal_states"}))


def test_snapshots_without_the_field_still_load_and_diff():
    """A snapshot written before `server_view` existed loads (None) and diffs against a new one with no change of it."""
    old = json.loads((ROOT / "tests" / "vectors" / "h200" / "lab_baseline_snapshot.json").read_text())
    assert "server_view" not in old
    snap = Snapshot.model_validate(old)
    assert snap.server_view is None
    new = snap.model_copy(update={"server_view": _view("fa3")})
    assert [c.path for c in diff(snap, new) if c.path.startswith("server_view")] == []
    changes = {c.path: (c.a, c.b) for c in diff(_snap(_view("flashinfer", version="0.5.5")), _snap(_view("fa3")))}
    assert changes == {"server_view.version": ("0.5.5", "0.5.6"), "server_view.attention_backend": ("flashinfer", "fa3")}


def test_default_changed_against_the_baseline_and_from_knowledge():
    """With a baseline view: an effective setting that changed behind equal flags, with the flag that pins the old
    value. Without one: a default the log says was chosen and the playbook knows changed. A flag given is no default."""
    bad, good = _snap(_view("fa3")), _snap(_view("flashinfer"))
    got = default_changed(bad, FactsInput(baseline=good, knowledge=KNOWLEDGE, so_far={}))
    assert [(d["how"], d["setting"], d["flag"], d["before"], d["after"]) for d in got] == [
        ("baseline", "attention_backend", "attention-backend", "flashinfer", "fa3")]
    got = default_changed(bad, FactsInput(baseline=None, knowledge=KNOWLEDGE, so_far={}))
    assert [(d["how"], d["before"], d["after"], d["logged"]) for d in got] == [("knowledge", "flashinfer", "fa3", True)]
    assert "sgl-project/sglang#5064" in got[0]["why"]
    pinned = _snap(_view("fa3", defaulted=False), flags={"attention-backend": "fa3"})
    assert default_changed(pinned, FactsInput(baseline=None, knowledge=KNOWLEDGE, so_far={})) == []
    assert default_changed(_snap(_view("flashinfer")), FactsInput(baseline=None, knowledge=KNOWLEDGE, so_far={})) == []
    unlogged = default_changed(_snap(_view("fa3", defaulted=False)), FactsInput(baseline=None, knowledge=KNOWLEDGE, so_far={}))
    assert [(d["after"], d["logged"]) for d in unlogged] == [("fa3", False)]   # no log read, and no flag sets it
    # vLLM 0.18.2 on ROCm: TRITON_ATTN where ROCM_ATTN was chosen (vllm-project/vllm#39965); not before that version
    rocm = default_changed(_snap(_view("TRITON_ATTN", version="0.18.2", engine="vllm")),
                           FactsInput(baseline=None, knowledge=KNOWLEDGE, so_far={}))
    assert [(d["before"], d["flag"], d["since"]) for d in rocm] == [("ROCM_ATTN", "attention-backend", "0.18.2")]
    assert default_changed(_snap(_view("TRITON_ATTN", version="0.18.1", engine="vllm")),
                           FactsInput(baseline=None, knowledge=KNOWLEDGE, so_far={})) == []
    assert default_changed(_snap(None), FactsInput(baseline=good, knowledge=KNOWLEDGE, so_far={})) == []


def test_a_replay_of_a_recording_made_before_the_probe_leaves_it_out():
    """Replaying a kept recording (no server_view call in it) plans no server_view call; a live host gets one."""
    # the H200 lab's env case as recorded on 2026-12-02, before the probe (transcripts/h200 was recorded again since)
    events = read_events(ROOT / "tests" / "vectors" / "recordings" / "h200-2026-12-02" / "env" / "events.jsonl")
    replay = ReplayTransport(events)
    assert replay.recorded_tools is not None and "server_view" not in replay.recorded_tools
    assert "python_packages" in replay.recorded_tools
    disc = type("D", (), {"server": ServerInfo(pid=5, argv=["python3", "-m", "sglang.launch_server"], kind="sglang",
                                                ports=[30000])})()
    for transport, wanted in ((replay, False), (LocalTransport(), True)):
        g = Gathering(Runner(transport), discovery=disc, python="python3")  # type: ignore[arg-type]
        names = [c[0] for c in probes.plan(g, 2)]
        assert ("server_view" in names) is wanted and "python_packages" in names


def test_simulated_servers_serve_the_engines_endpoints_and_log_lines(sim_host, tmp_path):
    """The simulated SGLang answers /server_info and /metrics (--enable-metrics) and logs the backend it chose by
    default; the good state chose another, which `debugagent diff` files under changed_default; a vLLM host answers
    /version and its metrics."""
    bad = collect(Runner(sim_host("sim:attention-default-changed")))
    good = collect(Runner(sim_host("sim:attention-default-changed@good")))
    assert bad.errors == [] and bad.server_view is not None and good.server_view is not None
    v = bad.server_view
    assert v.endpoints == {"/server_info": 200, "/model_info": 200, "/metrics": 200} and v.metrics == "on"
    assert bad.server is not None and v.log_path == f"/proc/{bad.server.pid}/fd/1"
    assert v.defaulted == ["attention_backend"] and v.effective.attention_backend == "fa3"
    assert v.effective.version == "0.5.6" and v.effective.model == "Qwen/Qwen3-8B" and v.effective.tp_size == 1
    assert good.server_view.effective.attention_backend == "flashinfer" and good.server_view.effective.version == "0.5.5"
    # the engine's own report (python -m sglang.check_env): versions as installed, the driver nvidia-smi reports; a
    # version change the packages' diff reports already is not reported twice
    assert v.effective.sources["versions"] == "sglang.check_env" and v.effective.versions["driver"] == "580.159.04"
    assert (good.server_view.effective.versions["sglang"], v.effective.versions["sglang"]) == ("0.5.5", "0.5.6")
    assert {c.path for c in diff(good, bad)} == {"packages.sglang.version", "server_view.attention_backend"}
    import subprocess
    import sys

    from debugagent.tools.snapshot import dump
    (tmp_path / "good.json").write_text(dump(good))
    (tmp_path / "bad.json").write_text(dump(bad))
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "diff", str(tmp_path / "good.json"),
                        str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "changed_default\n  server_view.attention_backend: 'flashinfer' -> 'fa3'" in r.stdout   # 1: they differ, as diff(1)
    vl = collect(Runner(sim_host("sim:vllm-console-worker")), probes=["server_view", "server_env"]).server_view
    assert vl is not None and vl.engine == "vllm" and vl.endpoints["/version"] == 200 and vl.metrics == "on"
    assert vl.effective.version == "0.11.0"
    assert vl.effective.versions["vllm"] == "0.11.0" and vl.effective.sources["versions"] == "collect_env"


@pytest.mark.parametrize("baseline", ["numbers", "snapshot"])
def test_the_pinning_experiment_confirms_a_changed_default(sim_host, tmp_path, baseline):
    """sim:attention-default-changed: the same flags, a newer sglang choosing fa3 by default. Restarting with
    --attention-backend flashinfer pinned recovers the regression, from the numbers alone (the playbook knows the
    old default) and against the @good snapshot (the baseline's effective value); the fix is the explicit flag."""
    from debugagent.agent.run import RunOptions, investigate
    from debugagent.tools.snapshot import dump
    snap = None
    if baseline == "snapshot":
        snap = tmp_path / "good.json"
        snap.write_text(dump(collect(Runner(sim_host("sim:attention-default-changed@good")), bench_runs=3,
                                     metric="decode")))
    out = investigate(RunOptions(host="sim:attention-default-changed", symptom="decode 19ms", as_json=True,
                                 baseline=None if snap else "decode 14ms", baseline_snapshot=str(snap) if snap else None,
                                 out=str(tmp_path / "run")))
    assert out["exit_code"] == 0, out["summary"]
    rc = out["root_cause"]
    assert rc["hypothesis"] == "changed_default" and rc["how"] == "experiment" and rc["explains"] > 0.6
    md = (Path(out["transcript"]) / "transcript.md").read_text()
    todo = md[md.index("## What to do now"):]
    assert "--tp 1 --port 30000 --enable-metrics --attention-backend flashinfer" in todo.split("\n## ")[0]
    assert ("where the baseline ran flashinfer" in md) is (baseline == "snapshot")
    assert ("chose fa3 by default; it chose flashinfer before" in md) is (baseline == "numbers")


def test_a_secret_the_server_echoes_stays_out_of_the_view_and_the_record(tmp_path):
    """SGLang's /server_info and its ServerArgs line echo --api-key: the view keeps none of it, and the raw
    answer as recorded (redacted) holds no secret."""
    from debugagent.tools.redact import redact_text
    secret = "sk-live-planted-4f9a2c7e1b"
    info = json.loads((V / "sglang_get_server_info.json").read_text()) | {"api_key": secret}
    log = tmp_path / "s.log"
    log.write_text(f"[t] server_args=ServerArgs(model_path='m', api_key='{secret}', attention_backend='fa3')\n")
    for port in serve({"/server_info": json.dumps(info)}):
        o = call(ServerViewInput(python="python3", port=port, engine="sglang", endpoints=ENDPOINTS["sglang"],
                                 logs=[str(log)]))
        assert o.ok and o.output.effective.attention_backend == "fa3" and secret in o.result.stdout
        assert secret not in o.output.model_dump_json() and secret not in redact_text(o.result.stdout)


def test_unsealed_simulated_servers_on_one_loopback_each_answer_for_themselves(tmp_path):
    """Two hosts that are not sealed share this machine's 127.0.0.1: the second's server finds port 30000 taken,
    says so in its log and listens on another, so neither host's view is the other's."""
    from debugagent.tools.sim import load_scenario
    from debugagent.tools.sim.sandbox import SimHost
    sc = load_scenario("attention-default-changed")
    a = SimHost(sc, "bad", root=str(tmp_path / "a"), sealed=False)
    try:
        b = SimHost(sc, "good", root=str(tmp_path / "b"), sealed=False)
        try:
            logs = a.exec("cat /tmp/server.log").stdout + b.exec("cat /tmp/server.log").stdout
            ports = [int(p) for p in re.findall(r"listening on 127\.0\.0\.1:(\d+)", logs)]
            assert len(ports) <= 1, logs   # this machine may hold 30000 already: then both moved
            answers = {}
            for h in (a, b):
                log = h.exec("cat /tmp/server.log").stdout
                moved = re.findall(r"listening on 127\.0\.0\.1:(\d+)", log)
                port = int(moved[0]) if moved else 30000
                r = h.exec(f"python3 -c 'import urllib.request as u; print(u.build_opener(u.ProxyHandler({{}}))"
                           f".open(\"http://127.0.0.1:{port}/server_info\", timeout=3).read().decode())'")
                answers[h.which] = json.loads(r.stdout)["attention_backend"]
            assert answers == {"bad": "fa3", "good": "flashinfer"}
        finally:
            b.close()
    finally:
        a.close()


def test_a_log_appended_across_restarts_is_read_from_its_last_start(tmp_path):
    """A log the server appends to at every start holds each start-up: the view reads the last one (what runs now),
    not the first (what ran before the upgrade)."""
    old = ("[t] INFO server_args.py:1970: Attention backend not specified. Use flashinfer backend by default.\n"
           "[t] INFO engine.py:157: server_args=ServerArgs(model_path='m', attention_backend='flashinfer', tp_size=1)\n"
           + "[t] INFO: 127.0.0.1 - \"POST /generate HTTP/1.1\" 200\n" * 50)
    log = tmp_path / "server.log"
    log.write_text(old + (V / "sglang_startup.log").read_text())
    with _closed_port() as port:
        o = call(ServerViewInput(python="python3", port=port, engine="sglang", endpoints=ENDPOINTS["sglang"],
                                 logs=[str(log)]))
    assert o.ok and o.output.effective.attention_backend == "fa3" and o.output.effective.tp_size == 2
    assert o.output.notes and all("no answer" in n for n in o.output.notes)   # the disagreeing old start is not read


def test_a_server_bound_to_ipv6_loopback_is_asked_there():
    """`--host ::1`: the GETs go to [::1], where the server listens."""
    import socket

    class V6(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"version": "0.11.0"}' if self.path == "/version" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:  # noqa: A002
            pass

    try:
        httpd = V6(("::1", 0), H)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        o = call(ServerViewInput(python="python3", port=httpd.server_address[1], address="::1", engine="vllm",
                                 endpoints=ENDPOINTS["vllm"]))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert o.ok and o.output.endpoints["/version"] == 200 and o.output.effective.version == "0.11.0"
