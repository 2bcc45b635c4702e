"""The ``debugagent`` command line.

Exit codes: 0 root cause found (or the command did what it says; ``diff``: the snapshots are the same, 1 they
differ) · 3 tree exhausted, no
root cause · 2 bad input · 4 cannot reach or log into the host · 5 replay differs from
its recording · 6 the host could not be fully restored (``debugagent undo RUN`` retries)
· 130 interrupted (SIGINT, SIGTERM, SIGHUP), every change undone · 1 internal error.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from debugagent.tools.errors import DebugAgentError, UsageError
from debugagent.tools.redact import redact, redact_text, write_private
from pydantic import ValidationError
from rich.markup import escape

from .config import RunConfig, SSHOptions, bounds, flag_fields, usage_error
from .hosts import host_help, open_transport
from .sinks import console

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
    help="Diagnose performance regressions on GPU inference hosts.\n\n"
         "Example: debugagent run --host gpu-box --symptom 'verify 30ms' --baseline 'verify 20ms'. Try it on a simulated host: debugagent sim list, then --host sim:NAME.",
)
sim_app = typer.Typer(no_args_is_help=True, help="The built-in simulated GPU hosts.")
playbook_app = typer.Typer(no_args_is_help=True, help="List, show, validate, test and start playbooks.")
app.add_typer(sim_app, name="sim")
app.add_typer(playbook_app, name="playbook")
fleet_app = typer.Typer(no_args_is_help=True, help="Many hosts: snapshot a fleet, find the odd host out.")
app.add_typer(fleet_app, name="fleet")
runs_app = typer.Typer(no_args_is_help=True, help="List, show and prune the run folders under the state folder.")
app.add_typer(runs_app, name="runs")
err = console(stderr=True)
out = console()

HOST_HELP = {"host": host_help()}   # the --host forms, from the table of transports (agent/hosts.py)


# ---------------------------------------------------------------- conventions: --version, JSON errors
def package_version() -> str:
    """The installed distribution's version (its metadata), the source tree's when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("debugagent")
    except PackageNotFoundError:
        from . import __version__
        return __version__


def show_version(value: bool) -> None:
    if value:
        print(f"debugagent {package_version()}")
        raise typer.Exit(0)


@app.callback()
def top(version: Annotated[bool, typer.Option("--version", callback=show_version, is_eager=True,
                                              help="print debugagent's version and exit")] = False) -> None:
    """Diagnose performance regressions on GPU inference hosts."""


ERROR_KIND = {1: "internal", 2: "usage", 4: "host", 5: "replay_differs", 6: "restore", 130: "interrupted"}


def wants_json(argv: Sequence[str]) -> bool:
    """``--json`` among the options (not after ``--``, not as another option's value)."""
    args = list(argv)
    if "--" in args:
        args = args[:args.index("--")]
    return "--json" in args


def json_error(message: str, code: int, fix: str | None = None, left: Sequence[str] = ()) -> None:
    """Under ``--json``, an error is one JSON object on stdout too (docs/verdicts.md#errors-under---json)."""
    body: dict[str, Any] = {"kind": ERROR_KIND.get(code, "internal"), "message": redact_text(message), "exit": code}
    if fix:
        body["fix"] = redact_text(fix)
    if left:
        body["left_to_undo"] = [redact_text(x) for x in left]
    try:
        sys.stdout.write(json.dumps({"error": body}, indent=1) + "\n")
        sys.stdout.flush()
    except OSError:
        pass


# ---------------------------------------------------------------- options made from the configuration
def options_of(model: type, only: Iterable[str] | None = None, help: Mapping[str, str] | None = None,
               ) -> list[inspect.Parameter]:
    """Typer options for a model's fields (``RunConfig``, ``SSHOptions``): the flag's names and metavar, the
    field's description as help (or ``help[name]``), its default, and its ``ge``/``le`` bounds as the option's
    range (out of range: exit 2 naming the flag and the range)."""
    fields = flag_fields(model)
    params = []
    for name in (only if only is not None else fields):
        annotation, info, fl = fields[name]
        b = bounds(info.metadata)   # gt/lt have no click range: RunConfig.from_flags names the flag
        option = typer.Option(*fl.names, metavar=fl.metavar, help=(help or {}).get(name, info.description),
                              min=b.get("ge"), max=b.get("le"))
        default = inspect.Parameter.empty if info.is_required() else info.get_default(call_default_factory=True)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=Annotated[annotation, option]))
    return params


