"""The cmq command: pipes (send/recv), demo, help and errors, as a user runs them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import wait_until

CMQ = [sys.executable, "-m", "cmq"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def udp_bound(port: int) -> bool:
    """Whether some socket is bound to UDP ``port`` (read from /proc, so it never takes the port)."""
    suffix = f":{port:04X}"
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as f:
                next(f)
                if any(line.split()[1].endswith(suffix) for line in f):
                    return True
        except (OSError, StopIteration):
            continue
    return False


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    assert wait_until(predicate, timeout), f"timed out waiting for {what}"


def start_recv(port: int, *extra: str) -> subprocess.Popen[bytes]:
    """Start `cmq recv` and wait until its socket is bound."""
    proc = subprocess.Popen([*CMQ, "recv", "--port", str(port), "--host", "127.0.0.1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: udp_bound(port) or proc.poll() is not None, "cmq recv to bind")
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
    return proc


def blocked_reading_stdin(pid: int) -> bool:
    """Whether ``pid``'s main thread sits in read(0, ...): it has taken all its input."""
    try:
        with open(f"/proc/{pid}/task/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return fields[:2] == ["0", "0x0"]


def test_top_level_help_lists_commands() -> None:
    out = subprocess.run([*CMQ, "--help"], capture_output=True, text=True, check=True).stdout
    for name in ("send", "recv", "demo"):
        assert f"  {name}" in out


def test_send_and_recv_are_pipes() -> None:
    port = free_port()
    # recv takes all four: a reliable send exits 1 for a message its
    # receiver left unacknowledged by exiting first (once it raced here).
    rx = start_recv(port, "--count", "4")
    lines = b"alpha\nbeta\n\ngamma"  # an empty line is an empty message; no final newline
    subprocess.run([*CMQ, "send", f"127.0.0.1:{port}"], input=lines, check=True, timeout=20)
    out, err = rx.communicate(timeout=20)
    assert rx.returncode == 0, err
    assert out == b"alpha\nbeta\n\ngamma\n"


def test_a_pipeline_of_two_hops_filters_messages(tmp_path: Path) -> None:
    """cmq recv --port A | grep ERROR | cmq send B, as in the README."""
    a, b = free_port(), free_port()
    final = start_recv(b, "--count", "2")
    hop = subprocess.Popen(
        f"{sys.executable} -m cmq recv --host 127.0.0.1 --port {a} --count 4 | grep --line-buffered ERROR"
        f" | {sys.executable} -m cmq send 127.0.0.1:{b}",
        shell=True, stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: udp_bound(a), "the first hop to bind")
        subprocess.run([*CMQ, "send", f"127.0.0.1:{a}"], input=b"ok 1\nERROR 2\nok 3\nERROR 4\n", check=True, timeout=20)
        out, _ = final.communicate(timeout=30)
        assert out == b"ERROR 2\nERROR 4\n"
        assert hop.wait(timeout=30) == 0
    finally:
        hop.kill()
        final.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_recv_exits_cleanly_on_signals(sig: signal.Signals) -> None:
    port = free_port()
    rx = start_recv(port, "--stats")
    subprocess.run([*CMQ, "send", f"127.0.0.1:{port}"], input=b"one\n", check=True, timeout=20)
    assert rx.stdout is not None
    assert rx.stdout.readline() == b"one\n"
    rx.send_signal(sig)
    _, err = rx.communicate(timeout=20)
    assert rx.returncode == 0
    assert b'"messages_received": 1' in err


def test_send_flushes_on_sigterm() -> None:
    """Messages batched when the signal comes are still sent."""
    port = free_port()
    rx = start_recv(port, "--count", "2")
    tx = subprocess.Popen([*CMQ, "send", f"127.0.0.1:{port}", "--batch-timeout", "3600"],
                          stdin=subprocess.PIPE)
    assert tx.stdin is not None
    tx.stdin.write(b"first\nsecond\n")
    tx.stdin.flush()
    out = b""
    assert rx.stdout is not None
    out += rx.stdout.readline()  # the first goes at once (idle destination)
    # Once it waits for more input, the second line was pushed (and batched
    # for an hour): only close() can send it.
    wait_for(lambda: blocked_reading_stdin(tx.pid), "cmq send to read all its input")
    tx.send_signal(signal.SIGTERM)
    assert tx.wait(timeout=20) == 0
    out += rx.stdout.read()
    rx.wait(timeout=20)
    assert out == b"first\nsecond\n"


def test_msgpack_codec_lines_are_json() -> None:
    port = free_port()
    rx = start_recv(port, "--count", "2", "--codec", "msgpack")
    subprocess.run([*CMQ, "send", f"127.0.0.1:{port}", "--codec", "msgpack"],
                   input=b'{"a": [1, 2]}\n"text"\n', check=True, timeout=20)
    out, _ = rx.communicate(timeout=20)
    assert out == b'{"a": [1, 2]}\n"text"\n'


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["send", "no-such-host.invalid:9"], "cannot resolve"),
        (["send", "127.0.0.1:0"], "port must be"),
        (["send", "127.0.0.1:9", "--qthresh", "-1"], "qthresh"),
        (["send", "127.0.0.1:9", "--key", "zz"], "hexadecimal"),
        (["recv", "--port", "99999"], "port"),
        (["nonsense"], "unknown command"),
    ],
)
def test_bad_arguments_give_a_clear_error(args: list[str], message: str) -> None:
    proc = subprocess.run([*CMQ, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=20)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_recv_reports_a_port_in_use() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        proc = subprocess.run([*CMQ, "recv", "--host", "127.0.0.1", "--port", str(port)],
                              capture_output=True, text=True, timeout=20)
    assert proc.returncode == 1
    assert "in use" in proc.stderr


def test_demo_runs() -> None:
    proc = subprocess.run([*CMQ, "demo", "--count", "20000", "--round-trips", "200"],
                          capture_output=True, text=True, timeout=60, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    assert "one-way: 20,000 of 20,000" in proc.stdout
    assert "request/response: 200 round trips" in proc.stdout


def test_send_says_what_it_could_not_confirm_and_exits_1() -> None:
    """Reliable delivery: nobody acknowledges, so send names the messages in doubt."""
    port = free_port()  # nothing listens there
    proc = subprocess.run(
        [*CMQ, "send", f"127.0.0.1:{port}", "--linger", "0.3"],
        input=b"one\ntwo\n", capture_output=True, timeout=20,
    )
    assert proc.returncode == 1
    assert b"0 of 2 message(s) confirmed, 2 in doubt" in proc.stderr


def test_recv_on_port_0_says_which_port_it_got() -> None:
    """--port 0 lets the kernel choose; the chosen port is printed, so it can be used."""
    proc = subprocess.Popen([*CMQ, "recv", "--port", "0", "--host", "127.0.0.1", "--count", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        assert line.startswith("cmq recv: receiving on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        assert port > 0
        subprocess.run([*CMQ, "send", f"127.0.0.1:{port}"], input=b"hello\n", check=True, timeout=20)
        out, _ = proc.communicate(timeout=30)
        assert out == b"hello\n"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
