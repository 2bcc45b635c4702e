"""The consoles every line of ``debugagent`` goes through: stdout and stderr, TTY or not.

A host's text (a commit subject, a flag, a log line) reaches the terminal inside the live view, the
final lines and the error messages. ``SafeConsole`` shows every control character, bidi control and
undecodable byte in it escaped (``\\x1b``, ``\\u202e``: ``debugagent.tools.escape.terminal``) before it is
written, whatever printed it: a string, rich ``Text`` or a table. Only rich's own control segments (the
live panel moving the cursor) and the colours it adds are written as codes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from debugagent.tools.escape import terminal
from rich.console import Console
from rich.segment import Segment
from rich.text import Text


class SafeConsole(Console):
    """A rich ``Console`` that never writes a control character it did not make itself."""

    def render_str(self, text: str, **kw: Any) -> Text:
        return super().render_str(terminal(text), **kw)   # escaped before it is measured: widths stay right

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # a rich Text built from a host's string, a table cell: escaped here, as the segments are written
        return super()._render_buffer(seg if seg.control else Segment(terminal(seg.text), seg.style, seg.control)
                                      for seg in buffer)


def console(stderr: bool = False, **kw: Any) -> SafeConsole:
    """The console of stdout (or stderr): no highlighting, no emoji, long lines left to the terminal."""
    return SafeConsole(stderr=stderr, highlight=False, emoji=False, soft_wrap=True, **kw)
