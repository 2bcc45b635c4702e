"""The one redactor: secrets are hidden before anything is written, printed or sent to an LLM.

What counts as a secret:

* a value under a secret *name*: an environment variable, a ``--flag`` (its value after
  ``=`` or in the next argument), a JSON/YAML key. Names are split into words (``_``,
  ``-``, ``.``, camelCase) and matched word by word, so ``HF_TOKEN``, ``--api-key`` and
  ``--admin-password`` are secret while ``--max-num-batched-tokens``,
  ``--speculative-num-draft-tokens`` and ``VLLM_MAX_TOKENS_PER_EXPERT`` (the flags a
  diagnosis needs) stay readable; a name ending in a word such as ``file`` or ``path``
  (``--ssl-keyfile``, ``KEY_PATH``) names where a secret is, not the secret;
* a value of its own shape, wherever it appears: PEM private keys (also cut off or spread
  over lines), JWTs, ``Authorization``/``Cookie`` headers and bearer tokens, credentials in
  URLs (``scheme://user:PASSWORD@``, a DSN's key), webhook URLs, well-known token prefixes
  (``hf_``, ``ghp_``, ``github_pat_``, ``glpat-``, ``sk-``, ``xox…-``, ``AKIA…``, ``AIza…``,
  ``pypi-``, ``npm_``, ``SG.``);
* a value seen once under a secret name: the redactor remembers it (8 characters or
  more) and hides it wherever it shows up later (a ``ps`` line, a log).

What is never a secret, whatever the name before it (``plain_value``): a switch's state
(``PasswordAuthentication=no``), a word of prose after a flag named in a sentence (``Add
--api-key support``), an absolute path under a standard folder (the file that holds the
secret). Names about a secret rather than holding one (``SSH_AUTH_SOCK``, ``--key-dim``,
``VLLM_KEY_CACHE_DTYPE``, ``public_key``) end in, or start with, a word that says so.
``tests/redaction_corpus.py`` measures precision and recall over real host outputs and
planted fake secrets (``bench/redaction`` prints them).

``redact`` walks JSON-like values (dicts, lists, tuples); ``redact_text`` takes text;
``redact_argv`` an argument vector. ``write_private`` and ``redacted_dump`` write files
mode 0600 (folders 0700) after redaction.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REDACTED = "[REDACTED]"

# a name is secret when one of its words is one of these
SECRET_WORDS = frozenset({
    "token", "secret", "secrets", "password", "passwd", "passphrase", "key", "apikey", "accesskey",
    "secretkey", "privatekey", "authtoken", "accesstoken", "refreshtoken", "clientsecret", "credential",
    "credentials", "creds", "auth", "authorization", "cookie", "dsn", "webhook", "signature", "sig", "salt",
    "session", "sessionid",
})
# ... unless its last word says it names where the secret is, or something about it
NOT_SECRET_LAST = frozenset({"file", "path", "dir", "name", "names", "type", "size", "len", "length", "id", "ids",
                             "count", "format", "mode", "url_file", "env", "var", "header_name",
                             # settings about a secret, not the secret: `--auth-required`, `AUTH_METHOD`, `--auth-timeout`
                             "required", "enabled", "disabled", "method", "timeout", "ttl", "level", "backend",
                             "provider", "scheme", "strategy", "algorithm", "version",
                             # a setting or a socket, not the secret: `PasswordAuthentication`, `SSH_AUTH_SOCK`
                             "authentication", "sock", "socket",
                             # a dimension or a count: `--key-dim 128`, `--token-budget`
                             "dim", "dims", "bits", "interval", "index", "idx", "budget", "limit", "ratio",
                             "prefix", "policy", "dtype", "rate", "cache", "manager"})
# a switch (`--enable-auth`, `--no-auth`, `--use-token`) takes no value: the next argument is not its secret
NOT_SECRET_FIRST = frozenset({"enable", "disable", "no", "use", "require", "allow", "skip", "with", "without",
                              # half of a key pair that is published: `public_key`, `--public-key`
                              "public"})
NOT_SECRET_NAMES = frozenset({"tool", "key_id", "max_tokens", "hostkey", "host_key", "known_hosts", "pubkey",
                              # names the file that holds the credentials (a path), by Google's convention
                              "google_application_credentials"})
# values that are never a secret, whatever the name before them: a switch's state, or a word of prose
# after a flag named in a sentence (`Add --api-key support`)
NOT_SECRET_VALUES = frozenset({"yes", "no", "true", "false", "on", "off", "none", "null", "enabled", "disabled",
                               "support", "flag", "option", "argument", "parameter", "and", "or", "to", "for", "in",
                               "is", "was", "the", "a", "an", "with", "when", "from", "handling", "parsing",
                               "validation", "now", "not", "as", "of", "by", "at", "if", "it"})
# an absolute path under a standard folder names where a secret is kept, not the secret
_PATH_VALUE = re.compile(r"(?:~|/(?:etc|var|run|root|home|tmp|opt|usr|srv|mnt|data|workspace|models|secrets|dev|app|"
                         r"cache|nfs|scratch))(?:/[\w.@:+-]+)+/?")


def plain_value(value: str) -> bool:
    """A value that is no secret under any name: a switch's state, a word of prose, a path to a file."""
    v = value.strip().strip("'\"")
    return v.lower() in NOT_SECRET_VALUES or bool(_PATH_VALUE.fullmatch(v))

