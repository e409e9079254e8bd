"""Who may talk to a node: Host, Origin and authentication rules, sans-IO.

Theory of operation
-------------------
A queue service on loopback is reachable by every web page the machine's
browser opens, in two ways the edge must close:

- **Cross-origin requests.** A query-protocol request is a form POST, which
  browsers send to any origin without asking. Browsers mark such requests
  with ``Origin`` (and ``Sec-Fetch-Site``); SDKs and command-line clients
  send neither. So an SQS request whose ``Origin`` is not the node's own
  (``http://`` + its Host) or whose ``Sec-Fetch-Site`` is ``cross-site`` or
  ``same-site`` is refused with 403 ``AccessDenied``, before its body is read.
- **DNS rebinding.** A page on ``evil.example`` rebinds that name to
  127.0.0.1 and then makes *same-origin* requests; only the ``Host`` header
  still says ``evil.example``. So every request's Host must be an IP literal
  (a literal cannot be rebound), ``localhost`` (or a name under
  ``.localhost``), the address the node listens on, or a name given with
  ``--allow-host``. The port of the Host header is not checked: it carries no
  defence against rebinding, and port mappings (containers, proxies)
  legitimately change it.

Authentication: with an auth file (``--auth FILE``), every SQS request must
carry a valid SigV4 signature by one of its access keys
(:mod:`cmq.service.sigv4`). Without one, signatures cannot be checked, so
requests are accepted only from loopback clients, unless the operator opts
out with ``--insecure-allow-remote``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cmq.service import errors, sigv4

__all__ = ["EdgePolicy", "host_name", "is_loopback"]


def host_name(host: str) -> str:
    """The name part of a Host header value, lower case, without port or dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def is_loopback(address: str) -> bool:
    """Whether a client address is on this machine's loopback (cached: parsing
    an address costs more than the rest of the edge's checks together)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgePolicy:
    """The rules one node applies to each request (see module doc)."""

    listen_host: str = "127.0.0.1"
    """The address the node listens on (accepted as a Host name)."""
    allowed_hosts: frozenset[str] = frozenset()
    """Further Host names to accept (``--allow-host``), lower case."""
    keys: Mapping[str, str] | None = None
    """SigV4 access key id to secret; None: no authentication."""
    allow_remote_unsigned: bool = False
    """Without keys, accept requests from clients off loopback too."""
    _names: frozenset[str] = field(init=False, repr=False, default=frozenset())
    _seen: dict[str, bool] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        names = {host_name(h) for h in self.allowed_hosts} | {host_name(self.listen_host)}
        object.__setattr__(self, "_names", frozenset(names))

    def accepts_host(self, host: str) -> bool:
        """Whether ``host`` (a Host header, or a QueueUrl's host) is served here."""
        known = self._seen.get(host)
        if known is not None:
            return known
        name = host_name(host)
        ok = (
            _is_ip(name)
            or name == "localhost"
            or name.endswith(".localhost")
            or name in self._names
        )
        if len(self._seen) >= 4096:
            self._seen.clear()  # bounded: a client sending ever new names gains nothing
        self._seen[host] = ok
        return ok

    def check_host(self, host: str | None) -> None:
        """Refuse a Host header that names something this node does not serve.

        A request without Host (HTTP/1.0) is let through: browsers always send
        one. Raises AccessDenied.
        """
        if host is None or self.accepts_host(host):
            return
        name = host_name(host)
        raise errors.AccessDenied(
            f"Host {host[:100]!r} is not a name this server answers to (a defence against "
            f"DNS rebinding); start cmq serve with --allow-host {name[:100]} to accept it."
        )

    def check_origin(self, origin: str | None, fetch_site: str | None, host: str | None) -> None:
        """Refuse a request a browser sent from another origin. Raises AccessDenied."""
        if fetch_site is not None and fetch_site.strip().lower() in ("cross-site", "same-site"):
            raise errors.AccessDenied(
                f"Cross-origin requests are refused (Sec-Fetch-Site: {fetch_site[:40]})."
            )
        if origin is None:
            return
        parts = urlsplit(origin.strip())
        same = (
            host is not None
            and parts.scheme in ("http", "https")
            and parts.netloc.lower() == host.strip().lower()
        )
        if not same:
            raise errors.AccessDenied(
                f"Cross-origin requests are refused (Origin: {origin[:100]})."
            )

    def check_client(
        self,
        *,
        client: str | None,
        method: str,
        raw_path: bytes,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        now: float,
    ) -> str | None:
        """Authenticate one SQS request; returns the access key id, or None
        when authentication is off. Raises AccessDenied or a SigV4 error."""
        if self.keys is not None:
            return sigv4.verify(
                method=method,
                raw_path=raw_path.decode("latin-1"),
                query=query.decode("latin-1"),
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                body=body,
                keys=self.keys,
                now=now,
            )
        if not self.allow_remote_unsigned and not (client is not None and is_loopback(client)):
            raise errors.AccessDenied(
                "Without --auth, cmq serve accepts requests only from loopback; start it "
                "with --auth FILE (or --insecure-allow-remote)."
            )
        return None
