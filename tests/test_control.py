"""The restart control (``Lab.control``): a restart that recovered the regression is checked against the server
as found, restarted by the undo, measured the same way. The benchmark here is a fake host that prints the values
a test gives it, so each rule of the decision is reached on purpose."""

from __future__ import annotations

import itertools

import pytest
from debugagent.agent.journal import Journal
from debugagent.agent.lab import Lab, Measure
from debugagent.agent.results import ExperimentResult
from debugagent.tools.registry import Runner
from debugagent.tools.transport import FakeTransport

BAD = [31.0, 31.1, 30.9, 31.0]                 # the reference: the server as found (ms, lower is better)
CHANGED = [26.0, 26.1, 25.9, 26.0, 26.05, 25.95]   # the change, after its restart: 5 ms better
REGRESSION = 7.0                               # the regression the reproduce step measured


def control(tmp_path, ctrl: list[float], earlier: list[float] | None = None,
            seen: list[str | None] | None = None) -> tuple[ExperimentResult, int]:
    """The control of CHANGED against BAD, its restarted server reading ``ctrl`` in turn: the result and the number
    of runs it took; what showed a speed change at restarts, if anything, appended to ``seen``."""
    values = itertools.cycle(ctrl)
    calls = []

    def host(command: str) -> str:
        calls.append(command)
        return f"tpot={next(values)} ms\n"
    t = FakeTransport(host)
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: None, Journal(tmp_path / "journal.json", "r1", "fake"),
              Measure("gpu-bench", "tpot", None, max_runs=0), "r1", True,   # no --max-runs: 1 to 8 control runs
              found_restarted=earlier)
    result = ExperimentResult(kind="restore_baseline_flags", text="with --enforce-eager removed", samples=CHANGED,
                              mean=26.0, share=0.71, significant=True, outcome="cause")
    out, shift = lab.control(Runner(t), result, list(BAD), REGRESSION)
    if seen is not None:
        seen.append(shift)
    return out, len(calls)


def test_a_restart_that_recovers_nothing_keeps_the_cause(tmp_path):
    seen: list[str | None] = []
    out, runs = control(tmp_path, [31.05, 30.95, 31.0], seen=seen)
    assert seen == [None]   # no speed change at restarts: no second start
    assert out.significant and out.outcome == "cause" and "the restart alone does not explain it" in out.text
    assert runs == 1   # one control run: a plain restart's part is surely below half at once


def test_a_restart_that_recovers_it_all_blames_nothing(tmp_path):
    out, _ = control(tmp_path, [26.05, 25.95, 26.0])
    assert not out.significant and out.outcome == "not_cause"
    assert "the server slows down while it runs" in out.text


def test_two_lucky_control_runs_never_rule_a_cause_out(tmp_path):
    """The first two runs of the restarted server read as fast as the change (a lucky pair, as one simulated
    diagnosis in 40 had at 9% noise), the runs after them as slow as the server was: "the restart, not the change"
    is never said from two runs, whose luck the third run shows."""
    out, runs = control(tmp_path, [26.4, 26.2, 31.0, 31.1, 30.9, 31.0, 30.95, 31.05])
    assert out.outcome != "not_cause" and "the restart, not the change" not in out.text
    assert runs > 2


def test_a_restart_that_recovers_it_all_is_said_from_three_runs(tmp_path):
    out, runs = control(tmp_path, [26.05, 25.95, 26.0])
    assert out.outcome == "not_cause" and runs == 3   # as "beats the restarted server": never from two runs


def test_a_restart_that_recovers_half_keeps_the_cause_by_what_the_change_adds(tmp_path):
    """Half of the recovery is the restart's (the interval holds one half), but the change is still far better
    than the restarted server: a cause, with the share it adds over the restarted server."""
    out, runs = control(tmp_path, [28.45, 28.55, 28.5])
    assert out.significant and out.outcome == "cause"
    assert "beats the restarted server" in out.text
    # decided at the control's level (0.01), and said so: never "undecided ..., so it is a cause"
    assert "below the control's level of 0.01" in out.text and "undecided" not in out.text
    assert runs == 3              # the change beats a plain restart from the third control run
    assert out.share == pytest.approx(2.5 / REGRESSION, abs=0.02)   # what the change adds, not all 5 ms


