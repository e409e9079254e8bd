"""The public surface is deliberate: __all__ is complete and everything in it exists."""

from __future__ import annotations

import cmq


def test_all_names_exist_and_public_names_are_exported() -> None:
    for name in cmq.__all__:
        assert hasattr(cmq, name), name
    public = {n for n in vars(cmq) if not n.startswith("_")} - {"annotations"}
    modules = {n for n in public if type(getattr(cmq, n)).__name__ == "module"}
    assert public - modules <= set(cmq.__all__)


def test_every_error_is_a_cmq_error() -> None:
    for name in ("Closed", "ConfigError", "MessageTooLarge", "MissingExtra", "ProtocolError",
                 "RemoteError", "Timeout", "TransportError", "WouldBlock"):
        assert issubclass(getattr(cmq, name), cmq.CmqError)
    assert issubclass(cmq.Timeout, TimeoutError)
    assert issubclass(cmq.ConfigError, ValueError)
    assert issubclass(cmq.TransportError, OSError)
    assert issubclass(cmq.MissingExtra, ModuleNotFoundError)
