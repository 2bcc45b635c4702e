"""The typed tools by name, and the runner that sends them and parses what comes back.

A tool is ``(Input model, parser)``: the input builds the exact command; the parser
turns the ``CommandResult`` into a typed output or raises ``ParseError``. The runner
reports every call to an observer (the transcript), runs independent calls
concurrently, and never lets a parse failure escape as a traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import gpu, host, mutate
from .errors import ParseError
from .transport import CommandResult, Transport


class GpuList(BaseModel):
    gpus: list[gpu.GpuState]


class ProcessList(BaseModel):
    processes: list[host.ProcessLine]


class GpuProcessList(BaseModel):
    processes: list[gpu.GpuProcess]


class BenchValue(BaseModel):
    value: float
    unit: str | None = None


class Done(BaseModel):
    """The typed output of a mutation: it ran, and what it printed last."""

    ok: bool = True
    detail: str = ""


def _need_ok(r: CommandResult, tool: str) -> None:
    if r.timed_out:
        raise ParseError(f"cut at its timeout after {r.duration_ms / 1000:.1f} s", tool=tool)
    if r.exit_code != 0:
        raise ParseError(f"exit {r.exit_code}: {r.tail(2) or 'no output'}", tool=tool)


def _ok(fn: Callable[[Any, CommandResult], BaseModel], tool: str) -> Callable[[Any, CommandResult], BaseModel]:
    def wrapped(inp: Any, r: CommandResult) -> BaseModel:
        _need_ok(r, tool)
        return fn(inp, r)
    return wrapped


TOOLS: dict[str, tuple[type[BaseModel], Callable[[Any, CommandResult], BaseModel]]] = {
    "host_info": (host.HostInfo, _ok(lambda i, r: host.parse_host_info(r.stdout), "host_info")),
    "gpu_query": (gpu.GpuQuery, _ok(lambda i, r: GpuList(gpus=gpu.parse_query_csv(r.stdout)), "gpu_query")),
    "gpu_q": (gpu.GpuQ, _ok(lambda i, r: gpu.parse_q(r.stdout), "gpu_q")),
    "gpu_processes": (gpu.GpuProcesses, _ok(lambda i, r: GpuProcessList(processes=gpu.parse_compute_apps(r.stdout)), "gpu_processes")),
    "gpu_sample_under_load": (gpu.GpuSampleUnderLoad, lambda i, r: gpu.parse_load_samples(r.stdout)),
    "find_servers": (host.FindServers, _ok(lambda i, r: ProcessList(processes=host.parse_find_servers(r.stdout)), "find_servers")),
    "process_table": (host.ProcessTableInput, _ok(lambda i, r: host.parse_process_table(r.stdout), "process_table")),
    "server_details": (host.ServerDetails, _ok(lambda i, r: host.parse_server_details(i.pid, r.stdout), "server_details")),
    "python_packages": (host.PythonPackages, _ok(lambda i, r: host.parse_python_packages(r.stdout), "python_packages")),
    "git_state": (host.GitState, _ok(lambda i, r: host.parse_git_state(i.repo, r.stdout), "git_state")),
    "git_range": (host.GitRange, _ok(lambda i, r: host.parse_git_range(r.stdout), "git_range")),
    "driver_files": (host.DriverFiles, _ok(lambda i, r: host.parse_driver_files(r.stdout), "driver_files")),
    "bench": (host.Bench, _ok(lambda i, r: BenchValue(**dict(zip(("value", "unit"), host.parse_bench(r.stdout, i.metric, i.regex), strict=True))), "bench")),
    # mutations: experiments only, each with its undo
    "git_worktree_add": (mutate.WorktreeAdd, _ok(lambda i, r: Done(detail=r.tail(1)), "git_worktree_add")),
    "git_worktree_remove": (mutate.WorktreeRemove, _ok(lambda i, r: Done(detail=r.tail(1)), "git_worktree_remove")),
    "restart_server": (mutate.RestartServer, _ok(lambda i, r: mutate.parse_restart(r.stdout), "restart_server")),
    "set_power_limit": (mutate.SetPowerLimit, _ok(lambda i, r: Done(detail=r.tail(1)), "set_power_limit")),
    "set_governor": (mutate.SetGovernor, _ok(lambda i, r: Done(detail=r.tail(1)), "set_governor")),
    "git_worktree_checkout": (mutate.WorktreeCheckout, _ok(lambda i, r: Done(detail=r.tail(1)), "git_worktree_checkout")),
    "remove_file": (mutate.RemoveFile, _ok(lambda i, r: Done(detail=r.tail(1)), "remove_file")),
    "restart_hook": (mutate.RestartHook, _ok(lambda i, r: Done(detail=r.tail(3)), "restart_hook")),
    "overlay_install": (mutate.OverlayInstall, _ok(lambda i, r: Done(detail=r.tail(1)), "overlay_install")),
    "remove_tree": (mutate.RemoveTree, _ok(lambda i, r: Done(detail=r.tail(1)), "remove_tree")),
    "pip_download": (mutate.PipDownload, _ok(lambda i, r: mutate.parse_wheels(r.stdout), "pip_download")),
    # read-only checks experiments make before they act
    "server_control": (mutate.ServerControl, _ok(lambda i, r: mutate.parse_server_control(i.pid, r.stdout), "server_control")),
    "import_roots": (mutate.ImportRoots, _ok(lambda i, r: mutate.parse_import_roots(r.stdout), "import_roots")),
    "server_ready": (mutate.ServerReady, _ok(lambda i, r: mutate.parse_server_ready(r.stdout), "server_ready")),
    "find_wheels": (mutate.FindWheels, _ok(lambda i, r: mutate.parse_wheels(r.stdout), "find_wheels")),
    "overlay_packages": (mutate.OverlayPackages, _ok(lambda i, r: host.parse_python_packages(r.stdout), "overlay_packages")),
}
MUTATIONS = {"git_worktree_add", "git_worktree_remove", "restart_server", "set_power_limit", "set_governor",
             "git_worktree_checkout", "remove_file", "restart_hook", "overlay_install", "remove_tree", "pip_download"}
TIMEOUTS = {"python_packages": 120.0, "gpu_sample_under_load": 120.0, "bench": 900.0, "restart_server": 300.0,
            "restart_hook": 600.0, "overlay_install": 300.0, "pip_download": 120.0, "overlay_packages": 120.0}


class Outcome(BaseModel):
    """One tool call: its input, the command, the raw result, and the typed output or error."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tool: str
    input: dict[str, Any]
    result: CommandResult
    output: Any = None
    error: str | None = None
    call_id: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


