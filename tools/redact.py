"""The one redactor: secrets are hidden before anything is written, printed or sent to an LLM.

What counts as a secret:

* a value under a secret *name*: an environment variable, a ``--flag`` (its value after
  ``=`` or in the next argument), a JSON/YAML key. Names are split into words (``_``,
  ``-``, ``.``, camelCase) and matched word by word, so ``HF_TOKEN``, ``--api-key`` and
  ``--admin-password`` are secret while ``--max-num-batched-tokens``,
  ``--speculative-num-draft-tokens`` and ``VLLM_MAX_TOKENS_PER_EXPERT`` (the flags a
  diagnosis needs) stay readable; a name ending in a word such as ``file`` or ``path``
  (``--ssl-keyfile``, ``KEY_PATH``) names where a secret is, not the secret, and one with a
  count, size or scale after its secret word (``MAX_SESSION_TOKENS``, ``--attention-key-scale``,
  ``--salt-rounds``) a number a diagnosis reads; one-word names (``PGPASSWORD``) and short last
  words (``REDIS_PASS``, ``MYSQL_PWD``, ``--pass``; not the shell's ``PWD``) are secret too;
* a value of its own shape, wherever it appears: PEM private keys (also cut off or spread
  over lines), JWTs, ``Authorization``/``Cookie`` headers and bearer tokens, credentials in
  URLs (``scheme://user:PASSWORD@``, a DSN's key), webhook URLs, well-known token prefixes
  (``hf_``, ``ghp_``, ``github_pat_``, ``glpat-``, ``sk-``, ``xox…-``, ``AKIA…``, ``AIza…``,
  ``ya29.``, ``hvs.``, ``pypi-``, ``npm_``, ``SG.``), connection strings (Azure ``AccountKey=``,
  ODBC ``PWD=``), INI and netrc files, curl's ``-u USER:PASSWORD``, base64 blobs that decode to
  a credential (a service-account key, a docker config), and a quoted command inside a flag
  (``--bench 'client --api-key KEY'``);
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

import base64
import functools
import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REDACTED = "[REDACTED]"

# a name is secret when one of its words is one of these ...
SECRET_WORDS = frozenset({
    "token", "secret", "secrets", "password", "passwd", "passphrase", "key", "apikey", "accesskey",
    "secretkey", "privatekey", "authtoken", "accesstoken", "refreshtoken", "clientsecret", "credential",
    "credentials", "creds", "auth", "authorization", "cookie", "cookies", "dsn", "webhook", "signature", "sig", "salt",
    "session", "sessionid", "jwt", "bearer",
    "requirepass", "masterauth", "masterpass",   # Redis
    "apitoken", "hftoken", "ghtoken", "bottoken", "idtoken", "sessiontoken", "csrftoken", "xsrftoken", "jobtoken",
    "pgpass", "dbpass", "rootpass", "adminpass", "userpass", "smtppass", "mailpass",
})
# ... or ends in one of these (a name written as one word: PGPASSWORD, MYSQLPASSWORD, CLIENTSECRET, MYTOKEN),
# but for the words of tokenizers (`tiktoken: 0.12.0` in `sglang.check_env`)
SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token", "apikey", "secretkey", "privatekey",
                   "accesskey", "masterkey", "signingkey")
NOT_SECRET_WORDS = frozenset({"tiktoken", "detoken", "subtoken", "pretoken", "multitoken", "untoken", "retoken",
                              "nexttoken", "bytetoken"})
# ... or, as its last word, one of these short ones: REDIS_PASS, MY_PASS, `--pass`, MYSQL_PWD, DB_PW, GH_PAT
# (PWD alone, and OLDPWD, are the shell's working folder: a one-word ``pwd`` is not a password)
SECRET_LAST_WORDS = frozenset({"pass", "pw", "pwd", "pat", "keys", "passwords"})
_NOT_ALONE = frozenset({"pwd", "keys"})   # the variable PWD, a dict's `keys`: secret only in a longer name or a flag
# ... unless the word before a secret word says which key or token it is: a sort key, the EOS token
NOT_SECRET_KINDS = {
    "key": frozenset({"sort", "group", "partition", "primary", "foreign", "routing", "shard", "hash", "join", "metric",
                      "label", "dict", "index", "unique", "composite", "lookup", "cache", "attention", "kv", "query",
                      "dedup", "dedupe", "order", "hot", "map", "authorized", "known", "host", "trusted", "public"}),
    "token": frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "image", "video", "audio", "vision", "start",
                        "end", "stop", "special", "think", "eot", "eom", "placeholder", "draft", "per", "max", "min",
                        "num", "first", "second", "last", "next", "prev", "previous", "each", "every", "inter",
                        "output", "input", "prompt", "completion", "generated", "new", "total", "avg", "mean"}),
    "pass": frozenset({"single", "two", "multi", "one", "first", "second", "last", "each", "every", "fusion", "custom",
                       "post", "pre", "grad", "forward", "backward", "compile", "compiler", "graph", "fx", "inductor",
                       "full", "extra", "lowering", "optimization", "opt",
                       # nginx: `proxy_pass http://backend;` names where requests go
                       "proxy", "fastcgi", "uwsgi", "grpc", "scgi", "memcached"}),
    "session": frozenset({"xdg", "dbus", "ray", "tmux", "screen", "login", "user"}),
}
# ... and unless its last word says it is about a secret rather than the secret: where it is (a file, a
# path), its name or kind, a setting, or a count, size or scale that a diagnosis reads
QUALIFIERS = frozenset({
    # where the secret is, or what names it: `--ssl-keyfile`, `KEY_PATH`, `SECRET_NAME`, `API_KEY_HEADER_NAME`
    "file", "files", "path", "paths", "dir", "folder", "name", "names", "type", "id", "ids", "env", "var",
    "store", "ref", "arn",
    # settings about a secret: `--auth-required`, `AUTH_METHOD`, `--auth-timeout`, `PasswordAuthentication`
    "required", "enabled", "disabled", "method", "timeout", "ttl", "level", "backend", "provider", "scheme", "strategy",
    "algorithm", "version", "authentication", "sock", "socket", "mode", "format", "policy", "manager", "config",
    "cfg", "conf", "options", "opts", "expiry", "expires", "expiration", "lifetime", "age", "domain", "secure", "samesite",
    "httponly", "address", "addr", "bus", "class", "desktop", "seat", "vt", "user", "username", "region", "realm",
    "issuer", "audience", "scope", "scopes", "field", "prefix", "suffix", "template", "encoding", "charset",
    # a count, a size, a scale: `--key-dim 128`, `--token-budget`, `MAX_SESSION_TOKENS`, `--attention-key-scale`,
    # `--speculative-token-tree`, `--salt-rounds`, `--sig-figs`
    "size", "len", "length", "count", "dim", "dims", "bits", "interval", "index", "idx", "budget", "limit", "ratio",
    "dtype", "rate", "cache", "tokens", "tree", "map", "scale", "scales", "scaling", "rounds", "round", "figs",
    "digits", "steps", "depth", "width", "factor", "threshold", "window", "offset", "stride", "heads", "head",
    "seconds", "secs", "ms", "bytes", "capacity", "latency", "usage", "per", "num", "total", "max", "min", "chars",
    "stats", "metrics", "weight", "weights", "bias", "norm", "proj", "layer", "layers", "states", "throughput",
    "mean", "avg", "median", "stddev", "std", "quantile", "quantiles", "percentile", "percentiles",
    # a diagnostic about a secret, not the secret: `KeyError: 'x'`, `TokenMismatch`
    "error", "errors", "exception", "warning", "mismatch",
    # a file name (`broken-key.yaml:12`): where a secret may be, not the secret
    "yaml", "yml", "json", "toml", "ini", "txt", "log", "py", "sh", "md", "csv", "xml", "html", "db", "sqlite",
    "lock", "pid", "bak", "tmp", "so", "whl",
})
# a switch (`--enable-auth`, `--no-auth`, `--use-token`) takes no value: the next argument is not its secret;
# a count (`MAX_SESSION_TOKENS`, `--num-key-heads`) is no secret; a diagnostic (`InvalidToken:`) is none
NOT_SECRET_FIRST = frozenset({"enable", "disable", "no", "use", "require", "allow", "skip", "with", "without",
                              "max", "min", "num", "invalid", "missing", "bad", "expired", "unknown",
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
                               "validation", "now", "not", "as", "of", "by", "at", "if", "it", "file", "missing",
                               "invalid", "expired", "required", "denied", "empty", "unset", "found", "error",
                               "failed", "must", "should", "will", "may", "can", "cannot", "could", "has", "have",
                               "does", "did", "set", "given", "needed", "refused", "rejected", "ok", "success",
                               "passed", "valid", "optional", "n/a", "unknown", "[redacted]",
                               # a placeholder in documentation: `Key: value`, `--api-key ...`
                               "value", "values", "...", "…", "<value>", "<key>", "<token>", "<password>"})
# an absolute path under a standard folder names where a secret is kept, not the secret
_PATH_VALUE = re.compile(r"(?:~|/(?:etc|var|run|root|home|tmp|opt|usr|srv|mnt|data|workspace|models|secrets|dev|app|"
                         r"cache|nfs|scratch|proc|sys|work|lustre|gpfs|fsx|efs|shared|Users|private))"
                         r"(?:/[\w.@:+-]+)+/?")


def plain_value(value: str) -> bool:
    """A value that is no secret under any name: a switch's state, a word of prose, a path to a file."""
    v = value.strip().strip("'\"`")
    if v.endswith(",") and v[:-1].strip("'\"").lower() in NOT_SECRET_VALUES:   # `admin_api_key=None,` in a repr
        return True
    return v.lower() in NOT_SECRET_VALUES or bool(_PATH_VALUE.fullmatch(v))

