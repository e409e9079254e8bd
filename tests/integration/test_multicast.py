"""Multicast: join/leave and push to a group, on loopback and between network namespaces."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

import cmq
from cmq.lab.netns import HostPair, unavailable

GROUP = "239.77.1.2"
MakeQueue = Callable[..., cmq.Queue]


def test_group_reaches_every_member_on_loopback(make_queue: MakeQueue) -> None:
    r1 = cmq.Queue(0, "0.0.0.0", reuse_addr=True)
    r2 = cmq.Queue(r1.port, "0.0.0.0", reuse_addr=True)
    try:
        for r in (r1, r2):
            r.join(GROUP, "127.0.0.1")
        tx = make_queue(multicast_interface="127.0.0.1")
        tx.push((GROUP, r1.port), b"to all")
        assert r1.get(timeout=2) == b"to all"
        assert r2.get(timeout=2) == b"to all"
        r1.leave(GROUP, "127.0.0.1")
        tx.push((GROUP, r1.port), b"members only")
        assert r2.get(timeout=2) == b"members only"
        with pytest.raises(cmq.Timeout):
            r1.get(timeout=0.1)
    finally:
        r1.close()
        r2.close()


def test_join_rejects_a_unicast_address(make_queue: MakeQueue) -> None:
    q = make_queue()
    with pytest.raises(cmq.ConfigError, match="not a multicast address"):
        q.join("10.1.2.3")
    with pytest.raises(cmq.ConfigError, match="not an IP address"):
        q.join("group-name")


RECEIVER = """
import sys, cmq
q = cmq.Queue(47999, "0.0.0.0", reuse_addr=True)
q.join(sys.argv[1], sys.argv[2])
print("ready", flush=True)
print(q.get(timeout=10).decode(), flush=True)
q.close()
"""


@pytest.mark.root
@pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")
def test_group_crosses_network_namespaces() -> None:
    with HostPair() as hosts:
        rx = subprocess.Popen(
            [*hosts.command("b"), sys.executable, "-c", RECEIVER, GROUP, hosts.addr_b],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            assert rx.stdout is not None
            assert rx.stdout.readline().strip() == "ready"
            send = (
                "import sys, cmq; q = cmq.Queue(0, sys.argv[2], multicast_interface=sys.argv[2]);"
                "q.push((sys.argv[1], 47999), b'across namespaces'); q.close()"
            )
            subprocess.run([*hosts.command("a"), sys.executable, "-c", send, GROUP, hosts.addr_a], check=True, timeout=20)
            out, _ = rx.communicate(timeout=20)
            assert out.strip() == "across namespaces"
        finally:
            rx.kill()
            rx.wait()