def with_options(head: Sequence[inspect.Parameter] = (), tail: Sequence[inspect.Parameter] = (),
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the options ``options_of`` made, before and after its own parameters (it takes them as
    ``**kw``); the order is the order of ``--help``."""
    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func, eval_str=True)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        func.__signature__ = sig.replace(parameters=[*head, *own, *tail])  # type: ignore[attr-defined]
        return func
    return wrap


def ssh_opts(kw: Mapping[str, Any]) -> SSHOptions:
    """The SSH options from a command's values (exit 2 naming the flag of one out of its bounds)."""
    try:
        return SSHOptions.model_validate({k: kw[k] for k in SSHOptions.model_fields})
    except ValidationError as exc:
        raise usage_error(SSHOptions, exc) from None


# ---------------------------------------------------------------- run
@app.command()
@with_options(options_of(RunConfig, help=HOST_HELP))
def run(**values: Any) -> None:
    """Investigate a regression: reproduce it, gather evidence, run experiments, conclude."""
    opts = RunConfig.from_flags(values)
    if err.is_terminal and not opts.as_json:   # at once, before the heavy imports
        err.print(escape(f"debugagent run: {opts.symptom}" + (f" (was {opts.baseline})" if opts.baseline else "")
                         + f" on {opts.host}"))
    from .run import execute
    raise typer.Exit(execute(opts, unattended_check=True))


RESUME_HELP = {"allow_mutations": "run the remaining experiments (each undone afterwards) without asking",
               "bench": "the benchmark again, where it held a secret (never saved)",
               "llm": "the LLM URL again, where it held a secret (never saved)"}


@app.command()
@with_options(tail=options_of(RunConfig, ("allow_mutations", "as_json", "bench", "llm", "force_unlock"), RESUME_HELP))
def resume(run_dir: Annotated[str, typer.Argument(metavar="RUN", help="the transcript folder of the interrupted run")],
           **again: Any) -> None:
    """Continue an interrupted run from its last checkpoint (after restoring what its journal left unfinished)."""
    from .run import resume_run
    raise typer.Exit(resume_run(run_dir, **again))


@app.command()
@with_options(tail=options_of(RunConfig, ("force_unlock",)))
def undo(run_dir: Annotated[str, typer.Argument(metavar="RUN", help="the folder of the run that left changes (a crash, a kill, a lost connection)")],
         **kw: Any) -> None:
    """Restore what a run left changed on its host, from its undo journal; exit 6 saying what is left if it cannot."""
    from .run import undo_run
    raise typer.Exit(undo_run(run_dir, **kw))


@app.command()
def replay(run_dir: Annotated[str, typer.Argument(metavar="RUN", help="a transcript folder (or its events.jsonl)")],
           playbook: Annotated[str | None, typer.Option("--playbook", metavar="NAME|FILE", help="replay against another playbook")] = None,
           as_json: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False) -> None:
    """Re-run a recorded run against its recorded outputs: same conclusion (exit 0) or a diff (exit 5)."""
    from .replay import replay_run
    raise typer.Exit(replay_run(run_dir, playbook=playbook, as_json=as_json))


@app.command()
def report(run_dir: Annotated[str, typer.Argument(metavar="RUN", help="a run folder (the one `debugagent run` printed)")],
           no_open: Annotated[bool, typer.Option("--no-open", help="print the path only; do not open a browser")] = False,
           as_bundle: Annotated[bool, typer.Option("--bundle", help="write the run's issue bundle instead, as `debugagent bundle RUN` does")] = False,
           output: Annotated[str | None, typer.Option("-o", "--out", metavar="FILE", help="with --bundle: where to write the .tar.gz (default: bundle.tar.gz in the run folder)")] = None) -> None:
    """Print the path of a run's report.html and open it in a browser when a display exists; with --bundle, write
    its issue bundle (`debugagent bundle RUN`)."""
    if as_bundle:
        from .bundle import write_bundle
        print(write_bundle(run_dir, output))
        return
    if output is not None:
        raise UsageError(f"-o/--out {output}: only the bundle is written to a file", fix=f"add --bundle: debugagent report --bundle {run_dir} -o {output}")
    from .outputs import FORMATS, missing, write_outputs
    folder = Path(run_dir)
    if folder.name == "events.jsonl":
        folder = folder.parent
    page = folder / FORMATS["html"].file
    if not page.is_file():
        if not (folder / "events.jsonl").is_file():
            raise UsageError(f"{run_dir}: no report.html and no events.jsonl (not a debugagent run folder)",
                             fix="give the folder `debugagent run` wrote (it prints it at the end)")
        write_outputs(folder, missing(folder))   # every registered format the folder lacks, report.html among them
    print(page.resolve())
    if not no_open and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or sys.platform == "darwin"):
        import webbrowser
        webbrowser.open(page.resolve().as_uri())


@app.command()
def bundle(run_dir: Annotated[str, typer.Argument(metavar="RUN", help="a run folder (the one `debugagent run` printed)")],
           output: Annotated[str | None, typer.Option("-o", "--out", metavar="FILE", help="where to write the .tar.gz (default: bundle.tar.gz in the run folder)")] = None) -> None:
    """Write one .tar.gz for an engine's bug report: launch command, environment reports before and now, both
    benchmark results, version and effective-config differences, clock events, Xid lines; redacted, from the run
    folder alone."""
    from .bundle import write_bundle
    print(write_bundle(run_dir, output))


