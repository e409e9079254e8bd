"""The lossy namespaces of Figure 6: the paper's iptables rule, fresh per run, removed after."""

from __future__ import annotations

import subprocess
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
        # The two hosts reach each other over their veth link.
        ping = subprocess.run(
            [*hosts.command("a"), "ping", "-c", "1", "-W", "5", hosts.addr_b],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert ping.returncode in (0, 1)  # 1: that one packet was dropped (1.4 %)
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
