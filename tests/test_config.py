"""One run configuration (agent/config.py): `debugagent run`'s options, run.json and the recording's inputs are
all made from `RunConfig`, and read back from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from debugagent.agent.cli import command, main
from debugagent.agent.config import REPRODUCE_RUNS, RunConfig, SSHOptions, bounds, flag_fields
from debugagent.agent.playbook import load_playbook
from debugagent.agent.run import load_run
from debugagent.agent.session import header, inputs_from_recording, overrides_of
from debugagent.tools.errors import UsageError
from typer._click import Context

ROOT = Path(__file__).resolve().parents[1]


def options(name: str) -> dict[str, object]:
    """A command's click options by their python name."""
    return {p.name: p for p in command().commands[name].params if p.name != "help"}


def test_run_options_are_the_config_fields():
    """Every option of `debugagent run` is a RunConfig field (the SSH options among them), with the field's flag
    names, metavar, help, default and bounds; and every field with a flag is an option."""
    opts, fields = options("run"), flag_fields(RunConfig)
    assert set(opts) == set(fields)
    ctx = Context(command().commands["run"], info_name="run")
    for name, (_, info, fl) in fields.items():
        o = opts[name]
        assert set(fl.names) == set(o.opts) and not o.secondary_opts, (name, o.opts)
        assert o.metavar == fl.metavar, name
        assert o.default == (None if info.is_required() else info.get_default(call_default_factory=True)), name
        assert o.required == info.is_required(), name
        rec = o.get_help_record(ctx)
        assert rec and (name == "host" or info.description in " ".join(rec[1].split())), name
        b = bounds(info.metadata)
        assert (o.min, o.max) == (b.get("ge"), b.get("le")), name


def test_the_documented_defaults():
    """The defaults the README's command table gives: at most 12 reproduce runs, 600 s to be ready, a 10 s
    connect timeout; the Python API (`RunConfig(...)`) has the same ones as the command line."""
    c = RunConfig(host="local", symptom="verify 30ms")
    assert (c.reproduce_runs, c.ready_timeout, c.ssh.connect_timeout, c.max_runs) == (REPRODUCE_RUNS, 600.0, 10.0, None)
    assert REPRODUCE_RUNS == 12
    assert options("run")["reproduce_runs"].default == 12