def test_a_restart_that_recovers_half_with_the_change_no_better_is_undecided(tmp_path):
    out, _ = control(tmp_path, [27.0, 30.0, 25.5, 29.5, 27.0, 25.0])
    assert not out.significant and out.outcome == "more" and "undecided" in out.text


def test_the_first_run_after_a_restart_is_a_warm_up_and_the_control_waits_for_it(tmp_path):
    """A fresh server's first requests pay for loading kernels and caches (an H200 lab server read 1396 tok/s on
    its first run, 1600 to 2300 after): after a restart the first run is reported as a warm-up and never used, and
    it counts as a benchmark run."""
    values = iter([45.0, 31.05, 30.95, 31.0, 31.02, 30.98, 31.0])   # 45: the cold first run of the restarted server
    seen: list[str] = []

    def host(command: str) -> str:
        return f"tpot={next(values)} ms\n"
    t = FakeTransport(host)
    lab = Lab(lambda h: Runner(t, lambda e, d: seen.append(d.get("why", "")) if e == "tool_call" else None),
              lambda ev, **kw: None, Journal(tmp_path / "journal.json", "r1", "fake"),
              Measure("gpu-bench", "tpot", None, max_runs=0), "r1", True)
    lab.restarted()                      # as the undo's restart of the server as found does
    result = ExperimentResult(kind="restore_baseline_flags", text="with --enforce-eager removed", samples=CHANGED,
                              mean=26.0, share=0.71, significant=True, outcome="cause")
    out, _ = lab.control(lab.runner_for(None), result, list(BAD), REGRESSION)
    assert 45.0 not in out.control and out.control[0] == 31.05
    assert out.significant and "the restart alone does not explain it" in out.text
    assert lab.warmups == 1 and lab.bench_runs == len(out.control) + 1
    assert seen[0].startswith("warm-up of the restarted server, not counted")
    assert not any(w.startswith("warm-up") for w in seen[1:])   # once per restart
    assert lab.warmth.needed is True     # 45 against 31 ± 0.05 after it: this server is slow on its first run
    lab.restarted()
    seen.clear()
    lab.bench(lab.runner_for(None), None, "the next state")
    assert [w.startswith("warm-up") for w in seen] == [True, False]   # so every restart is warmed up


def test_a_server_not_slow_on_its_first_run_is_not_warmed_up_again(tmp_path):
    """The first warm-up of a diagnosis is judged by the runs of the same state after it: within the noise, the
    server needs none, and later restarts go without one (each would cost a benchmark run for nothing)."""
    values = iter([31.08, 31.05, 31.0, 26.0, 26.1])
    seen: list[str] = []
    events: list[dict] = []

    def host(command: str) -> str:
        return f"tpot={next(values)} ms\n"
    t = FakeTransport(host)
    lab = Lab(lambda h: Runner(t, lambda e, d: seen.append(d.get("why", "")) if e == "tool_call" else None),
              lambda ev, **kw: events.append(kw), Journal(tmp_path / "journal.json", "r1", "fake"),
              Measure("gpu-bench", "tpot", None, max_runs=0), "r1", True)
    lab.restarted()
    result = ExperimentResult(kind="restore_baseline_flags", text="with --enforce-eager removed", samples=CHANGED,
                              mean=26.0, share=0.71, significant=True, outcome="cause")
    out, _ = lab.control(lab.runner_for(None), result, list(BAD), REGRESSION)
    assert out.control == [31.05] and lab.warmups == 1
    assert lab.warmth.needed is False
    said = [e["text"] for e in events if e.get("phase") == "warm_up"]
    assert len(said) == 1 and "within the noise" in said[0] and "not warmed up" in said[0]
    lab.restarted()
    seen.clear()
    assert lab.bench(lab.runner_for(None), None, "the next state") == 31.0
    assert seen == ["the next state"] and lab.warmups == 1   # no warm-up, and it is not counted as one