# substrings without which no secret name can occur (SECRET_WORDS, SECRET_SUFFIXES, SECRET_LAST_WORDS, lowercased)
_NAME_ANCHORS = ("token", "secret", "pass", "pw", "pat", "key", "cred", "auth", "cookie", "dsn", "webhook", "sig",
                 "salt", "session", "jwt", "bearer")
# one-word names that, followed by a small number, count something (`pass: 3`, `session: 42`, `key: 1`)
_ONE_WORD_COUNTS = frozenset({"pass", "session", "key", "sig", "salt", "auth", "token", "pw", "pat"})
_PROSE_BEFORE = re.compile(r"[A-Za-z]{2,}[ \t]+\Z")
_HEADER_ANCHORS = ("authorization", "cookie", "api-key", "auth-token", "access-token", "private-token", "bearer",
                   "basic", "token")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def name_words(name: str) -> list[str]:
    """``--apiKey`` -> ``["api", "key"]``; ``VLLM_MAX_TOKENS`` -> ``["vllm", "max", "tokens"]``."""
    return [w.lower() for w in _WORD_SPLIT.split(name) if w]


_PERCENTILE = re.compile(r"p\d{1,3}")


def _qualifier(word: str) -> bool:
    return word in QUALIFIERS or bool(_PERCENTILE.fullmatch(word))


