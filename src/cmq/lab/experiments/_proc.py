"""Worker processes of the lab's own roles (:mod:`cmq.lab.experiments._worker`), from the parent's side.

A :class:`Child` runs one role of ``python -m cmq.lab.experiments._worker``
and reads its ``TAG {json}`` lines (``READY``, ``SAMPLE``, ``RESULT``) on a
thread, so the parent waits with a timeout and never hangs on a stuck child.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, Final

from cmq.lab._child import LineProcess

__all__ = ["GRACE", "READY_TIMEOUT", "Child", "WorkerError", "pair"]

#: How long a worker may take to start and print READY (imports on a busy machine).
READY_TIMEOUT: Final = 30.0
#: Beyond a role's own time, what it gets before it is killed.
GRACE: Final = 30.0


class WorkerError(Exception):
    """A worker process failed; the message says how."""


class Child(LineProcess):
    """One worker role in a child process, its ``TAG {json}`` lines read by a thread."""

    def __init__(self, role: str, params: dict[str, Any]) -> None:
        self.role = role
        super().__init__(
            [sys.executable, "-m", "cmq.lab.experiments._worker", role, json.dumps(params)],
            stdin=subprocess.DEVNULL,
        )

    def lines(self, timeout: float) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(tag, value)`` of each line until ``RESULT`` (included).

        Raises:
            WorkerError: the process exited first, or ``timeout`` seconds passed.
        """
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise WorkerError(
                    f"{self.role}: no result within {timeout:.0f} s{self._tail()}"
                ) from None
            if line is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
                raise WorkerError(
                    f"{self.role}: exited with code {self.proc.returncode}{self._tail()}"
                )
            tag, _, rest = line.partition(" ")
            if tag in ("READY", "SAMPLE", "RESULT"):
                yield tag, json.loads(rest)
                if tag in ("READY", "RESULT"):
                    return

    def stop(self) -> None:
        """Kill the process if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def pair(
    server_role: str,
    server_params: dict[str, Any],
    client_role: str,
    client_params: dict[str, Any],
    *,
    client_time: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a server role, then a client role given the server's ``READY`` as
    ``peer``; both ``RESULT`` values.

    Raises:
        WorkerError: either side failed, or took longer than ``client_time``
            (plus start-up and grace).
    """
    server = Child(server_role, server_params)
    client: Child | None = None
    try:
        ((_, ready),) = list(server.lines(READY_TIMEOUT))
        client = Child(client_role, {**client_params, "peer": ready})
        client_result = _result(client, READY_TIMEOUT + client_time + GRACE)
        server_result = _result(server, GRACE)
        return server_result, client_result
    finally:
        for child in (client, server):
            if child is not None:
                child.stop()


def _result(child: Child, timeout: float) -> dict[str, Any]:
    for tag, value in child.lines(timeout):
        if tag == "RESULT":
            return value
    raise WorkerError(f"{child.role}: no result")
