"""``debugagent run`` and ``debugagent resume``: set up, run the graph, report, exit."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sqlite3
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from tools.errors import DebugAgentError, TransportError, UsageError
from tools.snapshot import Snapshot

from . import __version__
from .experiments import Lab, Measure, UndoStack
from .graph import RECURSION_LIMIT, Ctx, build_graph
from .hosts import SSHOptions, open_transport
from .playbook import load_playbook
from .symptom import check_pair, direction_flag, parse_symptom
from .transcript import SCHEMA_VERSION, Transcript, write_markdown

err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)


@dataclass
class RunOptions:
    host: str
    symptom: str
    baseline: str | None = None
    baseline_snapshot: str | None = None
    playbook: str | None = None
    bench: str | None = None
    repo: str | None = None
    python: str | None = None
    allow_mutations: bool = False
    as_json: bool = False
    out: str | None = None
    llm: str | None = None
    llm_model: str = "gpt-4o-mini"
    ssh: SSHOptions = field(default_factory=SSHOptions)
    server_pattern: str | None = None
    bench_regex: str | None = None
    reproduce_runs: int = 8
    max_runs: int | None = None
    higher_is_better: bool = False
    lower_is_better: bool = False


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "run"


class View:
    """The live console view: each hypothesis with its status, and the running command."""

    ICON = {"pending": "·", "suspect": "?", "confirmed": "✔", "ruled_out": "✗", "inconclusive": "~"}

    def __init__(self, order: list[str], quiet: bool) -> None:
        self.status = {h: "pending" for h in order}
        self.line = ""
        self.quiet = quiet
        self.live: Live | None = None
        if err.is_terminal and not quiet:
            self.live = Live(self.table(), console=err, refresh_per_second=8, transient=False)

    def table(self) -> Table:
        t = Table(box=None, show_header=False)
        for h, st in self.status.items():
            t.add_row(self.ICON.get(st, "?"), h, st.replace("_", " "))
        t.add_row("", "[dim]" + escape(self.line[:110]) + "[/]", "")
        return t

    def update(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "tool_call":
            self.line = f"$ {data.get('display', '')}"
        elif kind == "verdict":
            self.status[data["hypothesis"]] = data["status"]
            if not self.live and not self.quiet:
                err.print(escape(f"[verdict] {data['hypothesis']}: {data['status'].replace('_', ' ')}"))
        elif kind == "reasoning" and not self.live and not self.quiet:
            err.print(escape(f"[agent] {data.get('text', '')[:200]}"))
        if self.live:
            self.live.update(self.table())

    def __enter__(self) -> View:
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *a: Any) -> None:
        if self.live:
            self.live.__exit__(*a)


def make_confirm():
    if not sys.stdin.isatty():
        return None

    def confirm(question: str) -> bool:
        err.print(f"[bold]Experiment[/]: {question}. Run it? [y/N] ", end="")
        try:
            return input().strip().lower() in ("y", "yes")
        except EOFError:
            return False
    return confirm


def prepare(opts: RunOptions) -> tuple[Any, Any, Any, Any]:
    direction = direction_flag(opts.higher_is_better, opts.lower_is_better)
    symptom = parse_symptom(opts.symptom, "--symptom", direction)
    baseline = parse_symptom(opts.baseline, "--baseline", direction) if opts.baseline else None
    if baseline:
        check_pair(symptom, baseline)
    if opts.baseline and opts.baseline_snapshot:
        raise UsageError("--baseline and --baseline-snapshot both given", fix="give one: a number or a snapshot of the good state")
    snap = Snapshot.load(opts.baseline_snapshot) if opts.baseline_snapshot else None
    playbook = load_playbook(opts.playbook)
    return symptom, baseline, snap, playbook


def execute(opts: RunOptions, *, folder: Path | None = None, resume: bool = False) -> int:
    """Run (or resume) an investigation, print its result, return the exit code."""
    output = investigate(opts, folder=folder, resume=resume)
    if "interrupted" in output:
        return 130
    if opts.as_json:
        print(json.dumps(output, indent=1))
    else:
        print_human(output)
    return int(output["exit_code"])


def investigate(opts: RunOptions, *, folder: Path | None = None, resume: bool = False,
                transport: Any = None) -> dict[str, Any]:
    """The investigation itself; returns the ``--json`` object.

    ``transport`` lets a caller (a test, a notebook) pass an open transport; it is then
    left open.
    """
    symptom, baseline, base_snap, playbook = prepare(opts)
    if folder is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        folder = Path(opts.out) if opts.out else Path("transcripts") / f"{stamp}-{slug(opts.host.split(':')[-1] + '-' + symptom.metric)}"
        if (folder / "events.jsonl").exists():
            raise UsageError(f"--out {folder} already holds a run", fix="choose a new folder, or `debugagent resume` it")
    folder.mkdir(parents=True, exist_ok=True)
    if not resume:
        # unique on the host too: it names debugagent's worktree and saved files there
        run_id = f"{folder.name}-{secrets.token_hex(3)}"
        d = asdict(opts)
        d["run_id"] = run_id
        (folder / "run.json").write_text(json.dumps(d, indent=1))
    else:
        run_id = json.loads((folder / "run.json").read_text()).get("run_id") or folder.name
    transcript = Transcript(folder, run_id)
    owned = transport is None
    try:
        if transport is None:
            transport = open_transport(opts.host, opts.ssh)
    except TransportError as exc:
        transcript.emit("run_started", **header(opts, playbook, run_id)) if not resume else None
        transcript.emit("error", message=str(exc), kind="transport")
        transcript.close()
        write_markdown(folder)
        raise
    undo = UndoStack(folder / "undo.json")
    if hasattr(transport, "on_event"):
        transport.on_event = lambda kind, text: transcript.emit("error", kind=kind, message=text)
    advisor = None
    if opts.llm:
        from .llm import Advisor
        advisor = Advisor(opts.llm, opts.llm_model)
    view = View(playbook.order(), quiet=opts.as_json)
    sim = opts.host.startswith("sim:")
    ctx = Ctx(transport=transport, transcript=transcript, playbook=playbook, run_id=run_id, undo=undo, symptom=symptom,
              baseline=baseline, baseline_snapshot=base_snap, allow_mutations=opts.allow_mutations or sim,
              confirm=make_confirm(), advisor=advisor, on_status=view.update,
              overrides={"bench": opts.bench, "repo": opts.repo, "python": opts.python,
                         "server_pattern": opts.server_pattern, "bench_regex": opts.bench_regex,
                         "reproduce_runs": opts.reproduce_runs, "max_runs": opts.max_runs})
    if resume:
        transcript.emit("resumed", text=f"resumed on {transport.host}; the last finished step is kept, the rest runs again")
    else:
        transcript.emit("run_started", **header(opts, playbook, run_id, base_snap))
    conn = sqlite3.connect(str(folder / "checkpoints.sqlite"), check_same_thread=False)
    graph = build_graph(ctx, checkpointer=SqliteSaver(conn))
    config = {"configurable": {"thread_id": run_id}, "recursion_limit": RECURSION_LIMIT}
    started = time.monotonic()
    state: dict[str, Any] = {}
    old = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with view:
            state = graph.invoke(None if resume else {"inputs": {"symptom": opts.symptom}}, config)
    except KeyboardInterrupt:
        restore(ctx)
        transcript.emit("interrupted", text="interrupted (SIGINT); every change was undone; `debugagent resume "
                        f"{folder}` continues from the last finished step")
        transcript.close()
        write_markdown(folder)
        err.print(f"interrupted; the host is as it was found. Continue with: debugagent resume {folder}")
        return {"interrupted": True, "transcript": str(folder)}
    except TransportError as exc:
        restore(ctx)
        transcript.emit("error", message=str(exc), kind="transport")
        transcript.close()
        write_markdown(folder)
        raise
    except DebugAgentError as exc:
        restore(ctx)
        transcript.emit("error", message=str(exc), kind=type(exc).__name__)
        transcript.close()
        write_markdown(folder)
        raise
    finally:
        signal.signal(signal.SIGINT, old)
        conn.close()
        if owned:
            transport.close()
    transcript.close()
    conclusion = state.get("conclusion") or {}
    wall = time.monotonic() - started
    output = {k: conclusion.get(k) for k in ("schema", "root_cause", "root_causes", "suspects", "ruled_out",
                                             "inconclusive", "not_judged", "commands")}
    output.update(transcript=str(folder), exit_code=conclusion.get("exit_code", 3), summary=conclusion.get("summary"),
                  bench_runs=conclusion.get("bench_runs"), regression=conclusion.get("regression"),
                  notes=conclusion.get("notes"), wall_s=round(wall, 2))
    return output


def restore(ctx: Ctx) -> None:
    """Undo whatever an interrupted experiment left on the host; say so loudly if it cannot."""
    if not ctx.undo.steps:
        return
    lab = Lab(ctx.runner, lambda ev, **kw: ctx.transcript.emit(ev, **kw), ctx.undo, Measure("", "", None), ctx.run_id, True)
    try:
        lab.do_undo(ctx.runner("undo"))
    except DebugAgentError as exc:
        left = ", ".join(s.text for s in ctx.undo.steps) or "the step in flight"
        msg = (f"could not undo on {ctx.transport.host}: {exc}; left to do by hand: {left} "
               f"(also in {ctx.undo.path})")
        ctx.transcript.emit("error", kind="undo", message=msg)
        err.print(f"[red]warning[/]: {escape(msg)}")


def header(opts: RunOptions, playbook: Any, run_id: str, snap: Snapshot | None = None) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "debugagent_version": __version__, "run_id": run_id, "host": opts.host,
            "symptom": opts.symptom, "baseline": opts.baseline, "baseline_snapshot": opts.baseline_snapshot,
            "playbook": playbook.name, "playbook_source": os.path.basename(playbook.source), "playbook_digest": playbook.digest,
            "inputs": {"bench": opts.bench, "repo": opts.repo, "python": opts.python, "server_pattern": opts.server_pattern,
                       "bench_regex": opts.bench_regex, "reproduce_runs": opts.reproduce_runs, "max_runs": opts.max_runs,
                       "allow_mutations": opts.allow_mutations, "llm": bool(opts.llm),
                       "direction": direction_flag(opts.higher_is_better, opts.lower_is_better)},
            "baseline_snapshot_data": snap.model_dump(mode="json") if snap else None}


def print_human(o: dict[str, Any]) -> None:
    out = Console(highlight=False, soft_wrap=True, emoji=False)
    out.print()
    out.print(f"[bold]{escape(o['summary'])}[/]")
    for s in o.get("suspects") or []:
        nxt = f" (to decide: {s['next']})" if s.get("next") else ""
        out.print(f"  suspect {s['hypothesis']}: {escape(s['because'])}{escape(nxt)}")
    for s in o.get("inconclusive") or []:
        out.print(f"  [yellow]not decided[/] {s['hypothesis']}: {escape(s['because'][:160])}")
    for r in o.get("ruled_out") or []:
        out.print(f"  [dim]ruled out {r['hypothesis']}: {escape(r['because'][:160])}[/]")
    for n in o.get("notes") or []:
        out.print(f"  [yellow]note[/]: {escape(n)}")
    out.print(f"\n{o['commands']} commands, {o.get('bench_runs') or 0} benchmark runs, {o['wall_s']} s. "
              f"Transcript: {o['transcript']}/transcript.md")


def resume_run(run_dir: str, *, allow_mutations: bool = False, as_json: bool = False) -> int:
    folder = Path(run_dir)
    p = folder / "run.json"
    if not p.is_file():
        raise UsageError(f"{run_dir}: no run.json (not a debugagent run folder)", fix="give the folder `debugagent run` wrote")
    d = json.loads(p.read_text())
    d.pop("run_id", None)
    d["ssh"] = SSHOptions(**d.get("ssh", {}))
    opts = RunOptions(**d)
    opts.allow_mutations = opts.allow_mutations or allow_mutations
    opts.as_json = as_json
    return execute(opts, folder=folder, resume=True)
