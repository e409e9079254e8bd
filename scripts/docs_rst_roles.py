"""A griffe extension for the API reference: cmq's docstrings in Markdown.

The docstrings are written for Sphinx-style readers (``:class:`Queue```,
``double backticks``); mkdocstrings renders Markdown. This turns a role into
a code span (``:meth:`close``` becomes `close`, ``~cmq.Queue`` its last
part) and double backticks into single ones, in the reference only: the
source keeps its docstrings as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):`~?([^`]+)`")
_DOUBLE = re.compile(r"``([^`]+)``")


def _shown(match: re.Match[str]) -> str:
    target = match[1]
    if match[0].split("`", 1)[1].startswith("~"):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def markdown(text: str) -> str:
    """``text`` with its reST roles and double backticks as Markdown code spans."""
    return _DOUBLE.sub(r"`\1`", _ROLE.sub(_shown, text))


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
