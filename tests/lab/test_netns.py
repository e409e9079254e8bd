"""The lossy namespaces of Figure 6: the paper's iptables rule, fresh per run, removed after."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cmq import ConfigError
from cmq.lab import netns
from cmq.lab.experiments import PROFILES, Context, get

WHY = netns.unavailable(loss=True)
needs_root = pytest.mark.skipif(WHY is not None, reason=f"lossy namespaces unavailable: {WHY}")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.root
@needs_root
def test_segmented_sends_are_cut_before_the_loss_rule_sees_them() -> None:
    # A UDP GSO send crosses a veth whole unless the veth cuts it: the loss
    # rule would then drop a run of datagrams at once. Each veth cuts them.
    with netns.HostPair(loss=0.5) as hosts:
        for host in ("a", "b"):
            links = subprocess.run(
                [*hosts.command(host), "ip", "-d", "link", "show", "type", "veth"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert "gso_max_segs 1 " in links


@pytest.mark.root
@needs_root
def test_each_host_drops_input_with_the_papers_rule_and_is_removed_after() -> None:
    with netns.HostPair(loss=0.014) as hosts:
        assert {hosts.a, hosts.b} <= _namespaces()
        for host in ("a", "b"):
            rules = subprocess.run(
                [*hosts.command(host), "iptables", "-S", "INPUT"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            (rule,) = [r for r in rules.splitlines() if "statistic" in r]
            assert "--mode random" in rule
            # iptables keeps the probability as a 32-bit fraction: 0.01399999997.
            assert float(rule.split("--probability ")[1].split()[0]) == pytest.approx(0.014)
            assert rule.endswith("-j DROP")
            assert "! -i lo " in rule  # a host's loopback is not the lossy link
        # (That the hosts reach each other over the link: test_a_hosts_loopback_is_not_lossy.)
        names = {hosts.a, hosts.b}
    assert not names & _namespaces()


@pytest.mark.root
@needs_root
def test_two_pairs_are_apart() -> None:
    with netns.HostPair(loss=0.5) as one, netns.HostPair() as two:
        assert {one.a, one.b}.isdisjoint({two.a, two.b})


def test_bad_loss_is_refused() -> None:
    with pytest.raises(ConfigError, match="probability"):
        netns.HostPair(loss=1.0)


def test_figure_6_says_why_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "unavailable", lambda loss=False: "network namespaces need root")
    ctx = Context(out=Path("/nonexistent"), profile=PROFILES["tiny"], systems=("cmq",))
    why = get("fig6").unavailable(ctx)
    assert why is not None and "need root" in why and "cmq-fig6" in why


# Sends N datagrams to ADDR from a socket bound to it, then counts what came back.
_ECHO_COUNT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
s.settimeout(2.0)
for i in range(int(sys.argv[2])):
    s.sendto(b"x", s.getsockname())
got = 0
try:
    while got < int(sys.argv[2]):
        s.recv(16)
        got += 1
except socket.timeout:
    pass
print(got)
"""


@pytest.mark.root
@needs_root
def test_a_hosts_loopback_is_not_lossy() -> None:
    # A broker and its client on one host (NATS under loss) talk without
    # loss: at 50 %, 200 datagrams a host sends itself all arrive.
    with netns.HostPair(loss=0.5) as hosts:
        got = subprocess.run(
            [*hosts.command("b"), sys.executable, "-c", _ECHO_COUNT, hosts.addr_b, "200"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert got.strip() == "200"
        counters = subprocess.run(
            [*hosts.command("b"), "iptables", "-L", "INPUT", "-v", "-n", "-x"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        (rule,) = [r for r in counters.splitlines() if "statistic" in r]
        assert rule.split()[0] == "0"  # nothing was offered to the rule
        # Across the link the rule drops: of 200 sent from host a, about half arrive.
        script = _ECHO_COUNT.replace("s.getsockname()", "(sys.argv[3], 9)")
        subprocess.run([*hosts.command("a"), sys.executable, "-c", script, hosts.addr_a, "200", hosts.addr_b],
                       capture_output=True, text=True, check=True)  # fmt: skip
        counters = subprocess.run(
            [*hosts.command("b"), "iptables", "-L", "INPUT", "-v", "-n", "-x"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        (rule,) = [r for r in counters.splitlines() if "statistic" in r]
        assert 50 < int(rule.split()[0]) < 150
