"""The ``debugagent`` command line.

Exit codes: 0 root cause found (or the command did what it says) · 3 tree exhausted, no
root cause · 2 bad input · 4 cannot reach or log into the host · 5 replay differs from
its recording · 1 internal error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from tools.errors import DebugAgentError

from .hosts import SSHOptions, open_transport

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
    help="Diagnose performance regressions on GPU inference hosts.\n\n"
         "Example: debugagent run --host gpu-box --symptom 'verify 30ms' --baseline 'verify 20ms'. Try it on a simulated host: debugagent sim list, then --host sim:NAME.",
)
sim_app = typer.Typer(no_args_is_help=True, help="The built-in simulated GPU hosts.")
playbook_app = typer.Typer(no_args_is_help=True, help="List, show, validate, test and start playbooks.")
app.add_typer(sim_app, name="sim")
app.add_typer(playbook_app, name="playbook")
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True, emoji=False)

HostOpt = Annotated[str, typer.Option("--host", help="user@host[:port], an ~/.ssh/config alias, `local`, or sim:NAME[@good] / sim:PATH.yaml")]
IdentOpt = Annotated[str | None, typer.Option("--identity-file", "-i", help="private key file for SSH")]  # noqa: UP007
KnownOpt = Annotated[str | None, typer.Option("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)")]  # noqa: UP007
AcceptOpt = Annotated[bool, typer.Option("--accept-new-host-key", help="record an unknown host key (as OpenSSH's accept-new); a changed key is always refused")]
TimeoutOpt = Annotated[float, typer.Option("--connect-timeout", help="seconds to wait for the SSH connection")]


def ssh_opts(identity_file: str | None, known_hosts: str | None, accept: bool, timeout: float) -> SSHOptions:
    return SSHOptions(identity_file=identity_file, known_hosts=known_hosts, accept_new_host_key=accept, connect_timeout=timeout)


# ---------------------------------------------------------------- run
@app.command()
def run(
    host: HostOpt,
    symptom: Annotated[str, typer.Option("--symptom", help="what got worse: `verify 30ms`, `decode 82 tok/s`, `ttft 1.2 s`")],
    baseline: Annotated[str | None, typer.Option("--baseline", help="what it was when good: `verify 20ms`")] = None,
    baseline_snapshot: Annotated[str | None, typer.Option("--baseline-snapshot", help="a snapshot of the good state (debugagent snapshot)")] = None,
    playbook: Annotated[str | None, typer.Option("--playbook", help="playbook name or YAML path (default gpu-inference-regression)")] = None,
    bench: Annotated[str | None, typer.Option("--bench", help="benchmark command printing METRIC=VALUE UNIT")] = None,
    repo: Annotated[str | None, typer.Option("--repo", help="the server's git checkout on the host")] = None,
    python: Annotated[str | None, typer.Option("--python", help="the server's Python interpreter on the host")] = None,
    allow_mutations: Annotated[bool, typer.Option("--allow-mutations", help="run experiments (each undone afterwards) without asking")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
    out_dir: Annotated[str | None, typer.Option("--out", help="transcript folder (default transcripts/<UTC time>-<slug>/)")] = None,
    llm: Annotated[str | None, typer.Option("--llm", help="OpenAI-compatible base URL of an LLM that advises on the plan (optional)")] = None,
    llm_model: Annotated[str, typer.Option("--llm-model", help="model name for --llm")] = "gpt-4o-mini",
    server_pattern: Annotated[str | None, typer.Option("--server-pattern", help="regex for the server's command line (default: SGLang, vLLM, TGI, TensorRT-LLM)")] = None,
    bench_regex: Annotated[str | None, typer.Option("--bench-regex", help="regex whose group 1 is the metric in the benchmark's output")] = None,
    reproduce_runs: Annotated[int, typer.Option("--reproduce-runs", min=2, help="most benchmark runs to reproduce the regression (3 when clear)")] = 8,
    max_runs: Annotated[int | None, typer.Option("--max-runs", min=3, help="most benchmark runs per experiment (default: a budget from the noise and the regression)")] = None,  # noqa: UP007
    higher_is_better: Annotated[bool, typer.Option("--higher-is-better", help="the metric is better when higher (for a unit debugagent does not know)")] = False,
    lower_is_better: Annotated[bool, typer.Option("--lower-is-better", help="the metric is better when lower (for a unit debugagent does not know)")] = False,
    identity_file: IdentOpt = None, known_hosts: KnownOpt = None, accept_new_host_key: AcceptOpt = False,
    connect_timeout: TimeoutOpt = 10.0,
) -> None:
    """Investigate a regression: reproduce it, gather evidence, run experiments, conclude."""
    from .run import RunOptions, execute
    opts = RunOptions(host=host, symptom=symptom, baseline=baseline, baseline_snapshot=baseline_snapshot,
                      playbook=playbook, bench=bench, repo=repo, python=python, allow_mutations=allow_mutations,
                      as_json=as_json, out=out_dir, llm=llm, llm_model=llm_model, server_pattern=server_pattern,
                      bench_regex=bench_regex, reproduce_runs=reproduce_runs, max_runs=max_runs,
                      higher_is_better=higher_is_better, lower_is_better=lower_is_better,
                      ssh=ssh_opts(identity_file, known_hosts, accept_new_host_key, connect_timeout))
    raise typer.Exit(execute(opts))


@app.command()
def resume(run_dir: Annotated[str, typer.Argument(help="the transcript folder of the interrupted run")],
           allow_mutations: Annotated[bool, typer.Option("--allow-mutations")] = False,
           as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Continue an interrupted run from its last checkpoint."""
    from .run import resume_run
    raise typer.Exit(resume_run(run_dir, allow_mutations=allow_mutations, as_json=as_json))


