"""Finding the code examples of the README and the documentation site.

A fenced block is an example. What the tests do with one depends on its
language:

- ``python``: run. The blocks of one page run in order, in one namespace, in
  a fresh interpreter whose working directory is an empty temporary one, as a
  reader pasting them one after the other into one session would.
- ``sh`` (or ``console``, ``bash``): every ``cmq ...`` command in it is parsed
  by that command's own argument parser (so a renamed or removed option
  fails); ``cmq --help``, ``cmq COMMAND --help`` and ``cmq --version`` are run.
  Other commands (``pip``, ``./bootstrap.sh``) are left alone.
- anything else (``text``, output shown as it looks): not run.

An HTML comment on the line before a block changes that:

- ``<!-- docs-test: skip REASON -->``: the block is not run (for the few
  examples that need what the tests cannot have: another machine, a
  network, a cluster). The reason is required.
- ``<!-- docs-test: serve 9324 -->`` (python blocks): before the page runs,
  an in-memory ``cmq serve`` is started on a free loopback port, and ``9324``
  in the page's Python is replaced by that port.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<verb>\w+)\s*(?P<rest>.*?)\s*-->\s*$")
_SHELLS = {"sh", "bash", "console", "shell"}


@dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced code block."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None = None  # the reason, when marked not to run
    serve: str | None = None  # the port to replace with a live cmq serve's


@dataclass(kw_only=True)
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))

    def python(self) -> list[Block]:
        return [b for b in self.blocks if b.lang == "python"]

    def shell(self) -> list[Block]:
        return [b for b in self.blocks if b.lang in _SHELLS]


def pages() -> list[Page]:
    """README.md and every page under docs/, in a stable order."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [parse(p) for p in paths]


def parse(path: Path) -> Page:
    """The fenced blocks of one Markdown file, with their directives."""
    page = Page(path=path)
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, lang, start = m["indent"], m["lang"], i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1  # the closing fence
        skip = serve = None
        j = start - 1
        while j >= 0 and (d := _DIRECTIVE.match(lines[j])) is not None:
            if d["verb"] == "skip":
                if not d["rest"]:
                    raise ValueError(f"{path}:{j + 1}: docs-test: skip needs a reason")
                skip = d["rest"]
            elif d["verb"] == "serve":
                serve = d["rest"]
            else:
                raise ValueError(f"{path}:{j + 1}: unknown docs-test directive {d['verb']!r}")
            j -= 1
        code = "\n".join(body) + "\n"
        page.blocks.append(
            Block(path=path, line=start + 1, lang=lang, code=code, skip=skip, serve=serve)
        )
    return page


def cmq_commands(code: str) -> list[list[str]]:
    """The ``cmq`` command lines of a shell block, as argument lists (without ``cmq``).

    Comments, ``$ `` prompts, leading ``VAR=value`` assignments, a trailing
    ``&`` and the other stages of a pipeline or an ``&&`` list are dropped.
    """
    found: list[list[str]] = []
    for raw in code.splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        command: list[str] = []
        for word in [*words, "|"]:
            if word in {"|", "&&", "||", ";", "&"}:
                while command and re.match(r"^[A-Z_][A-Z0-9_]*=", command[0]):
                    command.pop(0)
                if command and command[0] in {"cmq", ".venv/bin/cmq"}:
                    found.append(command[1:])
                command = []
            else:
                command.append(word)
    return found
