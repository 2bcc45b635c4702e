"""The shell-session protocol (tools/session.py): frames always parse and quote exactly; end marks
are found wherever the stream is cut, and never in output that only looks like one."""

from __future__ import annotations

import subprocess

from debugagent.tools.session import EndMark, ansi_c_quote, frame, new_nonce, parse_frame
from hypothesis import given, settings
from hypothesis import strategies as st

no_nul = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=80)


@settings(max_examples=60, deadline=None)
@given(no_nul)
def test_ansi_c_quote_is_exact_in_bash_and_one_line(text):
    q = ansi_c_quote(text)
    assert "\n" not in q and "\r" not in q
    out = subprocess.run(["bash", "-c", f"printf %s {q}"], capture_output=True, check=True).stdout
    assert out.decode() == text


@given(no_nul)
def test_frames_parse_back(command):
    nonce = new_nonce()
    line = frame(command, nonce).decode()
    assert line.count("\n") == 1 and line.endswith("\n")
    assert parse_frame(line) == (command, nonce)
    assert parse_frame("echo not a frame\n") is None


def test_a_frame_runs_in_bash_with_its_marks():
    """Through a real bash reading frames on stdin: isolation, /dev/null stdin, status and marks."""
    n1, n2 = new_nonce(), new_nonce()
    script = frame("cd /; X=1; cat; printf 'a\\nb'; exit 3", n1) + frame('pwd; echo "${X:-unset}" >&2', n2)
    r = subprocess.run(["bash", "--noprofile", "--norc"], input=script, capture_output=True, cwd="/tmp", timeout=10)
    assert r.stdout == f"a\nb\x1f{n1}:3\n/tmp\n\x1f{n2}:0\n".encode()
    assert r.stderr == f"\x1f{n1}\nunset\n\x1f{n2}\n".encode()


def test_a_job_left_in_the_background_is_flagged():
    n = new_nonce()
    r = subprocess.run(["bash", "--noprofile", "--norc"], input=frame("sleep 0 & echo now; exit 4", n),
                       capture_output=True, timeout=10)
    assert r.stdout == f"now\n\x1f{n}:4\n".encode()
    m = EndMark(n, 1 << 20, with_status=False)
    m.feed(r.stderr)
    assert m.done and m.output() == (b"", False) and m.background


@given(st.binary(max_size=300), st.integers(0, 255), st.integers(0, 400), st.lists(st.integers(1, 50), max_size=40))
def test_end_mark_found_wherever_the_stream_is_cut(payload, status, cap, cuts):
    nonce = "0123456789abcdef"
    stream = payload + b"\x1f%s:%d\n" % (nonce.encode(), status)
    m = EndMark(nonce, cap, with_status=True)
    i = 0
    for k in cuts + [len(stream)]:
        if i >= len(stream):
            break
        m.feed(stream[i:i + k])
        i += k
    assert m.done and m.status == status
    n = len(payload)
    kept = payload if n <= cap else payload[:cap // 2] + EndMark.CUT % (n - cap) + payload[n - (cap - cap // 2):]
    assert m.output() == (kept, n > cap)   # the start and the end, the end mark left off


def test_look_alike_marks_do_not_end_a_stream():
    nonce = "0123456789abcdef"
    m = EndMark(nonce, 1 << 20, with_status=True)
    for fake in (b"\x1fdeadbeefdeadbeef:0\n", b"\x1f0123456789abcdef:\n", b"\x1f0123456789abcdef:1x\n",
                 b"\x1f0123456789abcdef:0\nmore"):
        m.feed(fake)
        assert not m.done
    m.feed(b"\n\x1f0123456789abcdef:0\n")
    assert m.done and m.status == 0
