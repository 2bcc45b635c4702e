"""Property tests: arbitrary host output through every parser, arbitrary values through the event files."""

from __future__ import annotations

import json

from debugagent.agent.journal import parse_host_journals, parse_journal, parse_lock_reply
from debugagent.agent.transcript import Transcript, read_events
from debugagent.tools.errors import DebugAgentError, ParseError
from debugagent.tools.redact import redact
from debugagent.tools.registry import TOOLS, Runner
from debugagent.tools.session import Capped
from debugagent.tools.transport import CommandResult, FakeTransport, split_lines
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

SEPARATORS = "\n\r\t\x00\x1c\x1d\x1e\x1f\x85\u2028\u2029\x0b\x0c"
# text rich in what splits lines or fields, plus what the parsers look for
host_text = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(SEPARATORS), max_size=400),
    st.binary(max_size=400).map(lambda b: b.decode("utf-8", errors="replace")),
    st.lists(st.sampled_from(["== cmdline", "== environ", "== cwd", "== end", "+--tp", "+8", "+A=1\\nB", "\x1f", "\t",
                              "12\tpython\x1f-m\x1fsglang", "verify=3.1 ms", "{\"python\": 1}", "0, 345 MHz", ",",
                              "GPU 00000000:00.0", "    Clocks Event Reasons", "Active", "\u2028", "[REDACTED]", ""]),
             max_size=30).map("\n".join),
)
INPUTS = {"server_details": {"pid": 7}, "container_recreate": {"runtime": "podman", "name": "srv", "found_id": "0123456789ab", "run": ["podman", "run", "-d", "--name", "srv", "img"]}, "container_restore": {"runtime": "podman", "name": "srv", "found_id": "0123456789ab", "found_run": ["podman", "run", "-d", "--name", "srv", "img"]}, "gpu_sample_under_load": {"load": "gpu-bench"}, "gpu_nvml_under_load": {"load": "gpu-bench"},
          "python_packages": {"python": "/usr/bin/python3"}, "git_state": {"repo": "/r"}, "git_range": {"repo": "/r", "good": "a", "bad": "b"},
          "bench": {"cmd": "b", "metric": "verify"}, "git_worktree_add": {"repo": "/r", "path": "/p", "commit": "c"},
          "git_worktree_remove": {"repo": "/r", "path": "/p"},
          "restart_server": {"pid": 7, "argv": ["x"], "cwd": "/", "env_file": "/e"},
          "start_copy": {"role": "changed", "env_pid": 7, "argv": ["x"], "cwd": "/", "gpus": "1", "env_file": "/e",
                         "pid_file": "/p", "log": "/l"},
          "stop_copy": {"pid_file": "/p", "env_file": "/e", "log": "/l", "expect_argv": ["x"], "cwd": "/"},
          "set_power_limit": {"gpu": 0, "watts": 500}, "set_governor": {"governor": "performance"},
          "reset_clocks": {"gpu": 0, "memory": True}, "lock_clocks": {"gpu": 0, "sm_min": 1650, "sm_max": 1650},
          "find_older_wheels": {"name": "n"},
          "git_worktree_checkout": {"path": "/p", "commit": "c"}, "remove_file": {"path": "/p"},
          "restart_hook": {"cmd": "systemctl restart x", "argv": ["x"], "cwd": "/"},
          "overlay_install": {"python": "/usr/bin/python3", "wheel": "/w.whl", "overlay": "/tmp/debugagent-o"},
          "remove_tree": {"path": "/tmp/debugagent-o"},
          "dist_files": {"python": "/usr/bin/python3", "name": "n"},
          "write_chunk": {"path": "/tmp/debugagent-p/n.whl", "data": "AAAA"},
          "systemd_access": {"unit": "x.service"},
          "pip_download": {"python": "/usr/bin/python3", "name": "n", "version": "1", "dest": "/d"},
          "server_control": {"pid": 7}, "server_ready": {"pid": 7},
          "import_roots": {"pid": 7, "python": "/usr/bin/python3", "cwd": "/", "repo": "/r", "modules": ["m"]},
          "find_wheels": {"name": "n", "version": "1"},
          "overlay_packages": {"python": "/usr/bin/python3", "overlay": "/tmp/debugagent-o"},
          "server_view": {"python": "/usr/bin/python3", "port": 30000, "engine": "sglang"},
          "server_env": {"python": "/usr/bin/python3", "engine": "sglang"},
          "container_inspect": {"runtime": "podman", "name": "srv"},
          "server_shape": {"pid": 7, "python": "/usr/bin/python3", "cwd": "/"},
          "supervisor_program": {"config": "/etc/supervisord.conf", "program": "infer"},
          "supervisor_apply": {"file": "/f", "backup": "/tmp/debugagent-b", "sha256": "0" * 64, "ctl": ["supervisorctl"],
                               "group": "infer", "spec": "infer"},
          "supervisor_restore": {"file": "/f", "backup": "/tmp/debugagent-b", "ctl": ["supervisorctl"], "group": "infer",
                                 "spec": "infer"},
          "systemd_dropin": {"unit": "x.service", "path": "/etc/systemd/system/x.service.d/debugagent-r.conf", "content": ""},
          "systemd_dropin_remove": {"unit": "x.service", "path": "/etc/systemd/system/x.service.d/debugagent-r.conf"}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=host_text, code=st.sampled_from([0, 0, 1, 124]))
