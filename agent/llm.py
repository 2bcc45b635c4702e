"""An optional LLM advisor (any OpenAI-compatible server, ``--llm URL``).

It is asked one question: in which order to run the candidate experiments. Its answer is
data, checked against the candidates (unknown ids are dropped, missing ones keep the
playbook's order); nothing it says is ever run. What it is sent is redacted first, and
the exchange is recorded as an ``llm_call`` event, so a replay needs no LLM.

The API key (``OPENAI_API_KEY``, or a password in the URL) is sent only to an ``https``
URL or a loopback one (``127.0.0.0/8``, ``::1``, ``localhost``: a local server or an SSH
tunnel); any other ``http`` URL is refused (exit 2) unless the user says ``--llm-insecure``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from debugagent.tools.errors import UsageError
from debugagent.tools.redact import redact, redact_text

if TYPE_CHECKING:
    from .events import EventBase

SYSTEM = ("You advise a performance-regression investigation on a GPU inference host. Given the evidence and the "
          "candidate experiments, answer with JSON only: {\"order\": [candidate ids, most likely cause first], "
          "\"why\": \"one sentence\"}.")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also written as an IPv4-mapped address), ``localhost`` and ``*.localhost``."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def check_llm_url(url: str, *, insecure: bool = False, api_key: str | None = None) -> None:
    """Refuse (``UsageError``, exit 2) an ``--llm`` value that is no http(s) URL, or one that would carry the
    API key in clear: plain ``http`` to a host that is not this machine's loopback, without ``--llm-insecure``."""
    shown = redact_text(url)
    try:
        parts = urlsplit(url.strip())
        parts.port   # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise UsageError(f"--llm {shown}: not a URL ({exc})", fix="give the server's base URL, e.g. https://api.openai.com/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--llm {shown}: not an http(s) URL",
                         fix="give the base URL of an OpenAI-compatible server, e.g. https://api.openai.com/v1 "
                             "or http://127.0.0.1:8000/v1")
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if parts.scheme == "https" or not (key or parts.password) or is_loopback(parts.hostname) or insecure:
        return
    what = "the API key (OPENAI_API_KEY)" if key else "the password in the URL"
    raise UsageError(f"--llm {shown}: {what} would be sent in clear over plain http to {parts.hostname}",
                     fix=f"use https://{parts.netloc.rpartition('@')[2]}{parts.path}, or a loopback URL (an SSH tunnel: "
                         f"ssh -L 8000:{parts.hostname}:{parts.port or 80} HOST, then --llm http://127.0.0.1:8000{parts.path}), "
                         "or add --llm-insecure to send it anyway")


def _key(hid: str, spec: dict[str, Any]) -> str:
    return f"{hid}:{spec['kind']}:{spec.get('title', '')}"


def _apply(candidates: list[tuple[str, dict[str, Any]]], order: list[str]) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    by = {_key(h, s): (h, s) for h, s in candidates}
    picked = [by[k] for k in order if k in by]
    seen = {_key(h, s) for h, s in picked}
    rest = [c for c in candidates if _key(*c) not in seen]
    return picked + rest, bool(picked)


class Advisor:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 30.0,
                 insecure: bool = False) -> None:
        check_llm_url(base_url, insecure=insecure, api_key=api_key)
        from openai import OpenAI
        self.model = model
        self.client = OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                             timeout=timeout, max_retries=1)

    def order(self, candidates: list[tuple[str, dict[str, Any]]], facts: dict[str, Any], hyps: dict[str, Any],
              transcript: Any) -> list[tuple[str, dict[str, Any]]]:
        ids = [_key(h, s) for h, s in candidates]
        evidence = {h: {"status": v["status"], "because": v["because"]} for h, v in hyps.items()}
        user = json.dumps(redact({"symptom": facts.get("symptom"), "regression": facts.get("regression"),
                                  "evidence": evidence, "candidates": ids}), default=str)[:12000]
        answer, note, used = "", "", False
        try:
            resp = self.client.chat.completions.create(
                model=self.model, temperature=0,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
            answer = resp.choices[0].message.content or ""
            m = re.search(r"\{.*\}", answer, re.S)
            data = json.loads(m.group(0)) if m else {}
            order = [str(x) for x in data.get("order", []) if isinstance(x, str)]
            new, used = _apply(candidates, order)
            note = str(data.get("why", ""))[:300] if used else "the answer named no candidate; playbook order kept"
        except Exception as exc:  # noqa: BLE001 - the advisor is optional: any failure keeps the playbook order
            new, note = candidates, f"LLM unavailable ({type(exc).__name__}: {str(exc)[:120]}); playbook order kept"
        transcript.emit("llm_call", model=self.model, prompt=user, answer=answer, used=used, note=note,
                        order=[_key(h, s) for h, s in new])
        return new


class RecordedAdvisor:
    """Answers from a recording's ``llm_call`` events, in order (for replay)."""

    def __init__(self, calls: Sequence[Mapping[str, Any] | EventBase]) -> None:
        self.calls = list(calls)

    def order(self, candidates, facts, hyps, transcript):
        if not self.calls:
            return candidates
        call = self.calls.pop(0)
        new, used = _apply(candidates, call.get("order") or [])
        transcript.emit("llm_call", model=call.get("model"), prompt=call.get("prompt"), answer=call.get("answer"),
                        used=call.get("used"), note="replayed: " + str(call.get("note", "")), order=[_key(h, s) for h, s in new])
        return new