def test_a_warm_up_faster_than_the_runs_after_it_is_said_so(tmp_path):
    """A first run after a restart that is faster than the runs after it is not "within the noise" of them: it is
    said to be no slower, and the server still needs no warm-up."""
    values = iter([30.5, 31.05, 30.95])
    events: list[dict] = []
    t = FakeTransport(lambda command: f"tpot={next(values)} ms\n")
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: events.append(kw), Journal(tmp_path / "journal.json", "r1", "fake"),
              Measure("gpu-bench", "tpot", None, max_runs=0), "r1", True)
    lab.restarted()
    result = ExperimentResult(kind="restore_baseline_flags", text="with --enforce-eager removed", samples=CHANGED,
                              mean=26.0, share=0.71, significant=True, outcome="cause")
    lab.control(lab.runner_for(None), result, list(BAD), REGRESSION)
    said = [e["text"] for e in events if e.get("phase") == "warm_up"]
    assert lab.warmth.needed is False and len(said) == 1
    assert "no slower than the runs after it" in said[0] and "within the noise" not in said[0]


@pytest.mark.parametrize(("warm", "after", "reference", "lower", "needed"), [
    # an H200 lab server (higher is better): its first run after a restart read 1356 where the 2 runs after it read
    # 1432 and 1395, the reference state's 3 runs 617.5, 586 and 573.9: 2.4 SDs of those few runs, but one run of a
    # noise known that little lands there about 7% of the time
    (1356.0, [1432.0, 1395.0], [617.5, 586.0, 573.9], False, False),
    # a simulated host with no cold start at all: 1.2 SDs slower than the 2 runs after it, by chance
    (81.9, [82.2, 83.16], [68.8, 69.4, 69.1], False, False),
    # a cold server: the first run far outside the runs after it (lower is better)
    (45.0, [31.05, 30.95], [31.0, 31.1, 30.9, 31.0], True, True),
    # 3.9 SDs slower, with the noise known from 9 runs: cold
    (1450.0, [1980.0, 2050.0, 2010.0, 1900.0, 2100.0], [1500.0, 1600.0, 1550.0, 1480.0], False, True),
])
def test_a_warm_up_is_needed_only_when_one_run_of_that_noise_would_rarely_be_so_slow(tmp_path, warm, after,
                                                                                     reference, lower, needed):
    """The first warm-up is compared with the runs after it as one reading against a mean (one-sided t, the SD pooled
    with the reference state's runs and its degrees of freedom): one SD slower over 2 runs happens by chance about
    one time in five, and a diagnosis that takes it for a cold server warms up every later restart for nothing."""
    events: list[dict] = []
    t = FakeTransport(lambda command: "tpot=1 ms\n")
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: events.append(kw), Journal(tmp_path / "journal.json", "r1", "fake"),
              Measure("gpu-bench", "tpot", None, max_runs=0), "r1", lower)
    b = lab.measuring
    b._warm_value = warm
    b.judge_warm_up(after, reference)
    said = [e["text"] for e in events if e.get("phase") == "warm_up"]
    assert lab.warmth.needed is needed and len(said) == 1
    assert "one-sided p=" in said[0]
    assert ("every restart is warmed up" in said[0]) is needed
    assert ("within the noise of one run" in said[0]) is not needed


def test_a_later_control_starts_from_the_runs_an_earlier_control_measured(tmp_path):
    """What a plain restart of the server as found gives is a property of the server, not of the change: a second
    restart experiment in the same run is controlled by the runs the first one's control measured, and measures
    the server as found again only while those do not decide."""
    earlier = [31.02]
    out, runs = control(tmp_path, [99.0], earlier)   # 99 would be noticed: no new run is taken
    assert runs == 0 and out.control == [31.02] and out.outcome == "cause"
    assert "(1 run, measured after an earlier experiment's undo)" in out.text
    # undecided from the earlier runs alone (half of the recovery may be the restart's): measured again
    earlier = [28.5]
    out, runs = control(tmp_path, [28.45, 28.55], earlier)
    assert runs >= 2 and out.control[0] == 28.5 and earlier[1:] == out.control[1:]
    assert "beats the restarted server" in out.text


