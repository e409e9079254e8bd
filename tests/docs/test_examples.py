"""Every code example of the README and the documentation site works.

See ``examples.py`` for what is run and how a block is marked not to run.
A page's Python runs in a fresh interpreter, in an empty directory, with no
``PYSPARK_PYTHON`` set (as a reader's shell has none): each example that
needs a server starts it itself, on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.examples import ROOT, Block, Page, cmq_commands, pages

PAGES = pages()
PYTHON_PAGES = [p for p in PAGES if p.python()]
SHELL_BLOCKS = [b for p in PAGES for b in p.shell() if not b.skip]

# Runs the blocks given as JSON on stdin, in order, in one namespace; names the
# failing block by its line.
_RUNNER = """
import json, sys, traceback
blocks = json.load(sys.stdin)
ns = {"__name__": "__main__"}
for where, code in blocks:
    try:
        exec(compile(code, where, "exec"), ns)
    except BaseException:
        traceback.print_exc()
        print(f"the example at {where} failed", file=sys.stderr)
        sys.exit(1)
"""


def _id(page: Page) -> str:
    return page.name


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        env.pop(name, None)  # a reader's shell has neither; register(spark) must cope
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The reader's shell has the environment's bin/ on its PATH (the `cmq` command).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@contextlib.contextmanager
def _serve(cwd: Path) -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmq", "serve", "--store", "memory:", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.match(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert m, line or proc.communicate(timeout=30)[1]
        yield int(m[1])
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_id)
def test_python_examples_run(page: Page, tmp_path: Path) -> None:
    blocks = [b for b in page.python() if not b.skip]
    if not blocks:
        pytest.skip("every example on this page is marked not to run")
    ports = {b.serve for b in blocks if b.serve}
    with contextlib.ExitStack() as stack:
        substitutions = {port: str(stack.enter_context(_serve(tmp_path))) for port in ports}
        payload = []
        for b in blocks:
            code = b.code
            for old, new in substitutions.items():
                code = code.replace(old, new)
            payload.append((f"{page.name}:{b.line}", code))
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER], input=json.dumps(payload), capture_output=True,
            text=True, cwd=tmp_path, env=_clean_env(), timeout=240,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]


def _parser(name: str) -> argparse.ArgumentParser:
    from cmq import cli

    module = cli._load(name)
    parser = argparse.ArgumentParser(prog=f"cmq {name}")
    module.configure(parser)
    return parser


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: f"{Path(b.path).name}:{b.line}")
def test_shell_examples_parse(block: Block) -> None:
    """Each cmq command of a shell example is one its parser accepts; --help and --version run."""
    from cmq import cli

    for argv in cmq_commands(block.code):
        if not argv or argv[0] in ("--help", "-h", "--version") or "--help" in argv:
            proc = subprocess.run(
                [sys.executable, "-m", "cmq", *argv], capture_output=True, text=True, timeout=60
            )
            assert proc.returncode == 0, (argv, proc.stderr)
            assert proc.stdout.strip()
            continue
        assert argv[0] in cli._command_names(), f"no command {argv[0]!r}: cmq {' '.join(argv)}"
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                _parser(argv[0]).parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"cmq {' '.join(argv)} (line {block.line}): {exc.code}: {err.getvalue()}")


def test_examples_are_found() -> None:
    """The scanner sees the examples: a README with no runnable block would pass vacuously."""
    readme = next(p for p in PAGES if p.path == ROOT / "README.md")
    assert readme.python() and readme.shell()
    assert len(PYTHON_PAGES) >= 8
    skipped = [b for p in PAGES for b in p.blocks if b.skip]
    ran = [b for p in PAGES for b in p.blocks if not b.skip and b.lang == "python"]
    assert len(skipped) <= len(ran) // 4, [f"{b.path.name}:{b.line}" for b in skipped]
