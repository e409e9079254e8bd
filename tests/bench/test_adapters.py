"""Every system adapter has the same shape (the names of cmq.lab.systems)."""

from __future__ import annotations

import inspect

import pytest

from cmq import ConfigError
from cmq.lab import systems

ROLES = {
    "throughput_receiver": {"ready", "size", "bind", "startup", "idle", "deadline"},
    "throughput_sender": {"peer", "size", "count", "duration"},
    "pingpong_server": {"ready", "size", "bind", "startup", "idle", "deadline"},
    "pingpong_client": {"peer", "size", "count", "timeout"},
    "pingping_server": {"ready", "size", "bind", "startup", "idle", "deadline"},
    "pingping_client": {"peer", "size", "count", "timeout", "window"},
}


@pytest.mark.parametrize("name", systems.SYSTEMS)
def test_adapter_defines_every_name(name: str) -> None:
    mod = systems.load(name)
    missing = [n for n in systems.ADAPTER_NAMES if not hasattr(mod, n)]
    assert not missing, f"{name} lacks {missing}"
    assert name == mod.NAME
    assert isinstance(mod.DATAGRAM, bool)
    assert isinstance(mod.MAX_SIZE, int) and mod.MAX_SIZE >= 16384


@pytest.mark.parametrize("name", systems.SYSTEMS)
@pytest.mark.parametrize("role", sorted(ROLES))
def test_roles_take_the_same_keywords(name: str, role: str) -> None:
    params = inspect.signature(getattr(systems.load(name), role)).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    # An adapter may take more (cmq takes ``options``), never fewer, and the
    # extra ones have defaults so the runner need not know them.
    assert ROLES[role] <= set(params)
    for extra in set(params) - ROLES[role]:
        assert params[extra].default is not inspect.Parameter.empty


@pytest.mark.parametrize("name", systems.SYSTEMS)
def test_available_is_none_or_one_line(name: str) -> None:
    reason = systems.load(name).available()
    assert reason is None or (isinstance(reason, str) and reason and "\n" not in reason)


@pytest.mark.parametrize("name", systems.SYSTEMS)
def test_command_is_an_argv(name: str) -> None:
    argv = systems.load(name).command()
    assert isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)


def test_unknown_system_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown system 'carrier-pigeon'"):
        systems.load("carrier-pigeon")
