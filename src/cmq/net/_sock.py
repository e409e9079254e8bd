"""Socket set-up shared by the threaded and the asyncio drivers."""

from __future__ import annotations

import errno
import fcntl
import functools
import ipaddress
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from cmq._config import QueueConfig
from cmq._errors import ConfigError, TransportError

_IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)

__all__ = ["kernel_drops", "open_socket", "parse_address", "queue_delay", "resolve", "spin_readable", "yield_cpu"]


def parse_address(dest: Any) -> tuple[str, int]:
    """Split ``dest`` (``(host, port)``, ``"host:port"`` or ``"[v6]:port"``) into host and port.

    Raises:
        ConfigError: not an address, or a port outside 1-65535.
    """
    if isinstance(dest, str):
        host, sep, port_text = dest.rpartition(":")
        if not sep or not host:
            raise ConfigError(f"bad address {dest!r}: expected 'host:port'")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigError(f"bad address {dest!r}: port {port_text!r} is not a number") from None
    elif isinstance(dest, tuple | list) and len(dest) >= 2:
        host, port = dest[0], dest[1]
        if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
            raise ConfigError(f"bad address {dest!r}: expected (host: str, port: int)")
    else:
        raise ConfigError(f"bad address {dest!r}: expected (host, port) or 'host:port'")
    if not 1 <= port <= 65535:
        raise ConfigError(f"bad address {dest!r}: port must be 1-65535")
    return host, port


def resolve(host: str, port: int, family: int) -> tuple[Any, ...]:
    """Resolve ``host`` to a socket address of ``family``.

    Raises:
        ConfigError: the host does not resolve.
    """
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"cannot resolve host {host!r}: {exc}") from exc
    if not infos:
        raise ConfigError(f"cannot resolve host {host!r}")
    return tuple(infos[0][4])


def _family_of(host: str) -> int:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


def _set_buffer(sock: socket.socket, force_opt: int, opt: int, size: int) -> None:
    if size <= 0:
        return
    # As root, the FORCE variants ignore net.core.[rw]mem_max; as anyone else
    # the kernel silently caps the plain option, which is still the best we can do.
    try:
        sock.setsockopt(socket.SOL_SOCKET, force_opt, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, opt, size)


def open_socket(host: str, port: int, config: QueueConfig) -> socket.socket:
    """A bound UDP socket set up for ``config``.

    Raises:
        ConfigError: bad host or port.
        TransportError: the OS refused (for example the port is in use).
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"port={port!r}: must be an integer 0-65535 (0 picks a free port)")
    if not isinstance(host, str):
        raise ConfigError(f"host={host!r}: must be a string")
    family = _family_of(host)
    addr = resolve(host, port, family)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if config.reuse_addr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _set_buffer(sock, getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF, config.rcvbuf)
        _set_buffer(sock, getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF, config.sndbuf)
        if family == socket.AF_INET:
            # Linux otherwise hands a group's datagrams to every socket bound
            # to the port once any socket on the host joined: only members
            # should get them.
            try:
                sock.setsockopt(socket.IPPROTO_IP, _IP_MULTICAST_ALL, 0)
            except OSError:
                pass
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, config.multicast_ttl)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, int(config.multicast_loop))
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, config.multicast_ttl)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, int(config.multicast_loop))
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        why = "port already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise TransportError(f"cannot bind UDP {host}:{port}: {why}") from exc
    return sock


def membership(group: str, interface: str | None) -> tuple[int, int, bytes]:
    """``(family, level, mreq)`` for joining or leaving multicast ``group`` on ``interface``.

    Raises:
        ConfigError: ``group`` is not a multicast address.
    """
    try:
        ip = ipaddress.ip_address(group)
    except ValueError:
        raise ConfigError(f"{group!r} is not an IP address") from None
    if not ip.is_multicast:
        raise ConfigError(f"{group} is not a multicast address (224.0.0.0/4 or ff00::/8)")
    if ip.version == 4:
        iface = socket.inet_aton(interface or "0.0.0.0")
        return socket.AF_INET, socket.IPPROTO_IP, ip.packed + iface
    index = socket.if_nametoindex(interface) if interface else 0
    return socket.AF_INET6, socket.IPPROTO_IPV6, ip.packed + struct.pack("@I", index)


def kernel_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped on ``sock`` (Linux ``/proc/net/udp``), or None."""
    try:
        inode = os.fstat(sock.fileno()).st_ino
    except OSError:
        return None
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if len(cols) >= 13 and cols[9] == str(inode):
                        return int(cols[12])
        except (OSError, StopIteration, ValueError):
            continue
    return None


#: ioctl: the kernel's arrival time of the last datagram a socket returned
#: (Linux's SIOCGSTAMP, a struct timeval; the first call turns the stamps on).
_SIOCGSTAMP = 0x8906
_TIMEVAL = struct.Struct("@ll")
_NO_TIMEVAL = bytes(_TIMEVAL.size)  # the ioctl's argument buffer, made once


def queue_delay(fd: int) -> float:
    """How long the last datagram read from ``fd`` waited in the kernel's
    receive queue: now (wall clock) less its arrival stamp, in seconds; 0.0
    when the kernel has no stamp (nothing read since the first call, which
    turns stamping on) or the platform has no SIOCGSTAMP. Called right
    after a read. Costs one ``ioctl`` (about 0.7 µs here)."""
    try:
        sec, usec = _TIMEVAL.unpack(fcntl.ioctl(fd, _SIOCGSTAMP, _NO_TIMEVAL))
    except OSError:
        return 0.0
    delay = time.time() - (sec + usec * 1e-6)
    return delay if delay > 0.0 else 0.0


#: Gives the CPU to another ready thread or process, the interpreter released.
#: Not time.sleep(0) where there is a choice: it took 77 µs here (a timer,
#: however short).
yield_cpu: Callable[[], None] = getattr(os, "sched_yield", None) or functools.partial(time.sleep, 0)
#: A yield that took longer than this gave the CPU to another process.
_CROWDED = 3e-6


def spin_readable(fd: int, seconds: float) -> int:
    """Poll ``fd`` for input without blocking for up to ``seconds``,
    yielding the CPU between polls: 1 as soon as it is readable (or broken:
    the read that follows says what), 0 when the time is up, -1 when a
    yield gave the CPU to another process (the pure twin of the compiled
    ``spin_readable``)."""
    sel, pause, now = select.select, os.sched_yield, time.monotonic
    watch: list[int] = [fd]
    end = now() + seconds
    while True:
        try:
            if sel(watch, (), (), 0)[0]:
                return 1
        except (OSError, ValueError):
            return 1
        before = now()
        if before >= end:
            return 0
        pause()
        if now() - before > _CROWDED:
            return -1