# ---------------------------------------------------------------- snapshot / diff
@app.command()
@with_options(options_of(RunConfig, ("host",), HOST_HELP), options_of(SSHOptions))
def snapshot(
    output: Annotated[str, typer.Option("-o", "--out", "--output", metavar="FILE", help="where to write the JSON (- for stdout)")],
    bench: Annotated[str | None, typer.Option("--bench", metavar="CMD", help="benchmark command printing METRIC=VALUE UNIT; run while GPUs are sampled, and --bench-runs times for the snapshot's own numbers")] = None,
    metric: Annotated[str | None, typer.Option("--metric", metavar="NAME", help="the METRIC the benchmark prints (as in --symptom 'METRIC VALUE UNIT'); default: the host profile's")] = None,
    bench_regex: Annotated[str | None, typer.Option("--bench-regex", metavar="REGEX", help="regex whose group 1 is the number in the benchmark's output (instead of --metric)")] = None,
    repo: Annotated[str | None, typer.Option("--repo", metavar="DIR", help="the server's git checkout on the host")] = None,
    python: Annotated[str | None, typer.Option("--python", metavar="PATH", help="the server's Python interpreter on the host")] = None,
    server_pattern: Annotated[str | None, typer.Option("--server-pattern", metavar="REGEX", help="regex for the server's command line (default: SGLang, vLLM, TGI, TensorRT-LLM)")] = None,
    bench_runs: Annotated[int, typer.Option("--bench-runs", metavar="N", min=0, help="benchmark runs recorded in the snapshot: its baseline numbers and their noise (a run's test cannot be surer than these few runs let it)")] = 5,
    **kw: Any,
) -> None:
    """Write the host's fingerprint as JSON: git, packages and build hashes, GPUs, driver, server, CPU.

    The server is found as `run` finds it (the same --server-pattern, --python, --repo,
    --bench overrides). With a benchmark (--bench with --metric or --bench-regex, or the
    host profile /etc/debugagent/host.json), GPUs are sampled while it runs and
    --bench-runs results are recorded: a snapshot of the good state then serves as
    --baseline-snapshot with its own baseline numbers.
    """
    from debugagent.tools.registry import Runner
    from debugagent.tools.snapshot import collect, dump
    if output != "-" and (Path(output).is_dir() or not Path(output).parent.is_dir()):
        raise UsageError(f"-o {output}: " + ("is a folder" if Path(output).is_dir() else
                                             f"the folder {Path(output).parent} does not exist"),
                         fix="give a file path in an existing folder (mkdir -p it first), or -o - for stdout")

    from .discovery import DiscoveryInput, check_input
    check_input(DiscoveryInput(server_pattern=server_pattern, python=python, repo=repo, bench=bench,
                               bench_regex=bench_regex, metric=metric), bench_runs=bench_runs)
    host = kw["host"]
    with open_transport(host, ssh_opts(kw)) as tr:
        with err.status(f"snapshot of {host} …"):
            snap = collect(Runner(tr), bench=bench, python=python, repo=repo, server_pattern=server_pattern,
                           metric=metric, bench_regex=bench_regex, bench_runs=bench_runs)
    text = dump(snap)
    if output == "-":
        sys.stdout.write(text + "\n")
    else:
        try:
            write_private(Path(output), text + "\n")
        except OSError as exc:
            raise UsageError(f"-o {output}: cannot write it ({exc.strerror})",
                             fix="give a file in a folder that exists and that you can write to") from exc
        samples = snap.bench.get("samples") or []
        from debugagent.tools.probes.text import plural
        err.print(f"wrote {output}: {plural(len(snap.packages.packages) if snap.packages else 0, 'package')}, "
                  f"{plural(len(snap.gpus), 'GPU')}, {plural(snap.commands, 'command')}"
                  + (f", server pid {snap.server.pid}" if snap.server else ", no server found")
                  + (f", {plural(len(samples), 'benchmark run')}" if snap.bench else "")
                  + (f", {plural(len(snap.errors), 'error')}" if snap.errors else ""))
    if snap.bench and not snap.bench.get("samples") and bench_runs > 0:
        err.print("  [yellow]note[/]: the benchmark gave no numbers: this snapshot cannot serve as a baseline number "
                  "(give --metric or --bench-regex, and check the benchmark's output)")
    for e in snap.errors:
        err.print(f"  [yellow]note[/]: {escape(e)}")


