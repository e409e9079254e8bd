"""`cmq serve` stops cleanly when asked: exit status 0 on SIGTERM and SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_exits_0_when_asked_to_stop(tmp_path: object, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmq", "serve", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_serve_with_workers_exits_0_on_sigterm(tmp_path: object) -> None:
    """--workers 2: the parent stops its worker processes and exits 0 too."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmq", "serve", "--port", "0", "--workers", "2",
         "--store", f"sqlite:{tmp_path}/q.sqlite3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_spool_receiver_exits_0_on_sigterm(tmp_path: object) -> None:
    """The Spark source's spool receiver (python -m cmq.pipeline.source) stops cleanly too."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmq.pipeline.source", "--spool", f"{tmp_path}/spool", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("spooling 127.0.0.1:"), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
