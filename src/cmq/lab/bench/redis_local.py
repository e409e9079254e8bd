"""A throwaway Redis Cluster of local ``redis-server`` processes.

Used by the tests and the benchmarks: masters and replicas on free loopback
ports (client and cluster-bus ports both picked by the OS), data in a
temporary directory, started with ``--daemonize no`` under Popen and stopped
by PID. Needs ``redis-server`` and ``redis-cli`` (Debian: ``apt-get install
-y redis-server``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from cmq._errors import CmqError, ConfigError

__all__ = ["LocalRedisCluster"]

#: How long a node may be silent before the cluster calls it failed. Long
#: enough that a busy two-core machine does not cause spurious failovers;
#: fault tests pass a shorter one so that a killed master's replica takes
#: over within a few seconds.
NODE_TIMEOUT_MS = 5000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LocalRedisCluster:
    """``masters`` masters with ``replicas`` replicas each."""

    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = NODE_TIMEOUT_MS
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    directory: str = ""

    def start(self, timeout: float = 30.0) -> LocalRedisCluster:
        """Start the nodes and form the cluster; wait until it serves every slot.

        Raises ConfigError when redis-server is missing and CmqError when the
        cluster does not become ready within ``timeout`` seconds.
        """
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None or cli is None:
            raise ConfigError("redis-server not found: apt-get install -y redis-server")
        try:
            return self._start(server, cli, timeout)
        except BaseException:
            self.stop()  # never leave half a cluster running
            raise

    def _start(self, server: str, cli: str, timeout: float) -> LocalRedisCluster:
        self.directory = tempfile.mkdtemp(prefix="cmq-redis-")
        for _ in range(self.masters * (1 + self.replicas)):
            port, bus = _free_port(), _free_port()
            node_dir = os.path.join(self.directory, str(port))
            os.makedirs(node_dir)
            self.procs[port] = subprocess.Popen(
                [
                    server,
                    "--port",
                    str(port),
                    "--cluster-port",
                    str(bus),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(self.node_timeout_ms),
                    "--cluster-replica-validity-factor",
                    "0",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--daemonize",
                    "no",
                    # Replicas sync at once instead of after the default 5 s.
                    "--repl-diskless-sync-delay",
                    "0",
                    "--dir",
                    node_dir,
                    "--logfile",
                    "redis.log",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.ports.append(port)
        deadline = time.monotonic() + timeout
        for port in self.ports:
            self._until(deadline, lambda p=port: self._cli(p, "PING") == "PONG")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        self.wait_ok(deadline - time.monotonic())
        # A new replica first does a full sync; until it is online it does
        # not count for WAIT.
        for port in self.ports:
            self._until(
                deadline,
                lambda p=port: (
                    "role:slave" in (info := self._cli(p, "INFO", "replication"))
                    or info.count("state=online") >= self.replicas
                ),
            )
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node reports cluster_state:ok. Raises CmqError."""
        deadline = time.monotonic() + timeout
        for port in self.live_ports():
            self._until(
                deadline, lambda p=port: "cluster_state:ok" in self._cli(p, "CLUSTER", "INFO")
            )

    def live_ports(self) -> list[int]:
        """Ports of the nodes still running."""
        return [p for p in self.ports if self.procs[p].poll() is None]

    def url(self) -> str:
        """The store URL of this cluster."""
        return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.live_ports())

    def master_of(self, key: str) -> int | None:
        """Port of the live master that owns ``key``'s slot (None mid-failover)."""
        slot = self._cli(self.live_ports()[0], "CLUSTER", "KEYSLOT", key)
        for line in self._cli(self.live_ports()[0], "CLUSTER", "NODES").splitlines():
            parts = line.split()
            if "master" in parts[2] and "fail" not in parts[2]:
                for rng in parts[8:]:
                    lo, _, hi = rng.partition("-")
                    if lo.isdigit() and int(lo) <= int(slot) <= int(hi or lo):
                        return int(parts[1].split(":")[1].split("@")[0])
        return None

    def kill(self, port: int) -> None:
        """``kill -9`` one node."""
        proc = self.procs[port]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop every node (by PID) and remove the data directory."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    @staticmethod
    def _cli(port: int, *args: str) -> str:
        try:
            out = subprocess.run(
                ["redis-cli", "-p", str(port), *args], capture_output=True, timeout=5, text=True
            )
        except subprocess.TimeoutExpired:
            return ""
        return out.stdout.strip()

    @staticmethod
    def _until(deadline: float, pred: object) -> None:
        assert callable(pred)
        while not pred():
            if time.monotonic() > deadline:
                raise CmqError("the local Redis Cluster did not become ready in time")
            with contextlib.suppress(Exception):
                time.sleep(0.05)
