"""Consent to change the host: asked on a terminal, given by a flag, or refused up front.

An experiment changes the host (docs/experiments.md). It runs when ``--allow-mutations`` (``--yes``) was given,
on a simulated host (``sim:``, whose changes die with its sandbox: docs/security.md), or after a person answers
``y`` to the prompt ``ask`` shows: the live view paused, what will change, how it is undone and about how long it
takes. ``--read-only`` runs none. A real host with neither flag and no terminal to ask on is refused before
anything connects (``check_unattended``): such a run could never test a suspect, and would say so only at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from debugagent.tools.errors import UsageError
from rich.console import Console
from rich.markup import escape

from .config import RunConfig
from .hosts import scheme_of

# what each kind changes on the host, and how it is put back (docs/experiments.md says the same at length)
KIND_WORDS: dict[str, tuple[str, str]] = {
    "code_revert": ("checks out the earlier commit in a separate git worktree (your checkout is not touched) and "
                    "restarts the server from it, or runs the benchmark in it",
                    "the worktree is removed and the server restarted as it was found"),
    "package_restore": ("installs the baseline's build of the package into an overlay folder under /tmp (the "
                        "environment is not touched) and restarts the server with it first on PYTHONPATH",
                        "the overlay is removed and the server restarted as it was found"),
    "server_restart": ("restarts the server with a changed command line or environment",
                       "the server is restarted with its own command line and environment"),
    "restore_baseline_flags": ("restarts the server with the baseline's flags",
                               "the server is restarted with its own flags"),
    "restore_baseline_env": ("restarts the server with the baseline's environment variables",
                             "the server is restarted with its own environment"),
    "power_limit": ("sets a GPU's power limit (nvidia-smi -pl)", "the power limit is set back to the value read before"),
    "governor": ("sets the CPU frequency governor", "the governor is set back to the one read before"),
}
GENERIC = ("changes the host as the playbook's experiment says", "each change is undone afterwards")


def lines(title: str, hypothesis: str, spec: Mapping[str, Any], estimate_s: float | None, runs: int) -> list[str]:
    """The prompt's lines before ``Run it? [y/N]``: the experiment, what changes, how it is undone, how long."""
    kind = str(spec.get("kind") or "")
    changes, undone = KIND_WORDS.get(kind, GENERIC)
    restarts = "restart" in changes
    if estimate_s is not None:
        took = f"about {estimate_s:.0f} s ({runs} benchmark runs at most" + (", plus the server's restarts)" if restarts else ")")
    else:
        took = f"{runs} benchmark runs at most" + (", plus the server's restarts" if restarts else "")
    return [f"Experiment: {title} (to test {hypothesis}) changes the host.",
            f"  changes: {changes}",
            f"  undone:  {undone}; the undo step is journalled before the change (`debugagent undo RUN` finishes it "
            "after a crash)",
            f"  takes:   {took}",
            "  (--allow-mutations or --yes runs experiments without asking; --read-only runs none)"]


def make_ask(view: Any, console: Console | None = None) -> Callable[..., bool] | None:
    """The prompt on a terminal (None without one: the experiment is then noted as not run). It pauses the live
    view so that nothing redraws over the question."""
    if not sys.stdin.isatty():
        return None
    con = console or Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)

    def ask(question: str, hypothesis: str = "", spec: Mapping[str, Any] | None = None) -> bool:
        est, runs = view.experiment_estimate() if view is not None else (None, 0)
        with view.paused() if view is not None else _nothing():
            if spec is None:
                con.print(f"[bold]Experiment[/]: {escape(question)}.")
            else:
                for i, ln in enumerate(lines(question, hypothesis, spec, est, runs)):
                    con.print(f"[bold]{escape(ln)}[/]" if i == 0 else escape(ln))
            con.print("[bold]Run it? \\[y/N][/] ", end="")
            try:
                answer = input().strip().lower() in ("y", "yes")
            except EOFError:
                answer = False
            con.print("  yes: running it" if answer else "  no: not run (noted in the transcript)", style="dim")
        return answer
    return ask


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def check_unattended(opts: RunConfig, interactive: bool | None = None) -> None:
    """Exit 2 before anything connects: a real host, no terminal to ask on, and neither --allow-mutations (--yes)
    nor --read-only; and both flags given."""
    if opts.allow_mutations and opts.read_only:
        raise UsageError("--allow-mutations (--yes) and --read-only both given",
                         fix="give --allow-mutations to let experiments change the host, or --read-only for none")
    if opts.allow_mutations or opts.read_only or scheme_of(opts.host)[0].sandbox:
        return
    if interactive is None:
        interactive = sys.stdin.isatty()
    if not interactive:
        raise UsageError(f"--host {opts.host}: experiments change the host, and there is no terminal to ask on "
                         "(stdin is not a TTY)",
                         fix="give --allow-mutations (or --yes) to run them, each undone afterwards, or --read-only to "
                             "run none (the suspects are then named with the experiment that would decide each)")