@app.command()
def replay(run_dir: Annotated[str, typer.Argument(help="a transcript folder (or its events.jsonl)")],
           playbook: Annotated[str | None, typer.Option("--playbook", help="replay against another playbook")] = None,
           as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Re-run a recorded run against its recorded outputs: same conclusion (exit 0) or a diff (exit 5)."""
    from .replay import replay_run
    raise typer.Exit(replay_run(run_dir, playbook=playbook, as_json=as_json))


# ---------------------------------------------------------------- snapshot / diff
@app.command()
def snapshot(
    host: HostOpt,
    output: Annotated[str, typer.Option("-o", "--output", help="where to write the JSON (- for stdout)")],
    bench: Annotated[str | None, typer.Option("--bench", help="benchmark to run while GPUs are sampled")] = None,
    repo: Annotated[str | None, typer.Option("--repo")] = None,
    python: Annotated[str | None, typer.Option("--python")] = None,
    bench_runs: Annotated[int, typer.Option("--bench-runs", help="benchmark runs recorded in the snapshot (its baseline number)")] = 3,
    identity_file: IdentOpt = None, known_hosts: KnownOpt = None, accept_new_host_key: AcceptOpt = False,
    connect_timeout: TimeoutOpt = 10.0,
) -> None:
    """Write the host's fingerprint as JSON: git, packages and build hashes, GPUs, driver, server, CPU.

    With a benchmark (--bench, or the host profile /etc/debugagent/host.json), GPUs are
    sampled while it runs and its results are recorded: a snapshot of the good state then
    serves as --baseline-snapshot.
    """
    from tools.registry import Runner
    from tools.snapshot import collect, dump
    with open_transport(host, ssh_opts(identity_file, known_hosts, accept_new_host_key, connect_timeout)) as tr:
        with err.status(f"snapshot of {host} …"):
            snap = collect(Runner(tr), bench=bench, python=python, repo=repo, bench_runs=bench_runs)
    text = dump(snap)
    if output == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(output).write_text(text + "\n")
        err.print(f"wrote {output}: {len(snap.packages.packages) if snap.packages else 0} packages, "
                  f"{len(snap.gpus)} GPUs, {snap.commands} commands" + (f", {len(snap.errors)} errors" if snap.errors else ""))
    for e in snap.errors:
        err.print(f"  [yellow]note[/]: {escape(e)}")


@app.command("diff")
def diff_cmd(a: Annotated[str, typer.Argument(help="snapshot of the good state")],
             b: Annotated[str, typer.Argument(help="snapshot of the bad state")],
             as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """What differs between two snapshots, grouped by hypothesis id."""
    from tools.snapshot import Snapshot, diff, group
    changes = diff(Snapshot.load(a), Snapshot.load(b))
    if as_json:
        print(json.dumps({h: [c.model_dump(mode="json") for c in cs] for h, cs in group(changes).items()}, indent=1))
        return
    if not changes:
        out.print("no differences")
        return
    for hyp, cs in group(changes).items():
        out.print(f"[bold]{hyp}[/]")
        for c in cs:
            note = f"  ({c.note})" if c.note else ""
            out.print(escape(f"  {c.path}: {c.a!r} -> {c.b!r}{note}"))


# ---------------------------------------------------------------- sim
@sim_app.command("list")
def sim_list() -> None:
    """Name the built-in simulated hosts, with their story."""
    from tools.sim import builtin_names, load_scenario
    for n in builtin_names():
        s = load_scenario(n)
        out.print(f"[bold]{n}[/]  {escape(s.symptom)} (was {escape(s.baseline)})")
        out.print("    " + escape(" ".join(s.story.split())), style="dim")
    out.print("\nrun one: debugagent run --host sim:NAME --symptom '…' --baseline '…'  (the symptom and baseline above)")


@sim_app.command("serve")
def sim_serve(name: Annotated[str, typer.Argument(help="built-in scenario name or a scenario .yaml")],
              port: Annotated[int, typer.Option("--port", help="port on 127.0.0.1 (0: a free one)")] = 0,
              good: Annotated[bool, typer.Option("--good", help="serve the good state")] = False) -> None:
    """Serve a simulated host behind a real OpenSSH server on 127.0.0.1 (foreground; Ctrl-C stops)."""
    from tools.sim.serve import serve
    raise typer.Exit(serve(name + ("@good" if good else ""), port))


# ---------------------------------------------------------------- playbooks
@playbook_app.command("list")
def playbook_list() -> None:
    """Name the built-in playbooks."""
    from .playbook import builtin_playbooks, load_playbook
    for n in builtin_playbooks():
        pb = load_playbook(n)
        out.print(escape(f"{n}: {pb.description.strip().splitlines()[0] if pb.description else ''}"))


@playbook_app.command("show")
def playbook_show(name: Annotated[str, typer.Argument()]) -> None:
    """Print a playbook's tree: hypotheses in order, their checks, rules and experiments."""
    from .playbook import load_playbook, render_tree
    out.print(render_tree(load_playbook(name)), markup=False)


@playbook_app.command("validate")
def playbook_validate(path: Annotated[str, typer.Argument()]) -> None:
    """Check a playbook file against the schema; exit 2 naming file and field on error."""
    from .playbook import load_playbook
    pb = load_playbook(path)
    out.print(f"ok: {path}: {len(pb.hypotheses)} hypotheses")


@playbook_app.command("new")
def playbook_new(path: Annotated[str, typer.Argument()]) -> None:
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
def playbook_test(path: Annotated[str, typer.Argument()],
                  transcript: Annotated[list[str], typer.Option("--transcript", help="recorded run folder (repeatable)")]) -> None:
    """Replay recorded runs against a changed playbook; exit 5 if any conclusion changes."""
    from .replay import replay_run
    worst = 0
    for t in transcript:
        code = replay_run(t, playbook=path, as_json=False)
        worst = max(worst, code)
    raise typer.Exit(worst)


def main() -> None:
    try:
        rv = app(standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) else 0)
    except DebugAgentError as exc:
        err.print("[red]error[/]: ", end="")
        err.print(exc.message, markup=False)
        if exc.fix:
            err.print(f"  fix: {exc.fix}", markup=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # the CLI library's own usage errors (typer vendors click)
        names = {c.__name__ for c in type(exc).__mro__}
        if "ClickException" in names:
            exc.show()  # type: ignore[attr-defined]
            sys.exit(2 if "UsageError" in names else getattr(exc, "exit_code", 1))
        if "Abort" in names:
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
