"""The optional LLM advisor against a real HTTP server speaking the OpenAI chat API on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from debugagent.agent.llm import check_llm_url
from debugagent.agent.replay import replay_events
from debugagent.agent.run import RunOptions, investigate
from debugagent.agent.transcript import read_events
from debugagent.tools.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "sk-PlantedLlmApiKey0123456789abcdef"


class OpenAIish(BaseHTTPRequestHandler):
    """POST /v1/chat/completions; the answer comes from the server's `answer` function."""

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        self.server.auth.append(self.headers.get("Authorization"))
        status, content = self.server.answer(body)
        payload = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                   "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        data = json.dumps(payload if status == 200 else {"error": {"message": content}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def serve(address: str) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((address, 0), OpenAIish)
    srv.requests, srv.auth = [], []
    srv.answer = lambda body: (200, "{}")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def llm_server():
    srv = serve("127.0.0.1")
    yield srv
    srv.shutdown()


@pytest.fixture
def outward_server(monkeypatch):
    """The loopback server, taken for a remote one: ``is_loopback`` says no for 127.0.0.1, so plain http to it is
    what plain http to another machine would be (tests reach no address but loopback)."""
    from debugagent.agent import llm
    real = llm.is_loopback
    monkeypatch.setattr(llm, "is_loopback", lambda host: False if host == "127.0.0.1" else real(host))
    srv = serve("127.0.0.1")
    yield srv
    srv.shutdown()


def candidates_of(body) -> list[str]:
    return json.loads(body["messages"][1]["content"])["candidates"]


def test_advisor_reorders_experiments_and_is_recorded(llm_server, tmp_path):
    """The advisor's order is followed (env_var first), the exchange is recorded, and replay needs no LLM."""
    def answer(body):
        c = candidates_of(body)
        return 200, json.dumps({"order": sorted(c, key=lambda x: not x.startswith("env_var")), "why": "env first"})
    llm_server.answer = answer
    out = investigate(RunOptions(host="sim:two-causes", symptom="decode 69 tok/s", baseline="decode 89 tok/s", as_json=True,
                                 out=str(tmp_path / "run"), llm=f"http://127.0.0.1:{llm_server.server_port}/v1",
                                 llm_model="test-model"))
    assert {c["hypothesis"] for c in out["root_causes"]} == {"serving_config", "env_var"}
    events = read_events(Path(out["transcript"]) / "events.jsonl")
    calls = [e for e in events if e["event"] == "llm_call"]
    assert calls and calls[0]["used"] and calls[0]["model"] == "test-model"
    starts = [e["hypothesis"] for e in events if e["event"] == "experiment" and e.get("phase") == "start"]
    assert starts[0] == "env_var"
    assert llm_server.requests and llm_server.requests[0]["model"] == "test-model"
    res = replay_events(events, playbook=None, out=tmp_path / "replay")
    assert res["same"]


def test_nothing_secret_reaches_the_llm(llm_server, tmp_path):
    """What is sent to the LLM is redacted."""
    llm_server.answer = lambda body: (200, json.dumps({"order": candidates_of(body)}))
    investigate(RunOptions(host="sim:two-causes", symptom="decode 69 tok/s", baseline="decode 89 tok/s", as_json=True,
                           out=str(tmp_path / "run"), llm=f"http://127.0.0.1:{llm_server.server_port}/v1"))
    sent = json.dumps(llm_server.requests)
    assert llm_server.requests and "hf_live" not in sent and "hf_" not in sent


def test_broken_or_nonsense_llm_keeps_the_playbook_order(llm_server, tmp_path):
    """An LLM that errors, or names no candidate, changes nothing: the playbook's order stands."""
    answers = iter([(500, "overloaded"), (200, "rm -rf / and also {\"order\": [\"make_up:thing\"]}")] * 10)
    llm_server.answer = lambda body: next(answers)
    out = investigate(RunOptions(host="sim:two-causes", symptom="decode 69 tok/s", baseline="decode 89 tok/s", as_json=True,
                                 out=str(tmp_path / "run"), llm=f"http://127.0.0.1:{llm_server.server_port}/v1"))
    assert out["root_cause"]["hypothesis"] == "serving_config"
    events = read_events(Path(out["transcript"]) / "events.jsonl")
    calls = [e for e in events if e["event"] == "llm_call"]
    assert calls and not any(c["used"] for c in calls)
    starts = [e["hypothesis"] for e in events if e["event"] == "experiment" and e.get("phase") == "start"]
    assert starts[0] == "serving_config"