@app.command("diff")
def diff_cmd(a: Annotated[str, typer.Argument(metavar="GOOD.json", help="snapshot of the good state")],
             b: Annotated[str, typer.Argument(metavar="BAD.json", help="snapshot of the bad state")],
             as_json: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
             playbook: Annotated[str | None, typer.Option("--playbook", metavar="NAME|FILE", help="the playbook whose hypotheses' evidence files the changes (default: gpu-inference-regression)")] = None) -> None:
    """What differs between two snapshots, grouped by hypothesis id (as the playbook's `evidence` says).

    Exit 0 when they are the same, 1 when they differ, 2 on bad input (as diff(1)).
    """
    from debugagent.tools.snapshot import Snapshot, diff

    from .playbook import load_playbook
    groups = load_playbook(playbook).group(diff(Snapshot.load(a), Snapshot.load(b)))
    if as_json:
        print(json.dumps({h: [{**c.model_dump(mode="json"), "hypothesis": h} for c in cs] for h, cs in groups.items()},
                         indent=1))
    elif not groups:
        out.print("no differences")
    else:
        for hyp, cs in groups.items():
            out.print(f"[bold]{hyp}[/]")
            for c in cs:
                note = f"  ({c.note})" if c.note else ""
                out.print(escape(f"  {c.path}: {c.a!r} -> {c.b!r}{note}"))
    raise typer.Exit(1 if groups else 0)   # as diff(1): 0 the same, 1 they differ, 2 bad input


# ---------------------------------------------------------------- sim
@sim_app.command("list")
def sim_list() -> None:
    """Name the built-in simulated hosts, with their story."""
    from debugagent.tools.sim import builtin_names, load_scenario
    for n in builtin_names():
        s = load_scenario(n)
        out.print(f"[bold]{n}[/]  {escape(s.symptom)} (was {escape(s.baseline)})")
        out.print("    " + escape(" ".join(s.story.split())), style="dim")
    out.print("\nrun one: debugagent run --host sim:NAME --symptom '…' --baseline '…'  (the symptom and baseline above)")


@sim_app.command("schema")
def sim_schema() -> None:
    """Print the scenario file's JSON Schema (format version 1, for editors)."""
    from debugagent.tools.sim.scenario import scenario_schema
    print(json.dumps(scenario_schema(), indent=1))


@sim_app.command("validate")
def sim_validate(path: Annotated[str, typer.Argument(metavar="FILE", help="the scenario .yaml to check")]) -> None:
    """Check a scenario file as the simulator reads it (format version 1): exit 0 and a summary, or exit 2
    naming the file, the line and field, and the fix. Nothing is started."""
    from debugagent.tools.sim.scenario import builtin_names, parse_scenario
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"sim validate {path}: no such file",
                         fix=f"give a scenario .yaml (`debugagent sim new --like {builtin_names()[0]} FILE` starts one)")
    try:
        text = p.read_bytes().decode()
    except UnicodeDecodeError:
        raise UsageError(f"sim validate {path}: is not text (UTF-8)", fix="give a scenario .yaml") from None
    sc = parse_scenario(text, path)
    out.print(escape(f"ok: {sc.name}: {sc.symptom} (was {sc.baseline}); {len(sc.factors)} factor(s)"
                     f" ({', '.join(f.path for f in sc.factors) or 'none'}); expects "
                     f"{sc.expect.root_cause or 'no root cause'}"))



@sim_app.command("from-snapshots")
def sim_from_snapshots(
        good: Annotated[str, typer.Argument(metavar="GOOD.json", help="a snapshot of the good state (`debugagent snapshot --bench-runs 5`)")],
        bad: Annotated[str, typer.Argument(metavar="BAD.json", help="a snapshot of the bad state")],
        output: Annotated[str, typer.Option("-o", "--out", metavar="FILE", help="the scenario .yaml to write (never overwritten)")],
        expect: Annotated[str, typer.Option("--expect", metavar="HYPOTHESIS", help="the cause the real host's run found (a hypothesis id), or `none` for no regression")],
        name: Annotated[str | None, typer.Option("--name", metavar="NAME", help="the scenario's name (default: from FILE)")] = None,
        mentions: Annotated[str | None, typer.Option("--mentions", metavar="WORD", help="a word the answer must name")] = None,
        effect: Annotated[list[str] | None, typer.Option("--effect", metavar="PATH=DELTA", help="what one difference costs, in the metric's unit (default: the change shared equally)")] = None,
) -> None:
    """Make a scenario from two real snapshots: the host is the bad one's, each difference `diff` reports is a
    factor, the benchmarks' numbers give the effects; validated before it is written."""
    import re as _re

    from debugagent.tools.sim.fromsnap import scenario_from_snapshots, write_scenario
    from debugagent.tools.snapshot import Snapshot
    if Path(output).exists():
        raise UsageError(f"-o {output}: the file exists", fix="give a new file name (nothing is overwritten)")
    effects: dict[str, float] = {}
    for e in effect or []:
        path, _, value = e.partition("=")
        try:
            effects[path] = float(value)
        except ValueError:
            raise UsageError(f"--effect {e}: not PATH=DELTA", fix="e.g. --effect server.args.dtype=-1070") from None
    sc, notes = scenario_from_snapshots(
        Snapshot.load(good), Snapshot.load(bad), expect=None if expect == "none" else expect, mentions=mentions,
        effects=effects, name=name or _re.sub(r"[^a-z0-9-]+", "-", Path(output).stem.lower()).strip("-") or "from-snapshots")
    write_scenario(sc, output, f"{good} {bad}")
    for n in notes:
        err.print(escape(f"note: {n}"))
    err.print(escape(f"wrote {output}: {len(sc['factors'])} factor(s) ({', '.join(f['path'] for f in sc['factors']) or 'none'}); "
                     f"run it: debugagent run --host sim:{output} --symptom '{sc['symptom']}' --baseline '{sc['baseline']}'"))

