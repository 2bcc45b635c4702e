"""One escaping function per sink, for text that came from a host (pure functions, no I/O).

A host can put anything in what debugagent reads: a commit subject, a process's argv, a package's
name, a log line. Shown raw, that text can drive the terminal (``ESC[2J`` clears the screen, OSC 52
writes the clipboard, OSC 0 sets the title, ``ESC[8m`` hides what follows), run as HTML where
``transcript.md`` is rendered, or reverse a command on screen (U+202E). Each sink gets its own
function:

- ``terminal``: for stdout and stderr, TTY or not (``agent/sinks.py`` routes every console line
  through it);
- ``markdown``: for ``transcript.md``, a whole document at a time: no raw HTML outside code (``<``
  becomes ``&lt;``), no backtick that can open a code span across lines or cells, and no control
  character;
- ``html_text``: for ``report.html``, before the template's autoescape.

What is shown escaped (``visible``): the C0 controls but newline and tab (``\\x1b``), DEL and the C1
controls (``\\x9b``), the bidirectional controls (``\\u202e``, U+061C, U+200E, U+200F, U+202A–U+202E,
U+2066–U+2069), the line and paragraph separators U+2028 and U+2029, and lone surrogates — which is how
bytes that are not UTF-8 arrive when text was decoded with ``surrogateescape`` (``\\xff``). Other text,
a backslash included, is kept as it is: the point is that nothing acts, not that the text round-trips.
"""

from __future__ import annotations

import functools
import re

BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


@functools.cache
def _unsafe(keep: str) -> re.Pattern[str]:
    c0 = "".join(chr(i) for i in range(0x20) if chr(i) not in keep)
    return re.compile("[" + re.escape(c0) + "\x7f-\x9f" + BIDI + "\u2028\u2029\ud800-\udfff]")


def _shown(m: re.Match[str]) -> str:
    o = ord(m.group())
    if 0xDC80 <= o <= 0xDCFF:   # a byte that was not UTF-8 (surrogateescape): the byte itself
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def visible(text: str, keep: str = "\n\t") -> str:
    """``text`` with every control, bidi control, line separator and undecodable byte shown escaped
    (``\\x1b``, ``\\u202e``, ``\\xff``); the C0 characters in ``keep`` (newline and tab by default) are left."""
    return _unsafe(keep).sub(_shown, text)


def decoded(data: bytes | str) -> str:
    """Bytes from a host as text: UTF-8, and a byte that is not shown later as ``\\xNN`` (not U+FFFD)."""
    return data if isinstance(data, str) else data.decode("utf-8", errors="surrogateescape")


# ---------------------------------------------------------------- terminal
def terminal(text: str | bytes, multiline: bool = True) -> str:
    """Text for stdout or stderr: nothing in it can move the cursor, clear the screen, set the title, write the
    clipboard, hide text or reorder it. ``multiline=False`` shows newlines escaped too (one line stays one)."""
    return visible(decoded(text), "\n\t" if multiline else "")


# ---------------------------------------------------------------- Markdown
_FENCE_OPEN = re.compile(r"^( {0,3})(`{3,}(?=[^`]*$)|~{3,})")
_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
# the lines debugagent writes itself around collapsed blocks: the only raw HTML transcript.md holds
OWN_HTML = re.compile(r"(<details><summary>[A-Za-z ]+</summary>|</details>)")


def _runs(s: str) -> list[tuple[int, int]]:
    """Every maximal backtick run of ``s``: (start, length)."""
    return [(m.start(), len(m.group())) for m in re.finditer(r"`+", s)]


def code_spans(s: str) -> list[tuple[int, int]]:
    """The code spans of one inline unit as CommonMark finds them: (start, end) of each, backticks included.
    Outside a span a backslash escapes the punctuation after it (an escaped backtick opens nothing); inside
    one it is literal, so a closing run may follow a backslash."""
    spans: list[tuple[int, int]] = []
    runs = _runs(s)
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n and s[i + 1] in _PUNCT:
            i += 2
            continue
        if c != "`":
            i += 1
            continue
        j = i
        while j < n and s[j] == "`":
            j += 1
        close = next((st for st, ln in runs if st >= j and ln == j - i), None)
        if close is None:
            i = j   # no closer: the run is literal text
            continue
        spans.append((i, close + j - i))
        i = close + j - i
    return spans