# ---------------------------------------------------------------- where the API key may go
@pytest.mark.parametrize("url, key, insecure, ok", [
    ("https://api.openai.com/v1", API_KEY, False, True),
    ("http://127.0.0.1:8000/v1", API_KEY, False, True),
    ("http://127.8.9.10:8000/v1", API_KEY, False, True),
    ("http://[::1]:8000/v1", API_KEY, False, True),
    ("http://[::ffff:127.0.0.1]:8000/v1", API_KEY, False, True),
    ("http://localhost:8000/v1", API_KEY, False, True),
    ("http://llm.localhost/v1", API_KEY, False, True),
    ("http://llm.internal:8000/v1", API_KEY, False, False),
    ("http://10.0.0.5:8000/v1", API_KEY, False, False),
    ("http://localhost.example.com/v1", API_KEY, False, False),
    ("http://127.0.0.1.nip.io/v1", API_KEY, False, False),
    ("HTTP://LLM.INTERNAL/v1", API_KEY, False, False),
    ("http://user:PlantedUrlPw1@llm.internal/v1", None, False, False),   # a password in the URL is a key too
    ("http://llm.internal:8000/v1", None, False, True),    # no key: nothing secret to send
    ("http://llm.internal:8000/v1", API_KEY, True, True),  # --llm-insecure
])
def test_the_api_key_goes_only_to_https_or_loopback(url, key, insecure, ok, monkeypatch):
    """With a key, plain http is refused unless the host is loopback or --llm-insecure is given."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if key:
        monkeypatch.setenv("OPENAI_API_KEY", key)
    if ok:
        check_llm_url(url, insecure=insecure)
        return
    with pytest.raises(UsageError) as e:
        check_llm_url(url, insecure=insecure)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "--llm-insecure" in msg and "https://" in msg and "plain http" in msg
    assert API_KEY not in msg and "PlantedUrlPw1" not in msg


@pytest.mark.parametrize("url", ["not a url", "ftp://h/v1", "127.0.0.1:8000/v1", "http://", "http://h:99999/v1"])
def test_an_llm_value_that_is_no_http_url_is_exit_2(url):
    """--llm takes an http(s) base URL: anything else is refused naming the flag."""
    with pytest.raises(UsageError) as e:
        check_llm_url(url)
    assert e.value.exit_code == 2 and str(e.value).startswith("--llm ")


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_a_remote_plain_http_llm_is_refused_before_anything_is_sent(tmp_path):
    """`debugagent run --llm http://ADDR` with OPENAI_API_KEY set, ADDR not loopback: exit 2 naming --llm-insecure
    and https, before anything connects (the address is a documentation one: it is never contacted), no run
    folder is made."""
    env = {**os.environ, "OPENAI_API_KEY": API_KEY, "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    url = "http://192.0.2.1:9/v1"
    started = time.monotonic()
    r = cli("run", "--host", "sim:two-causes", "--symptom", "decode 69 tok/s", "--baseline", "decode 89 tok/s",
            "--llm", url, "--out", str(tmp_path / "run"), env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "--llm-insecure" in r.stderr and "https://" in r.stderr and url in r.stderr and API_KEY not in r.stderr
    assert time.monotonic() - started < 60 and not (tmp_path / "run").exists()


def test_a_remote_plain_http_llm_gets_no_request(outward_server, tmp_path, monkeypatch):
    """The same refusal in the run itself, against a real server taken for a remote one: it gets no request."""
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    url = f"http://127.0.0.1:{outward_server.server_port}/v1"
    with pytest.raises(UsageError):
        investigate(RunOptions(host="sim:two-causes", symptom="decode 69 tok/s", baseline="decode 89 tok/s",
                               as_json=True, out=str(tmp_path / "run"), llm=url))
    assert outward_server.requests == []


def test_llm_insecure_sends_the_key_to_a_remote_plain_http_llm(outward_server, tmp_path, monkeypatch):
    """With --llm-insecure the same server gets the requests, and the key in their Authorization header."""
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    outward_server.answer = lambda body: (200, json.dumps({"order": candidates_of(body)}))
    url = f"http://127.0.0.1:{outward_server.server_port}/v1"
    investigate(RunOptions(host="sim:two-causes", symptom="decode 69 tok/s", baseline="decode 89 tok/s", as_json=True,
                           out=str(tmp_path / "run"), llm=url, llm_insecure=True))
    assert outward_server.requests and set(outward_server.auth) == {f"Bearer {API_KEY}"}
    assert API_KEY.encode() not in b"".join(p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file())


def test_a_loopback_llm_gets_the_key_over_plain_http(llm_server, tmp_path, monkeypatch):
    """A server on 127.0.0.1 (a local one, or an SSH tunnel) needs no flag: it gets the key; no artifact holds it."""
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    llm_server.answer = lambda body: (200, json.dumps({"order": candidates_of(body)}))
    investigate(RunOptions(host="sim:two-causes", symptom="decode 69 tok/s", baseline="decode 89 tok/s", as_json=True,
                           out=str(tmp_path / "run"), llm=f"http://127.0.0.1:{llm_server.server_port}/v1"))
    assert llm_server.requests and set(llm_server.auth) == {f"Bearer {API_KEY}"}
    assert API_KEY.encode() not in b"".join(p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file())


def test_the_advisor_itself_refuses_a_key_over_remote_plain_http():
    """Built directly (not through the run's flag check), the advisor refuses too, and takes --llm-insecure."""
    from debugagent.agent.llm import Advisor
    with pytest.raises(UsageError):
        Advisor("http://10.0.0.5:8000/v1", "m", api_key=API_KEY)
    assert Advisor("http://10.0.0.5:8000/v1", "m", api_key=API_KEY, insecure=True).model == "m"