# substrings without which no secret name can occur (SECRET_WORDS, lowercased)
_NAME_ANCHORS = ("token", "secret", "passw", "passphrase", "key", "cred", "auth", "cookie", "dsn", "webhook", "sig",
                 "salt", "session")
_HEADER_ANCHORS = ("authorization", "cookie", "api-key", "auth-token", "access-token", "private-token", "bearer",
                   "basic", "token")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def name_words(name: str) -> list[str]:
    """``--apiKey`` -> ``["api", "key"]``; ``VLLM_MAX_TOKENS`` -> ``["vllm", "max", "tokens"]``."""
    return [w.lower() for w in _WORD_SPLIT.split(name) if w]


@functools.lru_cache(maxsize=65536)
def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or key of this name holds a secret (matched as whole words)."""
    if not name or name.lower().lstrip("-") in NOT_SECRET_NAMES:
        return False
    words = name_words(name)
    if not words or words[-1] in NOT_SECRET_LAST or (len(words) > 1 and words[0] in NOT_SECRET_FIRST):
        return False
    return any(w in SECRET_WORDS for w in words)


# ---------------------------------------------------------------- value detectors
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY[A-Z ]*)-----.*?(?:-----END \1-----|\Z)", re.S)
_PEM_ESCAPED = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----(?:\\n|\\r|[A-Za-z0-9+/= \t\r\n])*"
                          r"(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----)?")
_TOKENS = re.compile(r"\b(?:" + "|".join([
    r"hf_(?=[a-z]*[A-Z0-9])[A-Za-z0-9]{8,}",   # a token mixes case or digits; a module name (hf_transfer) does not
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{16,}",
    r"glpat-[A-Za-z0-9_-]{12,}",
    r"gl(?:ptt|dt|rt|cbt|imt|agent|soat)-[A-Za-z0-9_-]{12,}",
    r"sk-(?:proj-|ant-|live-)?[A-Za-z0-9_-]{16,}",
    r"[rs]k_(?:live|test)_[A-Za-z0-9]{12,}",
    r"xox[abposr]-[A-Za-z0-9-]{10,}",
    r"xapp-[A-Za-z0-9-]{10,}",
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b",
    r"AIza[0-9A-Za-z_-]{35}",
    r"pypi-[A-Za-z0-9_-]{16,}",
    r"npm_[A-Za-z0-9]{20,}",
    r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}",
    r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
]) + ")")
_HEADER = re.compile(r"(?i)(?<![\w-])((?:proxy-)?authorization|cookie|set-cookie|x-api-key|api-key|x-auth-token|"
                     r"x-access-token|private-token|x-goog-api-key)(\s*[:=]\s*)([^\r\n\"']+)")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/-]{8,}=*)|\b(basic|token)(\s+)(?=[A-Za-z0-9._~+/-]*\d)"
                     r"(?=[A-Za-z0-9._~+/-]*[A-Za-z])([A-Za-z0-9._~+-][A-Za-z0-9._~+/-]{15,}=*)")
# scheme://user:password@host  and  scheme://KEY@host (a DSN); the user of scp-like git URLs is kept
_URL_CRED = re.compile(r"(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)([^\s/@:'\"<>]*):([^\s/@'\"<>]+)@")
_URL_USER = re.compile(r"(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)([A-Za-z0-9_-]{16,})@")
_WEBHOOK = re.compile(r"(?i)\b(https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)|"
                      r"(?:[a-z0-9-]+\.)?discord(?:app)?\.com/api/webhooks|[^\s/'\"]+/(?:api/)?webhooks?)/)"
                      r"[^\s'\"<>]+")
_URL_QUERY = re.compile(r"([?&])([A-Za-z0-9_.-]+)=([^&\s'\"#<>]+)")

# NAME=value (a line of an environment dump takes the rest of the line); --flag=value / --flag value
_VALUE = r"(\"(?:[^\"\\]|\\.)*\"|'[^']*'|\$'(?:[^'\\]|\\.)*'|[^\s'\"]+)"
# (``+NAME=value``: server_details marks each entry of /proc/PID/environ with a leading ``+``)
_LINE_ASSIGN = re.compile(r"(?m)^(\s*(?:export\s+)?\+?)([A-Za-z_][A-Za-z0-9_.-]*)=(.+)$")
_ASSIGN = re.compile(r"(?<![\w./-])([A-Za-z_][A-Za-z0-9_.]*)=" + _VALUE)
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.-]*)(=|[^\S\n]+|[^\S\n]*\n)(?![-=])" + _VALUE)
# an argument vector written as a JSON or Python list: `"--api-key", "VALUE"`
_QUOTED_FLAG = re.compile(r"(?<=[\"'])(--?[A-Za-z][A-Za-z0-9_.-]*)([\"']\s*,\s*)(\"(?:[^\"\\]|\\.)*\"|'[^']*')")
_KEYVAL = re.compile(r"(?<![\w.\"'-])([\"']?)([A-Za-z_][A-Za-z0-9_.-]*)\1(\s*:\s*)(\[REDACTED\]|\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s,}\]]+)")


class Redactor:
    """Detectors plus the secret values learned so far (a value seen once under a secret name)."""

    MIN_LEARNED = 8

    def __init__(self) -> None:
        self._learned: set[str] = set()
        self._learned_re: re.Pattern[str] | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ learning
    def learn(self, value: str) -> None:
        v = value.strip().strip("'\"")
        if len(v) < self.MIN_LEARNED or "REDACTED" in v or v in self._learned:
            return
        with self._lock:
            self._learned.add(v)
            alts = sorted(self._learned, key=len, reverse=True)
            self._learned_re = re.compile("|".join(re.escape(a) for a in alts))

    def _secret(self, value: str) -> str:
        """The replacement of a value under a secret name (the value is remembered)."""
        if value and value != REDACTED:
            self.learn(value)
        return REDACTED

    # ------------------------------------------------------------ text
    def text(self, text: str) -> str:
        """Hide every secret in free text (command lines, outputs, messages)."""
        if not text or not isinstance(text, str):
            return text
        low = text.lower()   # each detector runs only where its anchor occurs (large outputs stay fast)
        if "private key" in low:
            text = _PEM.sub(REDACTED, text)
            text = _PEM_ESCAPED.sub(REDACTED, text)
        if "://" in low:
            text = _WEBHOOK.sub(lambda m: m.group(1) + REDACTED, text)
            text = _URL_CRED.sub(lambda m: f"{m.group(1)}{m.group(2)}:{self._secret(m.group(3))}@", text)
            text = _URL_USER.sub(lambda m: f"{m.group(1)}{self._secret(m.group(2))}@", text)
        if "?" in low or "&" in low:
            text = _URL_QUERY.sub(lambda m: m.group(0) if not is_secret_name(m.group(2))
                                  else f"{m.group(1)}{m.group(2)}={self._secret(m.group(3))}", text)
        if any(w in low for w in _HEADER_ANCHORS):
            text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{self._secret(m.group(3))}", text)
            text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{self._secret(m.group(3))}" if m.group(1)
                               else f"{m.group(4)}{m.group(5)}{self._secret(m.group(6))}", text)
        text = _TOKENS.sub(REDACTED, text)
        if not any(w in low for w in _NAME_ANCHORS):
            return self._learned_re.sub(REDACTED, text) if self._learned_re is not None else text
        text = _LINE_ASSIGN.sub(self._line_assign, text)
        text = _ASSIGN.sub(lambda m: m.group(0) if not is_secret_name(m.group(1)) or plain_value(m.group(2))
                           else f"{m.group(1)}={self._quoted(m.group(2))}", text)
        text = _FLAG.sub(self._flag, text)
        text = _QUOTED_FLAG.sub(self._flag, text)
        text = _KEYVAL.sub(lambda m: m.group(0) if not is_secret_name(m.group(2)) or m.group(4).strip("\"'") == REDACTED
                           or plain_value(m.group(4)) else f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}{self._quoted(m.group(4))}", text)
        if self._learned_re is not None:
            text = self._learned_re.sub(REDACTED, text)
        return text

    def _quoted(self, value: str) -> str:
        """Keep the quoting of a replaced value, so a command line still parses."""
        for q in ('"', "'"):
            if len(value) >= 2 and value[0] == q and value[-1] == q:
                self._secret(value[1:-1])
                return q + REDACTED + q
        if value.startswith("$'") and value.endswith("'"):
            self._secret(value[2:-1])
            return "'" + REDACTED + "'"
        return self._secret(value)

    def _line_assign(self, m: re.Match[str]) -> str:
        """``NAME=value`` as a whole line (an environment dump): the value is the rest of the line."""
        if not is_secret_name(m.group(2)) or m.group(3).strip("\"' ") == REDACTED or plain_value(m.group(3)):
            return m.group(0)
        rest = m.group(3)
        return f"{m.group(1)}{m.group(2)}={self._quoted(rest.strip()) if rest.strip() else rest}"

    def _flag(self, m: re.Match[str]) -> str:
        name, sep, value = m.group(1), m.group(2), m.group(3)
        if not is_secret_name(name) or value.startswith("-") or value.strip("\"'") == REDACTED or plain_value(value):
            return m.group(0)
        return f"{name}{sep}{self._quoted(value)}"

    # ------------------------------------------------------------ structures
    def argv(self, argv: Iterable[str]) -> list[str]:
        """An argument vector: a secret flag's value in the next argument is hidden too."""
        out: list[str] = []
        hide_next = False
        for a in argv:
            if hide_next and not (a.startswith("--") and len(a) > 2):
                out.append(self._secret(a) if a and not plain_value(a) else a)
                hide_next = False
                continue
            hide_next = False
            if a.startswith("-") and len(a) > 1 and not a[1:2].isdigit():
                name, eq, value = a.partition("=")
                if is_secret_name(name):
                    if eq:
                        out.append(f"{name}={self._secret(value)}" if not plain_value(value) else a)
                        continue
                    hide_next = True
                    out.append(a)
                    continue
            out.append(self.text(a))
        return out

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {k: (self._secret(v) if is_secret_name(k) and v and not plain_value(v) else self.text(v))
                for k, v in env.items()}

    def value(self, obj: Any) -> Any:
        """Every string inside a JSON-like value; keys named like secrets hide their value."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if isinstance(k, str) and is_secret_name(k) and isinstance(v, str | int | float) and not isinstance(v, bool) \
                        and v != "" and not plain_value(str(v)):
                    out[k] = self._secret(str(v))
                else:
                    out[k] = self.value(v)
            return out
        if isinstance(obj, list | tuple):
            if obj and all(isinstance(x, str) for x in obj) and any(x.startswith("-") for x in obj):
                vals: list[Any] = self.argv(obj)
            else:
                vals = [self.value(v) for v in obj]
            return tuple(vals) if isinstance(obj, tuple) else vals
        return obj


REDACTOR = Redactor()


def redact_text(text: str) -> str:
    return REDACTOR.text(text)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return REDACTOR.env(env)


def redact_argv(argv: Iterable[str]) -> list[str]:
    return REDACTOR.argv(argv)


def redact(obj: Any) -> Any:
    return REDACTOR.value(obj)


def redact_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Parsed ``--flag value`` pairs: a secret flag's value is hidden, the rest kept as it is."""
    return {k: (REDACTOR._secret(str(v)) if is_secret_name(k) and v is not True and v not in ("", None)
                and not plain_value(str(v)) else REDACTOR.text(v) if isinstance(v, str) else v) for k, v in flags.items()}


# ---------------------------------------------------------------- private files
def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) mode 0700."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty with mode 0600 if missing; tighten it if it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)
    return Path(path)


def write_private(path: Path, text: str) -> Path:
    """Write redacted text to ``path``, mode 0600 (replacing it atomically)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(redact_text(text))
    os.replace(tmp, path)
    return path


def redacted_dump(path: Path, obj: Any, **kw: Any) -> Path:
    """``obj`` as JSON, redacted, mode 0600."""
    kw.setdefault("indent", 1)
    text = json.dumps(redact(obj), **kw)
    tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return Path(path)