def run_cli(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        import sys
        argv, sys.argv = sys.argv, ["debugagent", *args]
        try:
            main()
        finally:
            sys.argv = argv
    return int(e.value.code or 0), capsys.readouterr().err


RUN = ("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s")


@pytest.mark.parametrize("flag,value,shown", [
    ("--reproduce-runs", "1", "greater than or equal to 2"), ("--max-runs", "2", "greater than or equal to 3"),
    ("--ready-timeout", "0.5", "greater than or equal to 1"), ("--connect-timeout", "0", "more than 0"),
    ("--reproduce-runs", "many", "integer"), ("--min-reproduce-runs", "1", "greater than or equal to 2"),
])
def test_out_of_range_values_exit_2_naming_the_flag_and_the_range(capsys, tmp_path, flag, value, shown):
    """A value out of its field's bounds (or of no number) is exit 2 naming the flag and the range; nothing is
    written."""
    code, err = run_cli(capsys, *RUN, flag, value, "--out", str(tmp_path / "r"))
    assert code == 2 and flag in err and shown in err, err
    assert not (tmp_path / "r").exists()


def test_from_flags_names_the_flag():
    """Values out of bounds given to the configuration itself (not through click) name their flag too."""
    with pytest.raises(UsageError) as e:
        RunConfig.from_flags({"host": "local", "symptom": "verify 30ms", "connect_timeout": -1, "reproduce_runs": 3})
    assert "--connect-timeout" in e.value.message and "more than 0" in e.value.message
    c = RunConfig.from_flags({"host": "local", "symptom": "verify 30ms", "identity_file": "k", "reproduce_runs": 3})
    assert c.ssh == SSHOptions(identity_file="k") and c.reproduce_runs == 3


def test_run_json_is_the_config_and_reads_back(tmp_path):
    """run.json is the configuration's dump plus the run id; `resume` and `undo` read the same configuration back."""
    c = RunConfig(host="sim:power-capped", symptom="decode 74 tok/s", baseline="decode 89 tok/s", reproduce_runs=5,
                  max_runs=9, lower_is_better=True, ssh=SSHOptions(identity_file="/k", connect_timeout=3))
    (tmp_path / "run.json").write_text(json.dumps(c.saved("r-1")))
    assert load_run(str(tmp_path)) == (c, "r-1")


def test_an_older_run_json_still_loads(tmp_path):
    """A run.json written before the restart flags and the direction flags existed (and before run ids were
    saved) loads with their defaults, the folder's name as its run id."""
    old = {"host": "sim:power-capped", "symptom": "decode 74 tok/s", "baseline": "decode 89 tok/s",
           "baseline_snapshot": None, "playbook": None, "bench": None, "repo": None, "python": None,
           "allow_mutations": False, "as_json": True, "out": None, "llm": None, "llm_model": "gpt-4o-mini",
           "ssh": {"identity_file": None, "known_hosts": None, "accept_new_host_key": False, "connect_timeout": 10.0},
           "server_pattern": None, "bench_regex": None, "reproduce_runs": 8, "max_runs": None}
    run = tmp_path / "old-run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(old))
    c, run_id = load_run(str(run))
    assert run_id == "old-run" and c.reproduce_runs == 8 and c.ready_timeout == 600.0 and c.restart_cmd is None
    assert c.direction is None and not c.force_unlock


@pytest.mark.parametrize("text", ['{"host": 5}', "[1]", '{"host": "local", "symptom": "x 1ms", "nonsense": 1}',
                                  '{"host": "local", "symptom": "x 1ms", "reproduce_runs": 1}'])
def test_a_damaged_run_json_is_exit_2_naming_it(tmp_path, text):
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(UsageError) as e:
        load_run(str(tmp_path))
    assert "run.json" in e.value.message and e.value.exit_code == 2


def test_the_header_inputs_are_the_recorded_fields():
    """run_started's inputs are the fields whose flag says so (the --llm URL as whether one was given) and the
    direction; their names are those of the kept recordings; the overrides read from them are the live run's."""
    c = RunConfig(host="sim:power-capped", symptom="decode 74 tok/s", baseline="decode 89 tok/s", bench="b",
                  llm="http://secret@127.0.0.1/v1", ready_timeout=30, higher_is_better=True)
    h = header(c, load_playbook(None), "r-1")
    assert h["inputs"] == c.recorded_inputs()
    assert h["inputs"]["llm"] is True and h["inputs"]["direction"] == "higher" and h["inputs"]["ready_timeout"] == 30
    kept = {frozenset(json.loads(p.read_text().split("\n", 1)[0])["inputs"])
            for p in sorted((ROOT / "transcripts").glob("*/events.jsonl"))}
    assert kept == {frozenset(h["inputs"])}
    live = overrides_of(c.recorded_inputs())
    replayed = inputs_from_recording(json.loads(json.dumps(h)), None, "events.jsonl").overrides
    assert live == replayed and live.ready_timeout == 30 and live.bench == "b"


def test_min_reproduce_runs_raises_the_most_where_that_is_lower():
    """--min-reproduce-runs 8 with --reproduce-runs 4: at least 8 runs is what was asked for; the most is raised to
    it, as the flag's help says, rather than a step that could never reach its fewest."""
    from debugagent.agent.context import Overrides
    assert Overrides(reproduce_runs=4, min_reproduce_runs=8).most_reproduce_runs == 8
    assert Overrides(reproduce_runs=12, min_reproduce_runs=5).most_reproduce_runs == 12
    assert Overrides().most_reproduce_runs == 12
