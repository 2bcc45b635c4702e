"""Markdown for the transcript's tool outputs: the small pure helpers the probes' summaries use, and the
plain rendering of an output that no summary reads (``plain``) with the lines every output ends with
(``tail``: stderr, exit status, the parse error)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from .. import escape

GIT_FIELDS = {"%H": "sha", "%h": "short", "%cI": "date", "%ci": "date", "%aI": "date", "%s": "subject", "%gd": "ref",
              "%gs": "action", "%an": "author"}


def plural(n: int | float, word: str, many: str | None = None) -> str:
    """``1 GPU``, ``2 GPUs``: never ``GPU(s)``."""
    return f"{n:g} {word if n == 1 else (many or word + 's')}"


# words that lead to what follows them (a number, its interval): a cut never ends on one ("mean …", "to …")
LEADING = frozenset("a an the of to by at in on vs vs. with from over than and or is was mean median gives read "
                    "recovers changes p ci share explains".split())


def clip_words(text: str, n: int = 220) -> str:
    """Cut where a clause ends (``; ``, ``: ``, ``, `` in the second half), else at a word boundary, never
    mid-word, inside a parenthesis or after a word that leads to a number (``mean …``); an ellipsis says so."""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    head = text[:max(1, n - 2)]
    for sep in ("; ", ": ", ", "):
        i = head.rfind(sep)
        if i >= n // 2 and head.count("(", 0, i) == head.count(")", 0, i):
            return head[:i] + " …"
    cut = head if text[len(head)] == " " else head.rsplit(" ", 1)[0]   # a last word that fits whole stays
    while True:
        if cut.count("(") > cut.count(")"):   # an interval or a note cut in half: drop it whole
            cut = cut[:cut.rfind("(")].rstrip()
            continue
        words = cut.rsplit(" ", 1)
        if len(words) == 2 and words[1].strip(",;:").lower() in LEADING:
            cut = words[0]
            continue
        break
    return cut.rstrip(",;: ") + " …"


def code(text: str) -> str:
    """An inline code span that survives backticks inside ``text`` (``debugagent.tools.escape.code``)."""
    return escape.code(text)


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: Iterable[list[Any]], inline_one: bool = False) -> list[str]:
    """A Markdown table; with ``inline_one``, a single row is written as one line of ``name value`` pairs."""
    rows = list(rows)
    if inline_one and len(rows) == 1:
        return ["Output: " + "; ".join(f"{h} {c}" if h else str(c) for h, c in zip(header, rows[0], strict=False) if str(c).strip())]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return out


def fenced(text: str, lang: str = "") -> list[str]:
    """A fenced block of ``text``: its fence is longer than any backtick run inside, so no line of it closes it."""
    f = escape.fence_for(text)
    return [f + lang, *text.rstrip("\n").split("\n"), f]


def when(ts: float | int | str | None) -> str:
    if ts is None:
        return "?"
    if isinstance(ts, int | float):
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return str(ts)


def csv_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.strip().splitlines() if line.strip()]


def git_columns(command: str, section_format: str) -> list[str]:
    return [GIT_FIELDS.get(p, p) for p in section_format.split("%x1f")]


def render_unit_sep(text: str, command: str) -> list[str]:
    """Output whose fields are joined by \\x1f (git log/reflog formats): each `== section` a table.

    The full hash is dropped where the short one is shown; reflog rows that only record a
    commit are counted, not listed (the log above lists the commits)."""
    formats = re.findall(r"--format='([^']*%x1f[^']*)'", command)
    lines: list[str] = []
    rows: list[list[str]] = []
    plain: list[str] = []
    fi = 0

    def flush() -> None:
        nonlocal rows, fi
        if not rows:
            return
        n = max(len(r) for r in rows)
        head = git_columns(command, formats[fi]) if fi < len(formats) else [f"field {i + 1}" for i in range(n)]
        fi += 1
        head = head[:n] + [""] * (n - len(head))
        rows = [r + [""] * (n - len(r)) for r in rows]
        keep = [i for i, h in enumerate(head) if not (h == "sha" and "short" in head)]
        hidden = 0
        if "action" in head:
            a = head.index("action")
            hidden = sum(1 for r in rows if r[a].startswith("commit"))
            rows = [r for r in rows if not r[a].startswith("commit")]
            if "sha" in head:
                s_ = head.index("sha")
                rows = [[c[:12] if i == s_ else c for i, c in enumerate(r)] for r in rows]
        if hidden and lines and lines[-1].endswith("**"):
            lines[-1] += f" ({plural(hidden, 'entry', 'entries')} that only record a commit not shown)"
        if rows:
            lines.extend(table([head[i] for i in keep], [[r[i] for i in keep] for r in rows]))
        rows = []

    for line in text.rstrip("\n").split("\n"):
        if "\x1f" in line:
            if plain:
                lines.append(" · ".join(plain))
                plain = []
            rows.append(line.split("\x1f"))
        else:
            flush()
            t = line.strip()
            if t and t != "== end":
                if t.startswith("== ") and plain and plain[-1].startswith("**"):
                    plain[-1] += " (none)"
                plain.append(f"**{t[3:]}**" if t.startswith("== ") else code(t))
                if t.startswith("== ") and "\x1f" in (text.split(line, 1)[1].split("\n", 2)[1] if "\n" in text.split(line, 1)[1] else ""):
                    lines.append(" · ".join(plain))
                    plain = []
    flush()
    if plain:
        lines.append(" · ".join(plain))
    return lines


def collapsed(text: str, summary: str = "the output in full") -> list[str]:
    """A long output in a collapsed block (cut at 200 lines; the rest is in events.jsonl)."""
    body = text.rstrip("\n").replace("\x1f", " ").split("\n")
    if len(body) > 200:
        body = body[:200] + [f"… ({len(body) - 200} more lines in events.jsonl)"]
    return [f"<details><summary>{summary}</summary>", "", *fenced("\n".join(body)), "", "</details>"]




def sections(text: str) -> list[tuple[str, str]] | None:
    """``== name`` headed output with short sections, as (name, value) pairs; None when it is not that."""
    if "\n== " not in "\n" + text:
        return None
    out: list[tuple[str, list[str]]] = []
    head: list[str] = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("== "):
            if line.strip() == "== end":
                break
            out.append((line[3:].strip(), []))
        elif out:
            if line.strip():
                out[-1][1].append(line.strip())
        elif line.strip():
            head.append(line.strip())
    if any(len(v) > 3 for _, v in out):
        return None
    pairs = [(k, " ".join(" ".join(x.split()) for x in v)) for k, v in out]
    return ([("", " ".join(head))] if head else []) + pairs


def plain(ev: dict[str, Any]) -> list[str]:
    """An output no summary reads: \\x1f-joined fields as tables, short ``== name`` sections on one line,
    a few short lines inline, anything longer collapsed."""
    out = ev.get("stdout") or ""
    if "\x1f" in out:
        return render_unit_sep(out, ev.get("command") or "")
    pairs = sections(out)
    if pairs:
        return ["Output: " + " · ".join((f"{k}: " if k else "") + (code(v) if v else "(none)") for k, v in pairs)]
    text = out.rstrip("\n")
    if not text.strip():
        return ["Output: (none)"] if ev.get("exit_code") not in (0, None) else ["(no output)"]
    if len(text.splitlines()) <= 2 and len(text) <= 160:
        return ["Output: " + " · ".join(code(x) for x in text.splitlines() if x.strip())]
    if len(text.splitlines()) <= 4 and max(len(x) for x in text.splitlines()) <= 100:
        return ["Output: " + " · ".join(code(x.strip()) for x in text.splitlines() if x.strip())]
    return [f"Output ({plural(len(text.splitlines()), 'line')}; the first: "
            f"{code(clip_words(text.strip().splitlines()[0], 120))})", *collapsed(text)]


def tail(tool: str, ev: dict[str, Any], said: Iterable[str] = ()) -> list[str]:
    """What every output ends with: its stderr (unless the summary ``said`` quotes it already), a failing exit
    status, the parse error (less the stderr)."""
    err = (ev.get("stderr") or "").strip()
    quoted = code(clip_words(err, 300))
    lines = ["stderr: " + quoted] if err and not any(quoted in ln for ln in said) else []
    bits = []
    if ev.get("exit_code") not in (0, None):
        bits.append(f"exit {ev.get('exit_code')}")
    if ev.get("error"):
        error = " ".join(str(ev["error"]).split())
        if err:
            error = error.replace(" ".join(err.split()), "").rstrip(" :")   # the stderr is on its own line above
        if error and error != f"{tool}: exit {ev.get('exit_code')}":
            bits.append(clip_words(error, 300))
    if bits:
        lines.append("*" + "; ".join(bits) + "*")
    return lines
