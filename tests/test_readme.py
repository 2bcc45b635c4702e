"""The README and docs/ show what the code does now: the quick start, the commands, the transcript excerpt, the
report screenshot, and links that resolve."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import yaml
from debugagent.agent.markdown import excerpt, render
from debugagent.agent.transcript import read_events

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# keys of SGLang bench_serving's result line whose numbers a symptom can name (tests/test_sim.py holds the whole line)
BENCH_SERVING_KEYS = {"output_throughput", "request_throughput", "input_throughput", "median_ttft_ms", "mean_ttft_ms",
                      "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms", "median_e2e_latency_ms"}


def fenced_blocks_removed(text: str) -> str:
    """The text without its fenced code blocks (``` or ````), whose links and headings are examples."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(`{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.strip().startswith(fence) and line.strip().strip("`") == "":
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


def quick_start_commands() -> list[str]:
    """The bash blocks of the README's quick start, one command line each."""
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_is_at_most_200_lines():
    """The README is an introduction (what it is, the quick start, the commands, links); the rest is in docs/."""
    assert len(README.read_text().splitlines()) <= 200


def quick_start_options() -> dict[str, str]:
    """The options of the quick start's `debugagent run`."""
    setup, install, run = (part.strip() for part in quick_start_commands()[0].split("&&"))
    assert setup == "python3 -m venv .venv" and install == ".venv/bin/pip install -q ."
    argv = shlex.split(run)
    assert argv[:2] == [".venv/bin/debugagent", "run"]
    return dict(zip(argv[2::2], argv[3::2], strict=True))


def test_quick_start_runs_the_kept_scenario_with_a_standard_benchmark():
    """The quick start's first command sets up a venv, installs debugagent and runs the simulated host whose
    story the README tells with SGLang's own benchmark client writing its result file, the symptom and baseline
    naming a key of that result (the scenario's own metric is `verify`; its rate the client reports), in options
    `debugagent run` accepts; the kept recording is that very command's run, read from that format."""
    from debugagent.agent.cli import command
    from debugagent.agent.runfacts import gather
    from debugagent.agent.symptom import parse_symptom
    from debugagent.tools.benchfmt import output_file_of
    opts = quick_start_options()
    assert set(opts) == {"--host", "--bench", "--symptom", "--baseline"}
    assert opts["--host"] == "sim:eagle3-flashinfer-rebuilt"
    bench = shlex.split(opts["--bench"])
    assert bench[1:3] == ["-m", "sglang.bench_serving"] and output_file_of(opts["--bench"]) == "/tmp/bench.jsonl"
    scenario = yaml.safe_load((ROOT / "tools" / "sim" / "scenarios" / "eagle3-flashinfer-rebuilt.yaml").read_text())
    assert bench[0] == scenario["host"]["python"]
    symptom, baseline = parse_symptom(opts["--symptom"]), parse_symptom(opts["--baseline"])
    assert symptom.metric == baseline.metric and symptom.metric in BENCH_SERVING_KEYS
    events = read_events(ROOT / "transcripts" / "eagle3-flashinfer-rebuilt" / "events.jsonl")
    start = events[0]
    assert (start.host, start.symptom, start.baseline, start.inputs.bench) == (
        opts["--host"], opts["--symptom"], opts["--baseline"], opts["--bench"]), "re-record: scripts/record-transcripts"
    assert gather(events).bench_format == "sglang"
    cli = command()
    ctx = cli.make_context("debugagent", ["run"], resilient_parsing=True)
    argv = [a for kv in opts.items() for a in kv]
    cli.get_command(ctx, "run").make_context("run", argv, parent=ctx)   # raises on an unknown option


def test_quick_start_runs_the_whole_suite_through_run_tests():
    """The second command is ./run-tests, which installs the Debian packages the README names and runs pytest."""
    assert quick_start_commands()[1] == "./run-tests"
    script = ROOT / "run-tests"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    for pkg in ("openssh-server", "bubblewrap", "tmux", "chromium"):
        assert pkg in text and f"`{pkg}`" in README.read_text(), pkg
    assert "pip install -q -e '.[test]'" in text and "pytest" in text


def test_readme_commands_table_names_every_command():
    """Every command of the CLI, and every subcommand of `playbook` and `sim`, is in the README's commands table."""
    from debugagent.agent.cli import command
    cli = command()
    table = README.read_text().split("## Commands", 1)[1].split("\n\n", 2)[1]
    for name, sub in cli.commands.items():
        assert f"`debugagent {name}" in table, name
        for subname in getattr(sub, "commands", {}):
            assert re.search(rf"`debugagent {name} [^`]*\b{subname}\b", table), f"{name} {subname}"


def test_every_command_the_readme_and_cli_md_name_exists():
    """The other way round: each `debugagent NAME [SUB|SUB…]` of the commands tables (README, docs/cli.md) is a
    command of the CLI (`sim serve` was named in both while the CLI had lost it: "No such command 'serve'")."""
    from debugagent.agent.cli import command
    cli = command()
    for page in (README, ROOT / "docs" / "cli.md"):
        table = page.read_text().split("| command |", 1)[1].split("\n\n", 1)[0]
        named = re.findall(r"`debugagent ([a-z][a-z-]*)(?: ((?:[a-z][a-z-]*\\\|)*[a-z][a-z-]*))?", table)
        assert len(named) >= 12, page
        for name, subs in named:
            assert name in cli.commands, f"{page.name}: debugagent {name}"
            group = getattr(cli.commands[name], "commands", None)
            for sub in subs.split("\\|") if subs and group is not None else []:
                assert sub in group, f"{page.name}: debugagent {name} {sub}"


def test_exit_code_tables_name_every_exit_code():
    """The README's and docs/cli.md's exit-code tables list every code an error class or the CLI returns."""
    from debugagent.tools import errors
    codes = {c.exit_code for c in vars(errors).values() if isinstance(c, type) and hasattr(c, "exit_code")}
    codes |= {0, 3, 130}
    for doc in (README, ROOT / "docs" / "cli.md"):
        listed = {int(c) for c in re.findall(r"^\| `(\d+)` \|", doc.read_text(), re.M)}
        assert listed == codes, doc.name


def test_docs_excerpt_matches_the_current_rendering():
    """The excerpt between docs/transcript.md's markers is what transcript.md of the kept quick-start run renders
    to now (after a change: scripts/readme-assets)."""
    page = (ROOT / "docs" / "transcript.md").read_text()
    m = re.search(r"<!-- transcript-excerpt:start -->\n````markdown\n(.*?)````\n<!-- transcript-excerpt:end -->", page, re.S)
    assert m, "docs/transcript.md lost its transcript-excerpt markers"
    md = render(read_events(ROOT / "transcripts" / "eagle3-flashinfer-rebuilt" / "events.jsonl"))
    assert m.group(1) == excerpt(md, ["code_change", "compiled_dependency"]), "run scripts/readme-assets"


def test_readme_shows_the_report_screenshot():
    """The README links docs/report.png, a PNG that scripts/readme-assets draws with headless Chromium."""
    assert "](docs/report.png)" in README.read_text()
    png = (ROOT / "docs" / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes of a page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    out = set()
    for head in re.findall(r"^#{1,6} +(.+?) *$", fenced_blocks_removed(text), re.M):
        out.add(re.sub(r"[^\w\- ]", "", head.lower()).replace(" ", "-"))
    return out


def test_every_relative_link_resolves():
    """Every relative link of README.md and docs/*.md names a file of the repository, and its #anchor a heading."""
    bad = []
    for page in [README, *DOCS]:
        text = fenced_blocks_removed(page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`\n]*`", "", text)):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                bad.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert not bad, "\n".join(bad)


def test_every_docs_page_is_linked_from_the_readme_or_the_docs_index():
    """No page of docs/ is an orphan."""
    linked = README.read_text() + (ROOT / "docs" / "README.md").read_text()
    for page in DOCS:
        if page.name != "README.md":
            assert f"{page.name})" in linked, page.name


def test_no_file_cites_a_document_outside_the_repository():
    """The product cites its own docs/: no DESIGN.md, no ../shared/ notes or seeds."""
    hits = []
    for top in ("agent", "tools", "tests", "bench", "scripts", "debugagent_testing", "playbooks", "docs", "README.md"):
        for p in [ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*"):
            if not p.is_file() or "__pycache__" in p.parts or p.suffix in (".png", ".pyc") or p == Path(__file__):
                continue
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if "DESIGN.md" in line or "shared/seeds" in line or "shared/DESIGN" in line:
                    hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_every_package_folder_is_packaged():
    """The quick start installs with `pip install .` (not editable): every folder of the product holding an
    __init__.py must be a package pyproject.toml lists, with its data files (a package left out installs
    nothing and fails only at import, on a fresh machine)."""
    import tomllib
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    dirs = conf.get("package-dir", {})

    def folder(pkg: str) -> Path:
        """As setuptools finds it: the longest package-dir prefix, the rest of the name as folders."""
        top = max((p for p in dirs if pkg == p or pkg.startswith(p + ".")), key=len, default="")
        rest = pkg[len(top):].lstrip(".").split(".") if pkg != top else []
        return ROOT.joinpath(dirs[top] if top else "", *[r for r in rest if r])

    where = {pkg: folder(pkg) for pkg in listed}
    found = set()
    for top in ("agent", "tools", "playbooks", "debugagent_testing"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            if any(init in set(where[p].glob(g)) for p, globs in conf.get("package-data", {}).items() for g in globs):
                continue   # shipped as a package's data (the simulator's guest code)
            found.add(next((p for p, d in where.items() if d == ROOT / rel), ".".join(rel.parts)))
    assert found <= listed, sorted(found - listed)
    data = conf.get("package-data", {})
    for pkg, globs in data.items():
        assert pkg in listed and all(list(where[pkg].glob(g)) for g in globs), (pkg, globs)


def test_readme_example_is_the_kept_quick_start_answer():
    """The README's example answer is what the kept recording of the quick start prints (scripts/record-transcripts
    re-records it): its headline, each evidence line (the overlay's run id shown as …) and its counts. A verdict
    wider than what was measured (serving_config ruled out while flags were not judged) shows here first."""
    from debugagent.agent.answer import evidence_lines, headline
    from debugagent.agent.events import Conclusion
    events = read_events(ROOT / "transcripts" / "eagle3-flashinfer-rebuilt" / "events.jsonl")
    o = next(e for e in reversed(events) if isinstance(e, Conclusion)).model_dump(mode="json", by_alias=True)
    text = README.read_text()
    block = text[text.index("$ debugagent run --host gpu-box"):].split("```", 1)[0].splitlines()
    while block[0].endswith("\\"):   # the command goes on on the next line
        block = [block[0][:-1] + block[1].strip(), *block[2:]]
    answer = [re.sub(r"/tmp/debugagent-overlay-[^/]+/", "/tmp/debugagent-overlay-…/", line)
              for line in [headline(o), *("  " + x for x in evidence_lines(o))]]
    assert block[1:1 + len(answer)] == answer, "the README's example answer: copy it from the kept recording"
    assert block[1 + len(answer)] == "" and block[2 + len(answer)].startswith(
        f"{o['commands']} commands, {o['bench_runs']} benchmark runs, ")
