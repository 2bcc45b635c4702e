"""A fleet diff for people: text lines for the terminal, and one offline HTML page with a row per host."""

from __future__ import annotations

import json
from typing import Any

from debugagent.tools.units import plain

from .fleet import FleetDiff


def show(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        return f"{plain(v, 4)}"
    return json.dumps(v, sort_keys=True, default=str)


def render_text(fd: FleetDiff) -> list[str]:
    n = len(fd.hosts)
    lines = [f"{n} hosts compared (each against {fd.reference}, the majority decides)"]
    for h, why in fd.unread.items():
        lines.append(f"  not read: {h}: {why}")
    by_hyp: dict[str, list[Any]] = {}
    for s in fd.splits:
        by_hyp.setdefault(s.hypothesis, []).append(s)
    for hyp, splits in by_hyp.items():
        lines.append(hyp)
        for s in splits:
            odd = ", ".join(f"{h} {show(v)}" for h, v in s.odd.items())
            note = f"  ({s.note})" if s.note else ""
            lines.append(f"  {s.path}: {show(s.majority)} on {s.majority_hosts} of {s.hosts}; odd: {odd}{note}")
    b = fd.bench
    if b is not None and b.median is not None:
        unit = f" {b.unit}" if b.unit else ""
        lines.append(f"benchmark {b.metric or ''}: median {plain(b.median, 4)}{unit}, MAD {plain(b.mad or 0)}{unit} over {len(b.values)} hosts")
        for h, v in sorted(b.values.items(), key=lambda kv: kv[1]):
            z = b.z.get(h)
            mark = "  outlier" if h in b.outliers else ""
            zs = "off a MAD of 0" if z is None and b.z else f"z {z:+.1f}" if z is not None else ""
            lines.append(f"  {h}: {plain(v, 4)}{unit}" + (f" ({zs})" if zs else "") + mark)
        lines.append(f"  outliers by {b.test}: {', '.join(b.outliers) or 'none'}" if b.z else f"  {b.note}")
    if not fd.splits and not (b and b.outliers):
        lines.append("the hosts agree on every field compared")
    else:
        lines.append(f"odd hosts: {', '.join(fd.odd_hosts)}")
    return lines


def render_html(fd: FleetDiff) -> str:
    """One table: a row per host, a column per field that differs (odd cells marked), the benchmark last.
    Rendered through Jinja2 with autoescape: nothing from a host is markup."""
    from jinja2 import Environment, select_autoescape

    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    t = env.from_string(_PAGE)
    rows = []
    for h in fd.hosts:
        cells = []
        for s in fd.splits:
            odd = h in s.odd
            cells.append({"text": show(s.odd[h] if odd else s.majority), "odd": odd})
        b = fd.bench
        bench = None
        if b is not None and h in b.values:
            bench = {"text": f"{plain(b.values[h], 4)}", "odd": h in b.outliers, "z": b.z.get(h)}
        rows.append({"host": h, "cells": cells, "bench": bench, "odd": h in fd.odd_hosts})
    return t.render(fd=fd, rows=rows, bench=fd.bench, odd=fd.odd_hosts)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fleet diff: {{ fd.hosts|length }} hosts</title>
<style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.odd{background:#ffe3e0;font-weight:600}tr.odd th{color:#b00020}
code{font-family:ui-monospace,monospace}
</style></head><body>
<h1>Fleet diff: {{ fd.hosts|length }} hosts{% if odd %}, odd: {{ odd|join(", ") }}{% else %}, no odd host{% endif %}</h1>
<p>Each host compared with {{ fd.reference }} as <code>debugagent diff</code> compares two snapshots; the value most hosts hold is the majority, the others are marked.
{% if bench and bench.median is not none %}Benchmark {{ bench.metric or "" }}: median {{ "%.4g"|format(bench.median) }} {{ bench.unit or "" }}; outliers by {{ bench.test }}.{% endif %}</p>
<table><thead><tr><th>host</th>{% for s in fd.splits %}<th><code>{{ s.path }}</code><br><small>{{ s.hypothesis }}</small></th>{% endfor %}{% if bench %}<th>benchmark</th>{% endif %}</tr></thead>
<tbody>{% for r in rows %}<tr class="{{ 'odd' if r.odd else '' }}"><th>{{ r.host }}</th>{% for c in r.cells %}<td class="{{ 'odd' if c.odd else '' }}">{{ c.text }}</td>{% endfor %}{% if bench %}<td class="{{ 'odd' if r.bench and r.bench.odd else '' }}">{% if r.bench %}{{ r.bench.text }}{% if r.bench.z is not none %} (z {{ "%+.1f"|format(r.bench.z) }}){% endif %}{% endif %}</td>{% endif %}</tr>{% endfor %}</tbody></table>
{% if fd.unread %}<h2>Not read</h2><ul>{% for h, why in fd.unread.items() %}<li>{{ h }}: {{ why }}</li>{% endfor %}</ul>{% endif %}
</body></html>
"""
