"""Network namespaces for experiments and tests: two hosts on one machine, optionally lossy.

:class:`HostPair` makes two fresh network namespaces joined by a veth pair
(``10.199.N.1`` and ``10.199.N.2``, a /30 of their own that exists only
inside them), and removes them on exit. With ``loss`` it installs the CMQ
paper's rule on both hosts' INPUT chains, for what comes over the link
(a host's loopback is not the lossy network: a broker and a client on the
same host talk without loss, as they would on a real machine)::

    iptables -A INPUT ! -i lo -m statistic --mode random --probability P -j DROP

The veths segment UDP GSO sends as they leave (``gso_max_segs 1``), so the
rule sees, and drops, single datagrams.

Needs root, ``ip`` (iproute2) and, for loss, ``iptables``; without them
:func:`unavailable` says what is missing and :class:`HostPair` raises
:class:`~cmq.ConfigError` with that text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from types import TracebackType
from typing import Final

from cmq._errors import ConfigError

__all__ = ["HostPair", "unavailable"]

_PREFIX: Final = "cmq"


def unavailable(*, loss: bool = False) -> str | None:
    """Why namespaces cannot be made here, or None if they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or skip the lossy experiments)"
    if shutil.which("ip") is None:
        return "the 'ip' command is missing: apt-get install iproute2"
    if loss and shutil.which("iptables") is None:
        return "the 'iptables' command is missing: apt-get install iptables"
    return None


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.returncode}")


class HostPair:
    """Two network namespaces ``a`` and ``b`` joined by a veth link.

    ``HostPair(loss=0.014)`` drops each incoming packet on both hosts with
    probability 0.014 (the CMQ paper's Figure 6); ``rule=True`` installs
    the rule even at 0, and :meth:`set_loss` changes it between runs. Use as a context manager;
    run programs on a host with :meth:`command` (a prefix for
    ``subprocess``).

    Raises:
        ConfigError: namespaces cannot be made here (see :func:`unavailable`),
            or a setup command failed.
    """

    def __init__(self, *, loss: float = 0.0, mtu: int = 1500, rule: bool = False) -> None:
        if not 0.0 <= loss < 1.0:
            raise ConfigError(f"loss={loss!r}: must be a probability in [0, 1)")
        why = unavailable(loss=loss > 0 or rule)
        if why:
            raise ConfigError(why)
        self.loss = loss
        # With rule=True the drop rule is installed even at probability 0: a
        # lossless baseline's packets then take the lossy runs' path through
        # netfilter, and set_loss changes it between runs.
        self.rule = rule
        self.mtu = mtu
        tag = f"{os.getpid() % 100000}x{id(self) % 9973}"
        self.a = f"{_PREFIX}a{tag}"
        self.b = f"{_PREFIX}b{tag}"
        net = (os.getpid() + id(self)) % 250 + 1
        self.addr_a = f"10.199.{net}.1"
        self.addr_b = f"10.199.{net}.2"
        self._made: list[str] = []

    def __enter__(self) -> HostPair:
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _setup(self) -> None:
        for ns in (self.a, self.b):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        veth_a, veth_b = f"v{self.a}"[:15], f"v{self.b}"[:15]
        _run("ip", "link", "add", veth_a, "netns", self.a, "type", "veth", "peer", "name", veth_b, "netns", self.b)
        for ns, dev, addr in ((self.a, veth_a, self.addr_a), (self.b, veth_b, self.addr_b)):
            _run("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            # gso_max_segs 1: a segmented send (UDP GSO, which cmq's
            # compiled core uses) is cut into datagrams as it leaves, so
            # the peer's loss rule drops datagrams one by one, as a lossy
            # link does, not a whole run of up to 64 at once (measured:
            # 40-datagram sends at 50 % loss lost whole sends otherwise).
            _run("ip", "-n", ns, "link", "set", dev, "mtu", str(self.mtu), "gso_max_segs", "1", "up")
            # Multicast leaves through the veth (there is no default route).
            _run("ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)
            if self.loss > 0 or self.rule:
                _run("ip", "netns", "exec", ns, "iptables", "-A", "INPUT", *self._rule(self.loss))

    @staticmethod
    def _rule(loss: float) -> tuple[str, ...]:
        return ("!", "-i", "lo", "-m", "statistic", "--mode", "random", "--probability", f"{loss}",
                "-j", "DROP")  # fmt: skip

    def set_loss(self, loss: float) -> None:
        """Change the drop probability of both hosts' rule (made with ``rule=True``
        or a loss above 0), and forget what TCP learnt of the path: a run
        after another in the same namespaces starts as in fresh ones.

        Raises:
            ConfigError: a bad probability, no rule to change, or iptables failed.
        """
        if not 0.0 <= loss < 1.0:
            raise ConfigError(f"loss={loss!r}: must be a probability in [0, 1)")
        if not (self.loss > 0 or self.rule):
            raise ConfigError("this HostPair has no loss rule to change (make it with rule=True)")
        for ns in (self.a, self.b):
            _run("ip", "netns", "exec", ns, "iptables", "-R", "INPUT", "1", *self._rule(loss))
            _run("ip", "-n", ns, "tcp_metrics", "flush", "all")
        self.loss = loss

    def command(self, host: str) -> list[str]:
        """The prefix that runs a program on ``host`` (``"a"`` or ``"b"``)."""
        ns = {"a": self.a, "b": self.b}.get(host)
        if ns is None:
            raise ConfigError(f"host must be 'a' or 'b', not {host!r}")
        return ["ip", "netns", "exec", ns]

    def close(self) -> None:
        """Remove the namespaces (and with them the veth link and the rules)."""
        while self._made:
            ns = self._made.pop()
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
