"""Redaction of secrets before anything is written or sent to an LLM."""

from __future__ import annotations

import re
from typing import Any

SECRET_NAME = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)
REDACTED = "[REDACTED]"
_VALUE_PATTERNS = [
    re.compile(r"hf_[A-Za-z0-9_]{8,}"),
    re.compile(r"sk-[A-Za-z0-9_-]{16,}"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"xox[baprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
]
_ASSIGN = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)[A-Za-z0-9_]*)=([^\s'\"]+)", re.I)
_FLAG = re.compile(r"(--[A-Za-z0-9-]*(?:token|key|secret|password)[A-Za-z0-9-]*)([ =])([^\s'\"]+)", re.I)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) and v else redact_text(v)) for k, v in env.items()}


def redact_text(text: str) -> str:
    """Hide token-shaped values, ``NAME_TOKEN=value`` assignments and ``--api-key value`` flags."""
    if not text:
        return text
    for pat in _VALUE_PATTERNS:
        text = pat.sub(REDACTED, text)
    text = _ASSIGN.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    text = _FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return text


def redact(obj: Any) -> Any:
    """Redact every string inside a JSON-like value; keys named like secrets hide their value."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v and k not in ("tool",):
                out[k] = REDACTED
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    return obj