@sim_app.command("new")
def sim_new(path: Annotated[str, typer.Argument(metavar="FILE", help="where to write the new scenario .yaml")],
            like: Annotated[str, typer.Option("--like", metavar="NAME", help="the built-in scenario to start from (`debugagent sim list`)")] = "power-capped") -> None:
    """Start a scenario file from a built-in one (its host, benchmark and factors), renamed after FILE;
    edit it, then `debugagent sim validate FILE` and `debugagent run --host sim:FILE ...`."""
    import re as _re

    from debugagent.tools.sim.scenario import builtin_dir, load_scenario
    src = load_scenario(like)
    p = Path(path)
    if p.exists():
        raise UsageError(f"sim new {path}: the file exists", fix="give a new file name (nothing is overwritten)")
    if not p.parent.is_dir():
        raise UsageError(f"sim new {path}: the folder {p.parent} does not exist", fix="mkdir -p it first")
    text = (builtin_dir() / f"{src.name}.yaml").read_text()
    name = _re.sub(r"[^a-z0-9-]+", "-", p.stem.lower()).strip("-") or "my-scenario"
    text = _re.sub(r"(?m)^name: .*$", f"name: {name}", text, count=1)
    p.write_text(f"# made by `debugagent sim new --like {src.name}`: edit the host, the benchmark and the factors\n"
                 + text)
    err.print(escape(f"wrote {path} (like {src.name}); check it with: debugagent sim validate {path}"))


@sim_app.command("serve")
def sim_serve(name: Annotated[str, typer.Argument(metavar="NAME|FILE", help="built-in scenario name or a scenario .yaml")],
              port: Annotated[int, typer.Option("--port", metavar="PORT", help="port on 127.0.0.1 (0: a free one)")] = 0,
              good: Annotated[bool, typer.Option("--good", help="serve the good state")] = False) -> None:
    """Serve a simulated host behind a real OpenSSH server on 127.0.0.1 (foreground; Ctrl-C stops)."""
    from debugagent.tools.sim.serve import serve
    raise typer.Exit(serve(name + ("@good" if good else ""), port))


# ---------------------------------------------------------------- runs
def _runs_root() -> Path:
    from .run import state_runs_dir
    return state_runs_dir()


def _run_row(r: Any) -> dict[str, Any]:
    return {"id": r.id, "folder": str(r.folder), "started": r.started.isoformat(timespec="seconds") if r.started else None,
            "host": r.host, "symptom": r.symptom, "exit_code": r.exit_code, "verdict": r.verdict, "size": r.size,
            "live": r.live, "unsettled": r.unsettled or None}


