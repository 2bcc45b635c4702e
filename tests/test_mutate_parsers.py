"""Parsers of the mutating tools' outputs (tools/mutate.py), on the outputs the hosts print."""

from __future__ import annotations

from debugagent.tools.mutate import PipDownload, parse_wheels


def test_pip_download_output_names_the_wheel_once():
    """``pip download … | tail -3; ls DEST/*.whl``: pip's "Saved PATH" line is not a wheel path (it was taken as
    one, and the overlay install was handed 'Saved /tmp/…whl' before the real path)."""
    cmd = PipDownload(python="/root/env/bin/python3", name="flashinfer-python", version="0.5.3", dest="/tmp/dl").command()
    assert cmd.endswith("ls /tmp/dl/*.whl")
    out = ("━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 7.0/7.0 MB 62.5 MB/s eta 0:00:00\n"
           "Saved /tmp/dl/flashinfer_python-0.5.3-py3-none-any.whl\n"
           "Successfully downloaded flashinfer-python\n"
           "/tmp/dl/flashinfer_python-0.5.3-py3-none-any.whl\n")
    assert parse_wheels(out).wheels == ["/tmp/dl/flashinfer_python-0.5.3-py3-none-any.whl"]
    again = "File was already downloaded /tmp/dl/x-1.0-py3-none-any.whl\n/tmp/dl/x-1.0-py3-none-any.whl\n"
    assert parse_wheels(again).wheels == ["/tmp/dl/x-1.0-py3-none-any.whl"]


def test_find_wheels_listing():
    out = "/wh/a/flashinfer_python-0.5.3-cp39-abi3-linux_x86_64.whl\n/root/.cache/pip/wheels/ab/x.whl\n\nnot a wheel\n"
    assert parse_wheels(out).wheels == ["/wh/a/flashinfer_python-0.5.3-cp39-abi3-linux_x86_64.whl",
                                        "/root/.cache/pip/wheels/ab/x.whl"]