def test_every_parser_returns_or_raises_parse_error(text, code):
    """Whatever a host prints, each tool's parser gives a typed output or a ParseError, never anything else."""
    for tool, row in TOOLS.items():
        inp = row.input.model_validate(INPUTS.get(tool, {}))
        r = CommandResult(command="c", host="h", stdout=text, stderr=text[::-1], exit_code=code)
        try:
            out = row.read(inp, r)
        except ParseError:
            continue
        assert out is not None, tool


@settings(max_examples=40, deadline=None)
@given(text=host_text)
def test_runner_records_odd_output_as_an_error_not_a_traceback(text):
    """Through the runner (as a run sees it), odd output becomes an outcome with an error at worst."""
    r = Runner(FakeTransport(lambda c: text))
    for tool in ("host_info", "gpu_query", "gpu_q", "find_servers", "server_details", "python_packages", "driver_files"):
        o = r.call(tool, INPUTS.get(tool))
        assert o.ok or o.error


@settings(max_examples=40, deadline=None)
@given(text=host_text)
def test_split_lines_splits_on_newline_only(text):
    """Host output splits on \\n only: U+2028, U+2029, U+0085 and \\x1c-\\x1e stay inside their line."""
    lines = split_lines(text)
    assert "\n".join(lines) == "\n".join(p.removesuffix("\r") for p in text.removesuffix("\n").split("\n")) or text == "\n"
    assert all("\n" not in ln for ln in lines)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(host_text, min_size=1, max_size=5))
def test_events_written_are_read_back_exactly(values, tmp_path_factory):
    """Any text in any event survives the event writer and reader: same number of events, same (redacted) values."""
    folder = tmp_path_factory.mktemp("ev")
    t = Transcript(folder, "run-x")
    t.emit("run_started", run_id="run-x", symptom="verify 30ms", host="h")
    for v in values:
        t.emit("tool_result", command=v, stdout=v, stderr="", exit_code=0, call_id=1)
    t.close()
    evs = read_events(folder / "events.jsonl")
    assert len(evs) == len(values) + 1
    for ev, v in zip(evs[1:], values, strict=True):
        assert ev["stdout"] == redact({"stdout": v})["stdout"]


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=3000), cap=st.integers(min_value=1, max_value=300), cut=st.integers(1, 97))
@example(data=b"abcdef", cap=5, cut=1)        # the cap passed by one byte fed alone
@example(data=b"abcdefghijklmnop", cap=5, cut=2)
@example(data=b"ab" + b"x" * 40 + b"yz", cap=4, cut=13)  # one chunk longer than the cap
def test_output_cap_keeps_start_and_end(data, cap, cut):
    """Fed in any chunks, the cap gives the whole stream up to ``cap`` bytes, else its first and last halves."""
    c = Capped(cap)
    for i in range(0, len(data), cut):
        c.feed(data[i:i + cut])
    out, was_cut = c.output()
    if len(data) <= cap:
        assert (out, was_cut) == (data, False)
    else:
        assert was_cut and out.startswith(data[: cap // 2]) and out.endswith(data[len(data) - (cap - cap // 2):])


@settings(max_examples=40, deadline=None)
@given(text=host_text)
def test_journal_and_lock_readers_never_raise_anything_else(text):
    """Damaged journal or lock text gives a clear error (or an unreadable holder), never a traceback."""
    try:
        parse_journal(text, "j.json")
    except DebugAgentError as exc:
        assert exc.exit_code == 2
    parse_lock_reply(text)
    parse_host_journals(text)
    parse_host_journals("\x1edebugagent-journal " + text)


def test_journal_round_trip_on_the_host_listing():
    """A journal listed from the host parses back to the same steps."""
    from debugagent.agent.journal import RECORD_SEP, JournalData, Step
    d = JournalData(run_id="r", host="h", steps=[Step(id=1, tool="remove_file", input={"path": "/a\nb"}, text="t\u2028")])
    listing = RECORD_SEP + "journal-r.json\n" + d.model_dump_json() + "\n"
    got = parse_host_journals(listing)
    assert parse_journal(got["journal-r.json"], "x") == d
    assert json.loads(got["journal-r.json"])["steps"][0]["input"]["path"] == "/a\nb"