def test_a_restart_that_recovers_a_part_by_itself_asks_for_a_second_start(tmp_path):
    # 27.0 is a fifth of the way back to the change's 26: less than half (the change keeps its result), but a restart
    # alone recovered a part, so the server's speed may change at restarts and the change is made again (Lab.run)
    seen: list[str | None] = []
    lab_out, _ = control(tmp_path, [30.0], seen=seen)
    assert lab_out.control == [30.0] and "the restart alone does not explain it" not in lab_out.text
    assert seen == ["a plain restart alone recovered 20% of what the change did (80% CI 17% to 23%)"]


def test_over_starts_a_server_that_comes_up_in_two_modes_is_never_a_cause():
    # the H200 lab's healthy case: as found slow, the previous commit's start fast, the control between, then the
    # change's second start slow and the control's fast: the starts differ far beyond their runs' noise
    from debugagent.agent.stats import across_restarts, starts_differ
    changed = [[1934.0, 1941.0], [1433.0, 1440.0]]
    unchanged = [[1455.0, 1470.0, 1466.0], [1542.0], [1911.0]]
    assert starts_differ(changed, unchanged) < 0.01
    d = across_restarts(changed, unchanged, 500.0, False)
    assert d.outcome == "more" and "each start is one sample" in d.text, d.text


def test_over_starts_a_real_cause_on_starts_that_agree_is_decided_on_all_runs():
    from debugagent.agent.stats import across_restarts, starts_differ
    changed = [[1931.0, 1925.0], [1958.0, 1950.0]]
    unchanged = [[1009.0, 1012.0, 1005.0], [1020.0], [1013.0]]
    assert starts_differ(changed, unchanged) >= 0.01
    d = across_restarts(changed, unchanged, 940.0, False)
    assert d.outcome == "cause" and "all runs together" in d.text and 0.9 < d.share < 1.05, d.text


def test_over_starts_a_real_cause_on_starts_that_differ_is_decided_on_their_means():
    from debugagent.agent.stats import across_restarts
    changed = [[1931.0, 1925.0, 1928.0], [1958.0, 1950.0, 1955.0]]
    unchanged = [[1009.0, 1012.0, 1005.0], [1134.0], [1023.0]]
    d = across_restarts(changed, unchanged, 940.0, False)
    assert d.outcome == "cause" and "each start is one sample" in d.text, d.text


# ---------------------------------------------------------------- the reference's few runs, measured again
# A real H200 run (2026-12-04, tests/vectors/recordings/h200-2026-12-04/package-undecided): the good build of a
# rebuilt package, after its restart, against the reproduce step's 2 runs of the slow build (tok/s, higher is
# better); the lab measured the slow build 29% slower. Its benchmark runs in order: 2 reproduce runs, the warm-up of
# the restarted server, then 24 runs of the good build.
def _h200_runs() -> list[float]:
    import json
    from pathlib import Path
    path = Path(__file__).parent / "vectors" / "recordings" / "h200-2026-12-04" / "package-undecided" / "events.jsonl"
    events = [json.loads(ln) for ln in path.read_text().splitlines()]
    return [float(e["stdout"].split("decode=")[1].split()[0]) for e in events
            if e.get("event") == "tool_result" and e.get("tool") == "bench" and "decode=" in (e.get("stdout") or "")]


H200_RUNS = _h200_runs()
H200_BAD, H200_GOOD = H200_RUNS[:2], H200_RUNS[3:]


def test_more_runs_of_the_changed_state_are_futile_when_the_reference_bounds_them():
    """On the H200 the good build ran 24 times against 2 reference runs and ended at p=0.07: after 5 runs, even 24
    could not have decided it (with what it recovers and the noise at their 80% bounds); more runs of the reference
    would. Where the changed state has no more runs than the reference, or the change is clearly large or clearly
    nothing, more of its runs still decide, so they are not futile."""
    from debugagent.agent.stats import changed_runs_futile
    assert len(H200_GOOD) == 24 and H200_BAD == [1484.35, 1383.15]
    reg = 2123.0 - 1434.0
    futile = [n for n in range(2, 24) if changed_runs_futile(H200_BAD, H200_GOOD[:n], reg, False, 24)]
    assert futile and futile[0] == 5, futile
    # as many reference runs as changed ones: the changed state's runs still narrow it
    assert not changed_runs_futile(H200_BAD * 3, H200_GOOD[:5], reg, False, 24)
    # a change that recovers it all, far outside the noise: more runs decide it
    assert not changed_runs_futile([1400.0, 1420.0], [2100.0, 2080.0, 2120.0, 2090.0, 2110.0], reg, False, 24)
    # a change that recovers nothing, in quiet noise: more runs rule it out
    assert not changed_runs_futile([1400.0, 1420.0], [1405.0, 1415.0, 1410.0, 1412.0, 1408.0], reg, False, 24)