def _secret_word(words: list[str], i: int, flag: bool) -> bool:
    """Whether ``words[i]`` makes the name secret (a secret word not qualified by the word before it)."""
    w = words[i]
    last = i == len(words) - 1
    if w in SECRET_LAST_WORDS:   # the variable PWD is the working folder; `--pwd`, `MYSQL_PWD` are passwords
        hit = last and (len(words) > 1 or w not in _NOT_ALONE or flag)
    else:
        hit = w in SECRET_WORDS or (w.endswith(SECRET_SUFFIXES) and len(w) > 4 and w not in NOT_SECRET_WORDS)
    if not hit:
        return False
    kinds = NOT_SECRET_KINDS.get("key" if w == "keys" else w)
    if kinds and i > 0 and words[i - 1] in kinds:
        return False
    # a word after it that says what about the secret the name holds: `--attention-key-scale-factor`,
    # `inter_token_latency_s_p50`, `API_KEY_FILE_PATH`
    return not any(_qualifier(x) for x in words[i + 1:])


@functools.lru_cache(maxsize=65536)
def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or key of this name holds a secret.

    The name is split into words (``_ - .`` and camelCase): it is secret when one word is a secret word
    (``HF_TOKEN``, ``--api-key``, ``PGPASSWORD``, ``REDIS_PASS``, ``MYSQL_PWD``) and the last word is no
    qualifier (a file, a setting, a count or scale: ``--ssl-keyfile``, ``--auth-required``,
    ``MAX_SESSION_TOKENS``, ``--attention-key-scale``), the first no switch or count (``--enable-auth``,
    ``--num-key-heads``), and the word before it does not say which key or token it is (``--sort-key``,
    ``--eos-token``)."""
    if not name or name.lower().lstrip("-+") in NOT_SECRET_NAMES:
        return False
    words = name_words(name)
    if words[-2:] == ["secret", "id"]:   # Vault AppRole's SECRET_ID is the credential (its ROLE_ID is not)
        return True
    if not words or _qualifier(words[-1]) or (len(words) > 1 and words[0] in NOT_SECRET_FIRST):
        return False
    return any(_secret_word(words, i, name.startswith("-")) for i in range(len(words)))


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
    r"ya29\.[A-Za-z0-9_-]{20,}",                # a Google OAuth access token
    r"1//0[A-Za-z0-9_-]{30,}",                  # a Google OAuth refresh token
    r"hv[sbr]\.[A-Za-z0-9_-]{20,}",              # HashiCorp Vault
    r"AGE-SECRET-KEY-1[0-9A-Z]{50,}",
    r"dop_v1_[a-f0-9]{40,}",
]) + ")")
# base64 that decodes to JSON or a PEM block holding a credential (a service-account key, a docker config,
# a Kubernetes secret's tls.key), also wrapped over lines; ``_B64_MARKS`` are what its decoding must hold
_B64 = re.compile(r"(?<![A-Za-z0-9+/_-])(?:eyJ|eyAi|ewog|ewoJ|ew0K|LS0tLS1CRUdJT)[A-Za-z0-9+/_-]{36,}={0,2}"
                  r"(?:(?:\r?\n|\\n)[A-Za-z0-9+/]+={0,2}(?=[\r\n\"',]|\\n|$))*")
_B64_ANCHORS = ("eyj", "eyai", "ewog", "ewoj", "ew0k", "ls0tls1crudjt")
_B64_MARKS = (b"private_key", b"PRIVATE KEY", b"client_secret", b"refresh_token", b"access_token", b"service_account",
              b'"password"', b'"auths"', b'"auth"', b'"token"', b'"secret"', b"api_key", b"apiKey")
_HEADER = re.compile(r"(?i)(?<![\w-])((?:proxy-)?authorization|cookie|set-cookie|x-api-key|api-key|x-auth-token|"
                     r"x-access-token|private-token|x-goog-api-key)(\s*[:=]\s*)([^\r\n\"']+)")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/-]{8,}=*)|\b(basic|token)(\s+)(?=[A-Za-z0-9._~+/-]*\d)"
                     r"(?=[A-Za-z0-9._~+/-]*[A-Za-z])([A-Za-z0-9._~+-][A-Za-z0-9._~+/-]{15,}=*)")
# scheme://user:password@host  and  scheme://KEY@host (a DSN); the user of scp-like git URLs is kept
# (the password may hold `/`, and `@` where another `@` follows before the host: git and curl take them raw)
_URL_CRED = re.compile(r"(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)([^\s/@:'\"<>]*):((?:[^\s@'\"<>]|@(?=[^\s/@'\"<>]{0,128}@)){1,128})@")
_PORT_PATH = re.compile(r"\d{1,5}/.*")   # host:PORT/path@x is a URL without a password
_URL_USER = re.compile(r"(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)([A-Za-z0-9_-]{16,})@")
_WEBHOOK = re.compile(r"(?i)\b(https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)|"
                      r"(?:[a-z0-9-]+\.)?discord(?:app)?\.com/api/webhooks|[^\s/'\"]+/(?:api/)?webhooks?)/)"
                      r"[^\s'\"<>]+")
_URL_QUERY = re.compile(r"([?&])([A-Za-z0-9_.-]+)=([^&\s'\"#<>]+)")

# NAME=value (a line of an environment dump takes the rest of the line); --flag=value / --flag value
_VALUE = r"(\"(?:[^\"\\]|\\.)*\"|'[^']*'|\$'(?:[^'\\]|\\.)*'|[^\s'\"]+)"
# (``+NAME=value``: server_details marks each entry of /proc/PID/environ with a leading ``+``)
_LINE_ASSIGN = re.compile(r"(?m)^(\s*(?:export\s+)?\+?)([A-Za-z_][A-Za-z0-9_.-]*)=(.+)$")
# (an unquoted value ends at `;`: `AccountName=a;AccountKey=KEY;...`, a connection string, is read
# pair by pair; a whole environment line is _LINE_ASSIGN's)
_ASSIGN = re.compile(r"(?<![\w./-])([A-Za-z_][A-Za-z0-9_.]*)=(\"(?:[^\"\\]|\\.)*\"|'[^']*'|\$'(?:[^'\\]|\\.)*'|[^\s'\";]+)")
# `name = value` as a whole line (an INI or TOML file: ~/.aws/credentials, pip.conf); a value of code
# (`token = os.environ["X"]`, `key = f(x)`) is none
_INI_ASSIGN = re.compile(r"(?m)^([ \t]*)([A-Za-z_][A-Za-z0-9_.-]*)([ \t]+=[ \t]*|[ \t]*=[ \t]+)"
                         r"(\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s()\[\]{}'\"]+)[ \t]*$")
# ODBC and ADO.NET connection strings name the password PWD (`...;UID=u;PWD=secret;`)
_CONN_PWD = re.compile(r"(?i)(?<![\w./-])(pwd)=([^;\s'\"]+)")   # (only beside a `;`: PWD=/x alone is the cwd)
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.-]*)(=|[^\S\n]+|[^\S\n]*\n)(?![-=])" + _VALUE)
# an argument vector written as a JSON or Python list: `"--api-key", "VALUE"`
_QUOTED_FLAG = re.compile(r"(?<=[\"'])(--?[A-Za-z][A-Za-z0-9_.-]*)([\"']\s*,\s*)(\"(?:[^\"\\]|\\.)*\"|'[^']*')")
# (not after `/`, `~` or `:`: `/etc/passwd: denied` is a path in a message, not a key and its value)
_KEYVAL = re.compile(r"(?<![\w.\"'/~:@\\-])([\"']?)([A-Za-z_][A-Za-z0-9_.-]*)\1([^\S\n]*:[^\S\n]*)(\[REDACTED\]|\"(?:[^\"\\]|\\.)*\"|'[^']*'|"
                     r"\[(?:[^\S\n]*(?:\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*')[^\S\n]*,?)+\]|[^\s,}\]\"']+)")
# (a list of quoted strings is one value: vLLM logs `non-default args: {'api_key': ['KEY']}`)
# curl's `-u USER:PASSWORD` (a uid:gid, `docker run -u 1000:1000`, is none; nor is a command without a URL)
_USER_PW = re.compile(r"(?<![\w-])(-u|--user|--proxy-user)([ \t]+|=)([^\s:'\"]+):(?!\d+(?:\s|$))([^\s'\"]+)")
# .netrc: `machine HOST login USER password SECRET`
_NETRC = re.compile(r"(?<![\w-])(password|passwd)([ \t]+)(?!\[REDACTED\])(\S+)")


class Redactor:
    """Detectors plus the secret values learned so far (a value seen once under a secret name)."""

    MIN_LEARNED = 8
    # the texts already redacted and their redaction, while nothing new was learned (a run redacts the same
    # outputs again for each checkpoint and output file): a text's redaction depends on it and the learned values
    # alone, and learning a value empties it
    CACHE_ENTRIES = 4096
    CACHE_CHARS = 1 << 16

    def __init__(self) -> None:
        self._learned: set[str] = set()
        self._learned_re: re.Pattern[str] | None = None
        self._lock = threading.Lock()
        self._generation = 0
        self._done: dict[str, str] = {}

    # ------------------------------------------------------------ learning
    def learn(self, value: str) -> None:
        v = value.strip().strip("'\"")
        if len(v) < self.MIN_LEARNED or "REDACTED" in v or v in self._learned:
            return
        with self._lock:
            self._learned.add(v)
            alts = sorted(self._learned, key=len, reverse=True)
            self._learned_re = re.compile("|".join(re.escape(a) for a in alts))
            self._generation += 1
            self._done = {}

    @property
    def generation(self) -> int:
        """Changes each time a value is learned: a redaction that left it as it was gives the same result again for as
        long as it stays so (a redaction depends on its input and the learned values alone)."""
        return self._generation

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
        cache, generation = self._done, self._generation
        done = cache.get(text)
        if done is not None:
            return done
        out = self._text(text)
        # kept only where nothing was learned meanwhile (learning replaces the dict: a late store goes to the old one)
        if generation == self._generation and len(text) <= self.CACHE_CHARS:
            if len(cache) >= self.CACHE_ENTRIES:
                cache.clear()
            cache[text] = out
        return out

    def _text(self, text: str) -> str:
        low = text.lower()   # each detector runs only where its anchor occurs (large outputs stay fast)
        if "private key" in low:
            text = _PEM.sub(REDACTED, text)
            text = _PEM_ESCAPED.sub(REDACTED, text)
        if "://" in low:
            text = _WEBHOOK.sub(lambda m: m.group(1) + REDACTED, text)
            text = _URL_CRED.sub(self._url_cred, text)
            text = _URL_USER.sub(lambda m: f"{m.group(1)}{self._secret(m.group(2))}@", text)
        if "?" in low or "&" in low:
            text = _URL_QUERY.sub(lambda m: m.group(0) if not is_secret_name(m.group(2))
                                  else f"{m.group(1)}{m.group(2)}={self._secret(m.group(3))}", text)
        if any(w in low for w in _HEADER_ANCHORS):
            text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{self._secret(m.group(3))}", text)
            text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{self._secret(m.group(3))}" if m.group(1)
                               else f"{m.group(4)}{m.group(5)}{self._secret(m.group(6))}", text)
        text = _TOKENS.sub(REDACTED, text)
        if "-u" in low and ("curl" in low or "://" in low):   # (`docker run -u app:app` is a user and a group)
            text = _USER_PW.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}:{self._secret(m.group(4))}", text)
        if any(w in low for w in _B64_ANCHORS):
            text = _B64.sub(self._base64, text)
        if not any(w in low for w in _NAME_ANCHORS):
            return self._learned_re.sub(REDACTED, text) if self._learned_re is not None else text
        text = _LINE_ASSIGN.sub(self._line_assign, text)
        if "=" in text:
            text = _INI_ASSIGN.sub(lambda m: m.group(0) if not is_secret_name(m.group(2)) or plain_value(m.group(4))
                                   else f"{m.group(1)}{m.group(2)}{m.group(3)}{self._quoted(m.group(4))}", text)
            text = _ASSIGN.sub(lambda m: m.group(0) if not is_secret_name(m.group(1)) or plain_value(m.group(2))
                               else f"{m.group(1)}={self._quoted(m.group(2))}", text)
            if "pwd=" in low and ";" in text:
                text = _CONN_PWD.sub(self._conn_pwd, text)
        text = _FLAG.sub(self._flag, text)
        text = _QUOTED_FLAG.sub(self._flag, text)
        text = _KEYVAL.sub(self._keyval, text)
        if "machine" in low and "login" in low:
            text = _NETRC.sub(lambda m: f"{m.group(1)}{m.group(2)}{self._secret(m.group(3))}", text)
        if self._learned_re is not None:
            text = self._learned_re.sub(REDACTED, text)
        return text

    def _url_cred(self, m: re.Match[str]) -> str:
        """``scheme://user:PASSWORD@``; ``host:8080/path@v1`` holds a port and a path, not a password."""
        if _PORT_PATH.fullmatch(m.group(3)):
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}:{self._secret(m.group(3))}@"

    def _base64(self, m: re.Match[str]) -> str:
        """A base64 blob is hidden whole when its decoding holds a credential (a service-account key)."""
        parts = re.split(r"(\r?\n|\\n)", m.group(0))   # wrapped: every line as long as the first, but the last
        lines, width = [parts[0]], len(parts[0])
        for line in parts[2::2]:
            if len(lines[-1]) != width or len(line) > width:
                break
            lines.append(line)
        kept = "".join(parts[: 2 * len(lines) - 1])
        rest = m.group(0)[len(kept):]
        blob = "".join(lines)
        for start in range(4):   # where the blob was cut out of a longer one, its alignment may be off
            body = blob[start:]
            body = body[: len(body) - len(body) % 4] if "=" not in body else body
            try:
                data = base64.b64decode(body.replace("-", "+").replace("_", "/") + "=" * (-len(body) % 4))
            except ValueError:
                continue
            if any(mark in data for mark in _B64_MARKS):
                self.learn(kept)
                return REDACTED + rest
        return m.group(0)

    def _conn_pwd(self, m: re.Match[str]) -> str:
        s, i, j = m.string, m.start(), m.end()
        if s[i - 1:i] != ";" and s[j:j + 1] != ";":   # PWD=/x alone is the shell's working folder
            return m.group(0)
        return f"{m.group(1)}={self._secret(m.group(2))}"

    def _keyval(self, m: re.Match[str]) -> str:
        """``name: value`` (YAML, JSON, a header, a message)."""
        name, sep, value = m.group(2), m.group(3), m.group(4)
        if not is_secret_name(name) or value.strip("\"'") == REDACTED or plain_value(value):
            return m.group(0)
        if value in ('""', "''"):   # an empty value hides nothing (`"SandboxKey": ""` in a container's inspect)
            return m.group(0)
        if sep == ":" and "." in name and re.fullmatch(r"\d+(?::\d+)?:?", value):   # file:line in a message
            return m.group(0)
        if name.lower() in _ONE_WORD_COUNTS and re.fullmatch(r"\d{1,6}", value):   # `pass: 3, fail: 0`
            return m.group(0)
        if not m.group(1) and len(name_words(name)) == 1 and _PROSE_BEFORE.search(m.string[max(0, m.start() - 40):m.start()]):
            return m.group(0)   # a word of a sentence: "in one concurrent pass: GPU state, ..."
        return f"{m.group(1)}{name}{m.group(1)}{sep}{self._quoted(value)}"

    def _quoted(self, value: str) -> str:
        """Keep the quoting of a replaced value, so a command line still parses."""
        if value.startswith("[") and value.endswith("]") and value != REDACTED:   # ['KEY1', 'KEY2']
            for item in re.findall(r"\"((?:[^\"\\]|\\.)*)\"|'([^']*)'", value):
                self._secret(item[0] or item[1])
            return REDACTED
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
        if not is_secret_name(name):
            # a quoted value is a command of its own (`--bench 'client --api-key KEY'`): redacted as one
            if len(value) > 2 and value[0] in "\"'" and value[-1] == value[0]:
                return f"{name}{sep}{value[0]}{self.text(value[1:-1])}{value[0]}"
            return m.group(0)
        if value.startswith("-") or value.strip("\"'") == REDACTED or plain_value(value):
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
                secret = isinstance(k, str) and is_secret_name(k)
                if isinstance(k, str) and len(k) >= self.MIN_LEARNED:   # a key is a field too (a URL, `NAME=value`)
                    k = self.text(k)
                if secret and isinstance(v, str | int | float) and not isinstance(v, bool) and v != "" \
                        and not plain_value(str(v)):
                    out[k] = self._secret(str(v))
                elif secret and isinstance(v, list) and all(isinstance(x, str) for x in v):   # `"api_keys": [...]`
                    out[k] = [self._secret(x) if x and not plain_value(x) else x for x in v]
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
    try:
        with os.fdopen(fd, "w") as f:
            f.write(redact_text(text))
        os.replace(tmp, path)
    except OSError:   # a full disk: no half-written temporary file left beside it
        tmp.unlink(missing_ok=True)
        raise
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