def _outside(s: str, spans: list[tuple[int, int]], only: str) -> list[tuple[int, str]]:
    """(position, character) of each character of ``only`` outside the spans that no backslash escapes."""
    token = _TOKENS.get(only)
    if token is None:   # an escaped punctuation (skipped whole), or one of the characters
        token = _TOKENS[only] = re.compile(r"\\[" + re.escape("".join(sorted(_PUNCT))) + "]|([" + re.escape(only) + "])")
    out: list[tuple[int, str]] = []
    i = 0
    for start, end in [*spans, (len(s), len(s))]:
        for m in token.finditer(s, i, start):
            if m.group(1) is not None:
                out.append((m.start(), m.group(1)))
        i = end
    return out


_TOKENS: dict[str, re.Pattern[str]] = {}


def _inline(s: str) -> str:
    """One inline unit (a line, or a table cell): every backtick that pairs with nothing escaped (``\\```), so
    none can pair with one on another line or in another cell; then every ``<`` outside the code spans written
    ``&lt;`` (no tag, no autolink, no HTML block), and ``![`` as ``!\\[`` (no image to fetch)."""
    if "`" in s:   # (each pass changes only the characters it names: a line without them is kept as it is)
        for pos, c in reversed(_outside(s, code_spans(s), "`")):
            if c == "`":
                s = s[:pos] + "\\" + s[pos:]
    if "<" not in s and "![" not in s:
        return s
    outside = _outside(s, code_spans(s), "<[!")
    for k in range(len(outside) - 1, -1, -1):
        pos, c = outside[k]
        if c == "<":
            s = s[:pos] + "&lt;" + s[pos + 1:]
        elif c == "[" and k and outside[k - 1] == (pos - 1, "!"):
            s = s[:pos] + "\\" + s[pos:]   # ``![`` opens no image: nothing is fetched when the page is read
    return s


def _prose_line(line: str) -> str:
    if line.lstrip().startswith("|"):
        # a GFM renderer reads a table row cell by cell, split at each pipe no backslash is before (GitHub's and
        # markdown-it's rule, inside code spans too); CommonMark reads the line as one: each cell is made safe
        # alone, so both find the same code spans
        return "|".join(_inline(part) for part in re.split(r"(?<!\\)\|", line))
    return _inline(line)


def markdown(doc: str) -> str:
    """A whole Markdown document made safe to render: no raw HTML but debugagent's own ``<details>`` lines (each
    followed by a blank line, so it is an HTML block of one line), no code span that a host's backtick can open or
    close from another line or cell, no control character.

    Fenced blocks are kept as they are but for control characters; every other line has its unmatched
    backticks escaped and its ``<`` outside code spans written ``&lt;``, so every renderer — a paragraph read
    as one unit, or a table cell by cell — finds the same code spans and no tag, autolink or HTML block."""
    out: list[str] = []
    fence: tuple[str, int] | None = None   # the open fence's character and length
    for raw in doc.split("\n"):
        line = visible(raw, "\t")
        if out and OWN_HTML.fullmatch(out[-1]) and line.strip():
            out.append("")   # an HTML block runs to the next blank line: nothing of the host's may be in it
        if fence is not None:
            ch, n = fence
            if re.fullmatch(r" {0,3}" + re.escape(ch) + "{" + str(n) + r",}[ \t]*", line):
                fence = None
            out.append(line)
            continue
        m = _FENCE_OPEN.match(line)
        if m:
            fence = (m.group(2)[0], len(m.group(2)))
            out.append(line)
            continue
        out.append(line if OWN_HTML.fullmatch(line) else _prose_line(line))
    return "\n".join(out)


def fence_for(text: str) -> str:
    """A backtick fence longer than any backtick run in ``text`` (at least three)."""
    return "`" * max(3, max((ln for _, ln in _runs(text)), default=0) + 1)


def code(text: str) -> str:
    """An inline code span of ``text``: fenced by a backtick run longer than any inside it, padded where the text
    starts or ends with a backtick; newlines become spaces (a span is one line)."""
    text = text.replace("\n", " ")
    longest = max((ln for _, ln in _runs(text)), default=0)
    fence = "`" * (longest + 1)
    # CommonMark strips one space from each end of a span that has one at both: a padded span keeps the text's own
    pad = " " if longest or (text.startswith(" ") and text.endswith(" ") and text.strip()) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# ---------------------------------------------------------------- HTML
def html_text(value: str) -> str:
    """A value for ``report.html`` before autoescape: controls and bidi controls shown escaped (the template
    escapes ``<``, ``&`` and quotes)."""
    return visible(value, "\n\t")