def reference_again(tmp_path, changed: list[float], found: list[float], *, bad: list[float] = H200_BAD,
                    regression: float = 2123.0 - 1434.0) -> tuple[ExperimentResult, list[str], list[dict]]:
    """``Lab.run``'s path for an experiment the reference's runs left open: the restarted server as found, measured
    (``found``, in turn) and joined to the reference; tok/s, higher is better."""
    values = iter(found)
    seen: list[str] = []
    events: list[dict] = []

    def host(command: str) -> str:
        seen.append(command)
        return f"decode={next(values)} tok/s\n"
    t = FakeTransport(host)
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: events.append({"event": ev, **kw}),
              Journal(tmp_path / "journal.json", "r1", "fake"), Measure("gpu-bench", "decode", None, max_runs=0),
              "r1", False)
    lab.measuring.warmth.needed = False   # judged already: this server is not slow on its first run
    result = ExperimentResult(kind="package_restore", title="restart with the baseline build", text="with the build",
                              samples=changed, mean=sum(changed) / len(changed), share=0.2, outcome="more")
    out, _ = lab.reference_restarted(Runner(t), result, list(bad), regression)
    return out, seen, events


def test_an_experiment_the_reference_left_open_is_decided_on_the_server_as_found_restarted(tmp_path):
    """The restarted server as found reads like the reproduce step's runs (a start that agrees with theirs), so its
    runs join the reference, and the good build's 5 runs are a cause against all of them."""
    out, seen, events = reference_again(tmp_path, H200_GOOD[:5], [1402.0, 1451.0, 1390.0, 1437.0, 1419.0, 1445.0,
                                                                   1398.0, 1431.0])
    assert out.outcome == "cause" and out.significant, out.text
    assert "the starts agree" in out.text and len(out.control) == len(seen) >= 2
    assert f"all {2 + len(seen)} runs of the reference state together" in out.text
    plan = [e for e in events if e.get("phase") == "plan"]
    assert plan and "could not decide it against the reference state's 2 runs" in plan[0]["text"]
    assert all("the reference state again" in e.get("why", "the reference state again") for e in events
               if e["event"] == "tool_call")


def test_an_experiment_the_reference_left_open_stays_open_when_the_starts_differ(tmp_path):
    """The restarted server as found reads far from the reproduce step's runs: the server's speed changes at
    restarts, so one start with the change decides nothing, whatever the pooled runs say (``Lab.run`` then makes the
    change again: ``restart_again``)."""
    out, seen, _ = reference_again(tmp_path, H200_GOOD[:5], [1900.0, 1910.0, 1890.0, 1905.0, 1895.0, 1902.0,
                                                               1898.0, 1904.0])
    assert out.outcome == "more" and not out.significant
    assert "the two starts of the server as found differ by more than their runs' noise" in out.text
    assert len(seen) >= 2 and out.control == [1900.0, 1910.0, 1890.0, 1905.0, 1895.0, 1902.0, 1898.0, 1904.0][:len(seen)]


def test_an_experiment_the_reference_left_open_is_ruled_out_when_the_change_gave_nothing(tmp_path):
    """The change's runs read like the server as found, restarted: not a cause, with the bound that decided it."""
    out, _, _ = reference_again(tmp_path, [1420.0, 1440.0, 1410.0, 1430.0, 1425.0],
                                [1432.0, 1418.0, 1441.0, 1409.0, 1428.0, 1436.0, 1415.0, 1422.0],
                                bad=[1427.0, 1433.0])
    assert out.outcome == "not_cause" and out.rule and "upper bound" in out.rule, out.text
