"""Run one role of one adapter: ``python -m cmq.lab.systems SYSTEM ROLE JSON``."""

from __future__ import annotations

import sys

from cmq.lab.systems import _common, load


def main(argv: list[str]) -> int:
    """Entry point of a worker process (see :func:`_common.worker_main`)."""
    if not argv:
        print("usage: python -m cmq.lab.systems SYSTEM ROLE JSON_PARAMS", file=sys.stderr)
        return 2
    return _common.worker_main(load(argv[0]), argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
