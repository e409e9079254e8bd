"""What a spool receiver killed mid-stream loses, and what its sender reports.

The receiver acknowledges a message when it arrives, before its thread
writes it, so after ``kill -9`` the spool holds a prefix of what was pushed,
the sender reports a suffix in doubt (which may overlap what was written:
messages whose acknowledgement the kill cut off), and only what lay between
(messages acknowledged, not yet written) is lost unreported: at most the
receiver's ``max_buffered_bytes`` plus the one batch its thread was writing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import cmq
from cmq.pipeline.source import _SPOOL_BATCH, _recover, committed_offset, read_spool
from tests.waiting import wait_until

SIZE = 1000
#: A small budget (the default is 4 MiB): the receiver's credit
#: keeps the sender far behind what it pushes, so the kill finds messages
#: in every state.
BUFFERED = 1 << 20
DEADLINE = 60.0


def test_a_killed_spool_receiver_loses_at_most_its_buffer_and_the_sender_reports_the_rest(
    tmp_path: Path,
) -> None:
    cmd = [sys.executable, "-m", "cmq.pipeline.source", "--spool", str(tmp_path)]
    cmd += ["--port", "0", "--max-buffered-bytes", str(BUFFERED)]
    rx = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert rx.stderr is not None
        line = rx.stderr.readline()
        assert line.startswith("spooling "), line
        host, port = line.split()[1].rsplit(":", 1)
        # max_probes=3: the dead receiver is declared dead in about a second.
        with cmq.Queue(0, "127.0.0.1", max_probes=3, send_buffer=1 << 20) as tx:
            stop, pushed = threading.Event(), []

            def push() -> None:
                i = 0
                while not stop.is_set():
                    payload = b"%08d" % i + b"." * (SIZE - 8)
                    try:
                        tx.push((host, int(port)), payload)
                    except cmq.CmqError:
                        return
                    pushed.append(payload)
                    i += 1

            pusher = threading.Thread(target=push)
            pusher.start()
            try:
                # A file another process writes: polled, with a deadline.
                assert wait_until(lambda: committed_offset(tmp_path) >= 100 * SIZE, DEADLINE)
                rx.send_signal(signal.SIGKILL)
                rx.wait(timeout=DEADLINE)
            finally:
                stop.set()
                pusher.join(timeout=DEADLINE)
            assert tx.drain(timeout=DEADLINE)  # everything acknowledged or reported
            failures = tx.failures()
    finally:
        if rx.poll() is None:
            rx.kill()
        rx.wait(timeout=DEADLINE)
        if rx.stderr is not None:
            rx.stderr.close()
    # The kill may have cut the last record short: cut it off, as a
    # receiver restarted on this spool does, and read every whole record.
    _recover(tmp_path)
    spooled = [
        r[4] for r in read_spool(tmp_path, 0, tmp_path.joinpath("messages.log").stat().st_size)
    ]
    in_doubt = [m for f in failures for m in f.messages]
    assert {f.reason for f in failures} <= {"peer_dead", "closed"}
    # The spool: a prefix of what was pushed, once each, in order.
    assert spooled == pushed[: len(spooled)]
    # Reported: a suffix of what was pushed, in order.
    assert in_doubt and in_doubt == pushed[len(pushed) - len(in_doubt) :]
    # Lost unreported: only what lay between. The two may also overlap:
    # messages written whose acknowledgement the kill cut off are in doubt
    # ("delivered or not, no one knows"), never lost.
    unreported = len(pushed) - len(spooled) - len(in_doubt)
    assert unreported * SIZE <= BUFFERED + _SPOOL_BATCH * SIZE
