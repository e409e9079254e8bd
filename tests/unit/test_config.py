"""QueueConfig: frozen, validated at construction, with clear messages."""

from __future__ import annotations

import dataclasses

import pytest

from cmq import ConfigError, QueueConfig


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"qthresh": -1}, "qthresh"),
        ({"qthresh": 0}, "qthresh"),
        ({"qthresh": 1.5}, "integer"),
        ({"codec": "json"}, "unknown codec"),
        ({"timeout": -0.1}, "negative"),
        ({"timeout": float("inf")}, "finite"),
        ({"timeout": float("nan")}, "seconds"),
        ({"max_datagram": 70000}, "max_datagram"),
        ({"max_datagram": 10}, "max_datagram"),
        ({"key": "text"}, "bytes"),
        ({"key": b""}, "1 to 64"),
        ({"max_queued": 0}, "max_queued"),
        ({"max_queued": 1 << 63}, "max_queued.*1 to"),
        ({"max_buffered_bytes": 1 << 63}, "max_buffered_bytes.*at most"),
        ({"max_message": 10**10}, "max_message"),
        ({"multicast_ttl": 300}, "multicast_ttl"),
        ({"spin": -1e-6}, "spin.*negative"),
        ({"spin": 0.5}, "spin.*at most 0.1"),
        ({"spin": "fast"}, "spin.*seconds"),
    ],
)
def test_bad_values_fail_at_construction(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        QueueConfig(**options)  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    cfg = QueueConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.qthresh = 1  # type: ignore[misc]


def test_defaults_are_the_documented_ones() -> None:
    cfg = QueueConfig()
    assert (cfg.qthresh, cfg.codec, cfg.max_message) == (512, "raw", 16 * 1024 * 1024)


def test_from_options_rejects_unknown_names() -> None:
    with pytest.raises(ConfigError, match="unknown option"):
        QueueConfig.from_options(None, {"qthreshold": 5})
    assert QueueConfig.from_options(QueueConfig(qthresh=64), {"codec": "msgpack"}).qthresh == 64
