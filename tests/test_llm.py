"""The optional LLM advisor against a real HTTP server speaking the OpenAI chat API on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.replay import replay_events
from agent.run import RunOptions, investigate
from agent.transcript import read_events


class OpenAIish(BaseHTTPRequestHandler):
    """POST /v1/chat/completions; the answer comes from the server's `answer` function."""

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
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


@pytest.fixture
def llm_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), OpenAIish)
    srv.requests = []
    srv.answer = lambda body: (200, "{}")
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
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
