"""Child processes of the lab whose output is read line by line on a thread.

Both the lab's own roles (:mod:`cmq.lab.experiments._proc`) and the AMQP
suite's workers (:mod:`cmq.lab.experiments.amqp.suite`) run Python children that print
``TAG {json}`` lines. :class:`LineProcess` starts one with this tree's ``cmq``
importable, reads its stdout on a thread (so the parent can wait with a
timeout and never hangs on a stuck child) and keeps its stderr for the
error message when it dies.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import cmq

__all__ = ["LineProcess", "child_env", "stop_child"]


def child_env() -> dict[str, str]:
    """This process's environment, with this tree's ``cmq`` first on the path."""
    env = dict(os.environ)
    src = str(Path(cmq.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def stop_child(proc: subprocess.Popen[str], grace: float = 10.0) -> None:
    """Stop ``proc`` by its PID: SIGTERM, then SIGKILL if it has not exited
    within ``grace`` seconds; reaped, its stdout closed (its other pipes are
    the caller's)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class LineProcess:
    """A child process whose stdout lines wait in a queue (None once it closed)."""

    def __init__(self, argv: Sequence[str], *, stdin: int) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        self._drain = threading.Thread(
            target=self._err.extend, args=(self.proc.stderr,), daemon=True
        )
        self._drain.start()

    def next_line(self, timeout: float) -> str | None:
        """The child's next stdout line, waiting up to ``timeout`` seconds;
        None once its stdout closed (it exited).

        Raises:
            queue.Empty: no line within ``timeout``.
        """
        return self._lines.get(timeout=max(0.0, timeout))

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def _tail(self) -> str:
        """The last lines of the child's stderr, for an error message (the child has exited)."""
        self._drain.join(timeout=1)
        err = [ln.rstrip() for ln in self._err if ln.strip()]
        return (": " + " | ".join(err[-3:])) if err else ""