@runs_app.command("list")
def runs_list(as_json: Annotated[bool, typer.Option("--json", help="print one JSON list on stdout")] = False) -> None:
    """The runs under the state folder, newest first: id, when, host, symptom, exit and verdict, size."""
    from .runs import human_size, list_runs
    root = _runs_root()
    runs = list_runs(root)
    if as_json:
        print(json.dumps([_run_row(r) for r in runs], indent=1))
        return
    if not runs:
        out.print(escape(f"no runs in {root}"))
        return
    rows = [("RUN", "STARTED (UTC)", "HOST", "SYMPTOM", "EXIT", "VERDICT", "SIZE")]
    for r in runs:
        verdict = r.verdict + (" · live" if r.live else "") + (" · undo pending" if r.unsettled else "")
        rows.append((r.folder.name, r.started.strftime("%Y-%m-%d %H:%M") if r.started else "?", r.host, r.symptom,
                     "" if r.exit_code is None else str(r.exit_code), verdict, human_size(r.size)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:   # one line a run, as `ls -l` does: a pipe or a narrow terminal gets no folded columns
        out.print(escape("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]))
    out.print(escape(f"{len(runs)} run(s) in {root}, {human_size(sum(r.size for r in runs))}; "
                     "`debugagent runs prune --older-than 7d` or `--keep N` removes old ones"))


@runs_app.command("show")
def runs_show(run_dir: Annotated[str, typer.Argument(metavar="RUN", help="a run's folder, its name under the state folder, or a prefix of it")],
              as_json: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False) -> None:
    """One run: its host, symptom, verdict and summary, its files, whether its undo journal is settled."""
    from .runs import find_run, human_size, read_run
    r = read_run(find_run(_runs_root(), run_dir))
    if as_json:
        print(json.dumps({**_run_row(r), "summary": r.summary, "notes": r.notes}, indent=1))
        return
    rows = [("run", r.id), ("folder", str(r.folder)), ("started", r.started.isoformat(timespec="seconds") if r.started else "?"),
            ("host", r.host), ("symptom", r.symptom), ("exit", "" if r.exit_code is None else str(r.exit_code)),
            ("verdict", r.verdict + (" (live: still running)" if r.live else "")),
            ("undo journal", r.unsettled + f" (`debugagent undo {r.folder}`)" if r.unsettled else "settled"),
            ("size", human_size(r.size))]
    for k, v in rows:
        out.print(escape(f"{k:>13}: {v}"))
    if r.summary:
        out.print(escape(f"{'summary':>13}: {r.summary}"))
    for name in ("transcript.md", "report.html", "events.jsonl"):
        if (r.folder / name).is_file():
            out.print(escape(f"{name:>13}: {r.folder / name}"))
    for n in r.notes:
        out.print(f"  [yellow]note[/]: {escape(n)}")


@runs_app.command("prune")
def runs_prune(older_than: Annotated[str | None, typer.Option("--older-than", metavar="AGE", help="remove runs started longer ago than AGE (7d, 12h, 30m, 2w)")] = None,
               keep: Annotated[int | None, typer.Option("--keep", metavar="N", help="keep the N newest runs, remove the others (with --older-than: only the older ones among them)")] = None,
               dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would go; remove nothing")] = False) -> None:
    """Remove old runs; never a live one, nor one whose undo journal is not settled (said, with the fix)."""
    from .runs import human_size, parse_age, prune
    res = prune(_runs_root(), parse_age(older_than) if older_than is not None else None, keep, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for r in res.removed:
        out.print(escape(f"{verb} {r.folder.name} ({human_size(r.size)})"))
    for r in res.kept:
        err.print(escape(f"kept {r.folder.name}: {r.kept_because}"))
    out.print(escape(f"{verb} {len(res.removed)} run(s), {human_size(res.freed)}"
                     + (f"; kept {len(res.kept)} that are live or have changes left to undo" if res.kept else "")))


# ---------------------------------------------------------------- playbooks
@playbook_app.command("list")
def playbook_list() -> None:
    """Name the built-in playbooks."""
    from .playbook import builtin_playbooks, load_playbook
    for n in builtin_playbooks():
        pb = load_playbook(n)
        out.print(escape(f"{n}: {pb.description.strip().splitlines()[0] if pb.description else ''}"))


@playbook_app.command("show")
def playbook_show(name: Annotated[str, typer.Argument(metavar="NAME|FILE", help="a built-in playbook name or a playbook .yaml")]) -> None:
    """Print a playbook's tree: hypotheses in order, their checks, rules and experiments."""
    from .playbook import load_playbook, render_tree
    out.print(render_tree(load_playbook(name)), markup=False)


@playbook_app.command("validate")
def playbook_validate(path: Annotated[str, typer.Argument(metavar="FILE", help="the playbook .yaml to check")]) -> None:
    """Check a playbook file against the schema; exit 2 naming file and field on error."""
    from .playbook import load_playbook
    pb = load_playbook(path)
    for w in pb.shadow_warnings():
        err.print(f"warning: {path}: {w}", markup=False)
    out.print(f"ok: {path}: {len(pb.hypotheses)} hypotheses")


@playbook_app.command("new")
def playbook_new(path: Annotated[str, typer.Argument(metavar="FILE", help="where to write the new playbook .yaml")]) -> None:
    """Start a playbook from the default one, with comments."""
    from .playbook import new_playbook
    new_playbook(path)
    out.print(f"wrote {path}; check it with `debugagent playbook validate {path}`")


@playbook_app.command("schema")
def playbook_schema() -> None:
    """Print the playbook JSON Schema (for editors)."""
    from .playbook import Playbook
    print(json.dumps(Playbook.model_json_schema(), indent=1))


@playbook_app.command("test")
def playbook_test(path: Annotated[str, typer.Argument(metavar="FILE", help="the changed playbook .yaml")],
                  more: Annotated[list[str] | None, typer.Argument(metavar="[RUN]...", help="more run folders (what a shell makes of --transcript 'transcripts/*')", show_default=False)] = None,
                  transcript: Annotated[list[str] | None, typer.Option("--transcript", metavar="RUN", help="recorded run folder (repeatable; a glob such as 'transcripts/*', or a folder of run folders)")] = None) -> None:
    """Replay recorded runs against a changed playbook; exit 5 if any conclusion changes (a hypothesis the
    recording lacks is reported as new, not as a change)."""
    from .replay import replay_run, run_folders
    runs = run_folders([*(transcript or []), *(more or [])])
    worst = 0
    for t in runs:
        code = replay_run(str(t), playbook=path, as_json=False)
        worst = max(worst, code)
    raise typer.Exit(worst)


# ---------------------------------------------------------------- fleet
def _without(params: list[inspect.Parameter], name: str) -> list[inspect.Parameter]:
    """``params`` with the option spelling ``name`` dropped (``-i`` is the inventory here, as in Ansible)."""
    from typing import get_args
    for p in params:
        for info in get_args(p.annotation)[1:]:
            decls = getattr(info, "param_decls", None)
            if decls and name in decls:
                info.param_decls = tuple(d for d in decls if d != name)
    return params


@fleet_app.command("snapshot")
@with_options((), _without(options_of(SSHOptions), "-i"))
def fleet_snapshot(
    inventory: Annotated[str, typer.Option("-i", "--inventory", metavar="INVENTORY", help="an Ansible inventory (INI or YAML), a file of hosts one a line, or a comma list ('gpu-1,gpu-2,')")],
    output: Annotated[str, typer.Option("-o", "--out", metavar="DIR", help="the folder for the snapshots (one NAME.json a host, and fleet.json); made if missing, and must hold no fleet yet")],
    limit: Annotated[str | None, typer.Option("--limit", "-l", metavar="PATTERN", help="the hosts or groups to read, as Ansible's --limit ('gpu*:!canary', '~gpu-0[1-4]', 'h100&eu')")] = None,
    forks: Annotated[int, typer.Option("--forks", "-f", metavar="N", min=1, max=256, help="hosts read at once (one SSH connection each), as Ansible's --forks")] = 10,
    bench: Annotated[str | None, typer.Option("--bench", metavar="CMD", help="benchmark command run on each host (as `snapshot --bench`); its numbers are compared across the fleet")] = None,
    metric: Annotated[str | None, typer.Option("--metric", metavar="NAME", help="the METRIC the benchmark prints")] = None,
    bench_runs: Annotated[int, typer.Option("--bench-runs", metavar="N", min=0, help="benchmark runs per host")] = 3,
    via: Annotated[str, typer.Option("--via", metavar="ssh|ansible", help="how the hosts are reached: debugagent's own SSH (ssh), or `ansible -m raw` over the inventory, in rounds (ansible; needs ansible-core)")] = "ssh",
    **kw: Any,
) -> None:
    """Snapshot every host of an inventory at once, a bounded number at a time.

    Each host's snapshot is written to DIR/NAME.json as soon as it is taken, and
    DIR/fleet.json names every host with its file, or the reason it could not be read
    (a line per host; the others still finish). Exit 0 when every host was read, 4 when
    some could not be (each named), 2 for bad input. Then: `debugagent fleet diff DIR`.
    """
    from debugagent.tools.inventory import limit as apply_limit
    from debugagent.tools.inventory import load_inventory
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .fleet import FLEET_FILE, snapshot_fleet
    if via not in ("ssh", "ansible"):
        raise UsageError(f"--via {via}: not a way this debugagent reaches hosts", fix="give --via ssh or --via ansible")
    hosts = apply_limit(load_inventory(inventory), limit)
    if via == "ansible":
        from .fleet_ansible import ansible_binary
        ansible_binary()
        if not Path(inventory).is_file() and "," not in inventory:
            raise UsageError(f"-i {inventory}: --via ansible needs an inventory Ansible reads (a file, or 'h1,h2,')",
                             fix="give an INI or YAML inventory")
    d = Path(output)
    if d.exists() and not d.is_dir():
        raise UsageError(f"-o {output}: is a file", fix="give a folder (it is made if missing)")
    if (d / FLEET_FILE).exists():
        raise UsageError(f"-o {output}: holds a fleet already ({FLEET_FILE})", fix="give a new folder, or remove that one")
    from .hosts import scheme_of
    for h in hosts if via == "ssh" else []:   # every host's form is checked before any is contacted
        scheme, rest = scheme_of(h.target)
        try:
            scheme.check(rest)
        except UsageError as exc:
            raise UsageError(f"-i {inventory}: host `{h.name}` ({h.target}): {exc.message}", fix=exc.fix) from None
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"-o {output}: cannot make it ({exc.strerror})", fix="give a folder you can write to") from None
    ssh = ssh_opts(kw)
    args = {"bench": bench, "metric": metric, "bench_runs": bench_runs}   # no --bench: the host profile's, if any
    failed: list[str] = []
    progress = Progress(TextColumn("fleet snapshot"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
                        TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)

    def done(r: Any) -> None:
        if r.error:
            failed.append(r.name)
            err.print(redact_text(f"  {r.name}: could not be read: {r.error}") + (f" (fix: {r.fix})" if r.fix else ""),
                      markup=False)
        elif r.bench_failed:
            err.print(redact_text(f"  {r.name}: read ({r.file}), but its benchmark gave no numbers"
                                  + (f": {r.notes[-1]}" if r.notes else "")), markup=False)
        elif not err.is_terminal:
            err.print(f"  {r.name}: {r.file} ({r.seconds:.1f} s)", markup=False)
        progress.update(task, advance=1, failed=len(failed))

    with progress:
        task = progress.add_task("hosts", total=len(hosts), failed=0)
        if via == "ansible":
            from .fleet_ansible import snapshot_fleet_ansible
            rec = snapshot_fleet_ansible(hosts, d, inventory=inventory, forks=forks, limit=limit, collect_args=args,
                                         known_hosts=ssh.known_hosts, connect_timeout=ssh.connect_timeout, on_done=done)
        else:
            rec = snapshot_fleet(hosts, d, ssh, forks=forks, inventory=inventory, limit=limit, collect_args=args,
                                 on_done=done)
    ok = len(hosts) - len(failed)
    err.print(f"{ok} of {len(hosts)} hosts read in {rec.seconds:.1f} s ({forks} at a time"
              + (", through ansible -m raw" if via == "ansible" else "") + f"): {output}/"
              + (f"; not read: {', '.join(failed)}" if failed else "") + f"\nnext: debugagent fleet diff {output}",
              markup=False)
    raise typer.Exit(4 if failed else 0)


@fleet_app.command("diff")
def fleet_diff_cmd(
    folder: Annotated[str, typer.Argument(metavar="DIR", help="the folder `fleet snapshot` wrote (or a folder of snapshots)")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
    html: Annotated[str | None, typer.Option("--html", metavar="FILE", help="also write an HTML page, one row per host")] = None,
    playbook: Annotated[str | None, typer.Option("--playbook", metavar="NAME|FILE", help="the playbook whose hypotheses' evidence files the fields (default: gpu-inference-regression)")] = None,
    show_load: Annotated[bool, typer.Option("--show-load", help="also list readings that follow the load (power draw, temperature, clocks under load)")] = False,
) -> None:
    """Where the fleet's hosts disagree: for every field, the majority value and the odd hosts.

    Fields are compared as `debugagent diff` compares two snapshots, grouped by hypothesis;
    the benchmark's numbers (each host's median) as a distribution with its outliers
    (modified z-score beyond 3.5, from the median and the MAD). Exit 0 when the hosts
    agree, 1 when a field differs or a host is an outlier (as diff(1)), 2 for bad input.
    """
    from .fleet import fleet_diff, load_fleet
    from .fleet_render import render_html, render_text
    from .playbook import load_playbook
    pb = load_playbook(playbook)
    loaded = load_fleet(folder)
    fd = fleet_diff(loaded.snaps, pb.evidence_of, loaded.unread)
    if not show_load:
        fd.splits = [s for s in fd.splits if not s.follows_load]
    if html:
        try:
            write_private(Path(html), render_html(fd))
        except OSError as exc:
            raise UsageError(f"--html {html}: cannot write it ({exc.strerror})", fix="give a file in a folder you can write to") from None
    if as_json:
        print(json.dumps(redact(fd.model_dump(mode="json")), indent=1))
    else:
        for line in render_text(fd):
            out.print(redact_text(line), markup=False)
    raise typer.Exit(1 if fd.splits or (fd.bench and fd.bench.outliers) else 0)


def command():
    """The click command tree, arguments shown by their metavar alone (RUN, not `RUN <str>`)."""
    from typer.core import TyperArgument
    cmd = typer.main.get_command(app)

    def walk(c: Any) -> None:
        for p in c.params:
            if isinstance(p, TyperArgument):
                p.display_type_rich = lambda ctx: None   # type: ignore[attr-defined]
        for sub in getattr(c, "commands", {}).values():
            walk(sub)
    walk(cmd)
    return cmd


def main() -> None:
    as_json = wants_json(sys.argv[1:])
    try:
        rv = command().main(standalone_mode=False, prog_name="debugagent")
        sys.exit(rv if isinstance(rv, int) else 0)
    except DebugAgentError as exc:
        err.print("[red]error[/]: ", end="")
        err.print(redact_text(exc.message), markup=False)
        for item in getattr(exc, "left", None) or []:
            err.print(f"  left to undo: {redact_text(item)}", markup=False)
        if exc.fix:
            err.print(redact_text(f"  fix: {exc.fix}"), markup=False)
        if as_json:
            json_error(exc.message, exc.exit_code, exc.fix, getattr(exc, "left", None) or [])
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        if as_json:
            json_error("interrupted", 130)
        sys.exit(130)
    except Exception as exc:  # the CLI library's own usage errors (typer vendors click)
        names = {c.__name__ for c in type(exc).__mro__}
        if "ClickException" in names:
            exc.show()  # type: ignore[attr-defined]
            code = 2 if "UsageError" in names else getattr(exc, "exit_code", 1)
            if as_json:
                json_error(exc.format_message(), code)  # type: ignore[attr-defined]
            sys.exit(code)
        if "Abort" in names:
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