Observer = Callable[[str, dict[str, Any]], None]


class Runner:
    """Sends typed tool calls over a transport and reports each to ``observer``."""

    def __init__(self, transport: Transport, observer: Observer | None = None, ids: Any = None) -> None:
        self.transport = transport
        self.observer = observer or (lambda event, data: None)
        self.count = 0
        self._ids = ids  # a shared itertools.count when several runners share one transcript
        self._lock = threading.Lock()

    def command_of(self, tool: str, inp: BaseModel) -> str:
        return inp.command()  # type: ignore[attr-defined]

    def call(self, tool: str, inp: BaseModel | dict[str, Any] | None = None, *, why: str = "", timeout: float | None = None) -> Outcome:
        model, parse = TOOLS[tool]
        if not isinstance(inp, BaseModel):
            inp = model.model_validate(inp or {})
        with self._lock:
            self.count += 1
            call_id = next(self._ids) if self._ids is not None else self.count
        command = self.command_of(tool, inp)
        shown = inp.display_command() if hasattr(inp, "display_command") else command
        data_in = inp.model_dump(mode="json")
        self.observer("tool_call", {"call_id": call_id, "tool": tool, "input": data_in, "command": command,
                                    "display": self.transport.display(shown), "why": why})
        t = timeout or TIMEOUTS.get(tool, 60.0)
        start = time.monotonic()
        kw = {"retry": tool not in MUTATIONS} if self.transport.supports_retry else {}
        result = self.transport.run(command, timeout=t, **kw)
        output: Any = None
        error = None
        try:
            output = parse(inp, result)
        except ParseError as exc:
            error = str(exc)
        self.observer("tool_result", {
            "call_id": call_id, "tool": tool, "host": result.host, "command": command, "stdout": result.stdout,
            "stderr": result.stderr, "exit_code": result.exit_code, "duration_ms": result.duration_ms,
            "wall_ms": round((time.monotonic() - start) * 1000, 3), "truncated": result.truncated,
            "timed_out": result.timed_out, "output": output.model_dump(mode="json") if output is not None else None,
            "error": error,
        })
        return Outcome(tool=tool, input=data_in, result=result, output=output, error=error, call_id=call_id)

    def call_many(self, calls: Sequence[tuple[str, BaseModel | dict[str, Any] | None, str]]) -> list[Outcome]:
        """Run independent calls concurrently; outcomes come back in the given order."""
        if len(calls) <= 1:
            return [self.call(t, i, why=w) for t, i, w in calls]
        with ThreadPoolExecutor(max_workers=min(8, len(calls))) as pool:
            futures = [pool.submit(self.call, t, i, why=w) for t, i, w in calls]
            return [f.result() for f in futures]
