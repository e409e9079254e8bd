"""Who may use the broker's AMQP listener and console, and what each may do.

Theory of operation
-------------------
:class:`Users` answers two questions, with no I/O after it is made (but
for :meth:`Users.reload`, which reads its file again):

- *login* (``check``): may this name and password connect from this
  address? Passwords are kept as given (cmq's users file) or as RabbitMQ
  keeps them (a definitions file: a 4-byte salt, then the SHA-256, SHA-512 or
  MD5 of salt and password, base64-coded), and compared in constant time;
- *authorisation* (``permissions``): what may the user do in the broker's one
  virtual host, ``/``? RabbitMQ's model: three regular expressions, matched
  anywhere in a resource's name (unanchored, as Erlang's ``re:run``; an empty
  one matches only the empty name): *configure* (declare and delete queues
  and exchanges), *write* (publish to an exchange, bind to a queue or
  exchange) and *read* (consume, get and purge a queue, bind from an
  exchange). :class:`Permissions` holds them; ``None`` means the user may not
  open ``/`` at all. Which AMQP method needs which permission on which
  resource is the AMQP front end's table (:mod:`cmq.routing._amqp`).

Two file formats, told apart by their first character:

- cmq's users file: ``name:password`` a line. Every such user may do
  everything (as a RabbitMQ user with ``.*`` for all three), from any address;
- RabbitMQ's definitions (JSON, as ``rabbitmqctl export_definitions`` writes
  them): ``users`` (``name``, ``password_hash`` and ``hashing_algorithm``, or
  ``password`` in clear, ``tags``) and ``permissions`` (``user``, ``vhost``,
  ``configure``, ``write``, ``read``). Other sections are not read. As in
  RabbitMQ, ``guest`` may log in from loopback only, a user without
  permissions on ``/`` may log in but not open it, and the console is for
  users tagged ``administrator``.

Without a file, RabbitMQ's out-of-the-box rule: ``guest`` / ``guest`` from
loopback only, with every permission.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from cmq._errors import ConfigError

__all__ = ["EVERYTHING", "HASHING_ALGORITHMS", "Permissions", "Users", "hash_password"]

#: The one virtual host the broker serves.
VHOST: Final = "/"
#: RabbitMQ's password hashing modules, by the name a definitions file gives.
_HASHES: Final[dict[str, Callable[..., Any]]] = {
    "rabbit_password_hashing_sha256": hashlib.sha256,
    "rabbit_password_hashing_sha512": hashlib.sha512,
    "rabbit_password_hashing_md5": hashlib.md5,
}
#: RabbitMQ's default when a definitions file names no hashing algorithm.
_DEFAULT_HASH: Final = "rabbit_password_hashing_sha256"
#: The hashing algorithms a definitions file may name, as it names them.
HASHING_ALGORITHMS: Final = tuple(_HASHES)
#: The users RabbitMQ lets in from loopback only (its ``loopback_users`` default).
_LOOPBACK_USERS: Final = frozenset({"guest"})
#: Tags that let a user of a definitions file into the console.
_CONSOLE_TAGS: Final = frozenset({"administrator"})


def _pattern(regex: str, what: str) -> re.Pattern[str]:
    # Erlang's re is PCRE; Python's re reads the patterns people write for
    # RabbitMQ (anchors, classes, alternation, escapes) the same way.
    try:
        return re.compile(regex if regex else "^$")
    except re.error as exc:
        raise ConfigError(f"{what}: not a regular expression ({exc})") from None


@dataclass(frozen=True, slots=True)
class Permissions:
    """A user's three regular expressions in the virtual host (see the module's notes)."""

    configure: re.Pattern[str]
    write: re.Pattern[str]
    read: re.Pattern[str]

    @classmethod
    def of(cls, configure: str, write: str, read: str, *, what: str = "permissions") -> Permissions:
        """From the three expressions as RabbitMQ writes them.

        Raises:
            ConfigError: one is not a regular expression.
        """
        return cls(
            _pattern(configure, f"{what}: configure"),
            _pattern(write, f"{what}: write"),
            _pattern(read, f"{what}: read"),
        )

    @property
    def everything(self) -> bool:
        """Whether every name matches all three (``.*``): nothing to check."""
        return all(p.pattern in (".*", "^.*$", ".*$", "^.*") for p in (self.configure, self.write, self.read))

    def allows(self, permission: str, name: str) -> bool:
        """Whether ``permission`` ("configure", "write" or "read") covers the resource ``name``."""
        pattern: re.Pattern[str] = getattr(self, permission)
        return pattern.search(name) is not None


#: What a user of cmq's users file, and the default guest, may do.
EVERYTHING: Final = Permissions.of(".*", ".*", ".*")


@dataclass(frozen=True, slots=True)
class _User:
    secret: bytes  # the password as UTF-8, or RabbitMQ's salted hash
    hashing: Callable[..., Any] | None  # None: ``secret`` is the password itself
    permissions: Permissions | None  # None: may not open the virtual host
    tags: frozenset[str]
    loopback_only: bool

    def password_is(self, password: str) -> bool:
        given = password.encode("utf-8", "surrogatepass")
        if self.hashing is None:
            return hmac.compare_digest(self.secret, given)
        if len(self.secret) <= 4:
            return False  # RabbitMQ's passwordless user: no password logs it in
        salt = self.secret[:4]
        return hmac.compare_digest(self.secret[4:], self.hashing(salt + given).digest())


class Users:
    """Who may connect over AMQP and what each may do (see the module's notes).

    ``Users(passwords)``: each name with its password, every permission;
    ``loopback_only`` names those that may log in from loopback only.
    ``Users.default()`` is RabbitMQ's out-of-the-box rule, ``Users.load(path)``
    reads a users file or a RabbitMQ definitions file, and
    ``Users.from_definitions(data)`` takes definitions already parsed.
    ``notes`` says what a definitions file held that cmq does not apply
    (permissions on other virtual hosts). Users read from a file can be read
    again in place (:meth:`reload`): whoever holds this object (the AMQP
    listener, the console) sees the new users at the next login.
    """

    def __init__(self, passwords: Mapping[str, str], *, loopback_only: frozenset[str] = frozenset()) -> None:
        admin = frozenset({"administrator"})
        self._users: dict[str, _User] = {
            name: _User(password.encode("utf-8", "surrogatepass"), None, EVERYTHING, admin, name in loopback_only)
            for name, password in passwords.items()
        }
        self.notes: list[str] = []
        self.path: str | None = None  # the file these users were read from

    @classmethod
    def default(cls) -> Users:
        return cls({"guest": "guest"}, loopback_only=_LOOPBACK_USERS)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Users:
        """Read a users file: cmq's ``name:password`` lines, or RabbitMQ's
        definitions (JSON, a file whose first character is ``{``).

        Raises:
            ConfigError: the file cannot be read, or is not one of the two formats.
        """
        where = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read users file {where!r}: {exc}") from exc
        if text.lstrip().startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"users file {where!r}: not valid JSON ({exc})") from None
            made = cls.from_definitions(data, where=where)
        else:
            made = cls(_passwords(text, where))
        made.path = where
        return made

    def reload(self) -> list[str]:
        """Read the file these users came from again and take its users in
        place of these, for every login from now on (a connection already
        open keeps what it logged in with); return the new :attr:`notes`.

        Raises:
            ConfigError: they were not read from a file, or the file is now
                unreadable or malformed (these users are kept).
        """
        if self.path is None:
            raise ConfigError("these users were not read from a file")
        fresh = Users.load(self.path)
        self._users, self.notes = fresh._users, fresh.notes  # one assignment each: a login sees old or new
        return self.notes

    def __len__(self) -> int:
        return len(self._users)

    @classmethod
    def from_definitions(cls, data: Any, *, where: str = "definitions") -> Users:
        """Users and their permissions on ``/`` from RabbitMQ's definitions.

        Raises:
            ConfigError: a user or permission entry is malformed, a hashing
                algorithm is unknown, or there are no users.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"users file {where!r}: expected a JSON object with 'users' and 'permissions'")
        users, perms = data.get("users"), data.get("permissions", [])
        if not isinstance(users, list) or not users:
            raise ConfigError(f"users file {where!r} has no users (a 'users' list)")
        if not isinstance(perms, list):
            raise ConfigError(f"users file {where!r}: 'permissions' must be a list")
        granted: dict[str, Permissions] = {}
        notes: list[str] = []
        for i, p in enumerate(perms):
            what = f"users file {where!r} permissions[{i}]"
            if not isinstance(p, dict) or not all(isinstance(p.get(k), str) for k in
                                                  ("user", "vhost", "configure", "write", "read")):  # fmt: skip
                raise ConfigError(f"{what}: expected user, vhost, configure, write and read as strings")
            if p["vhost"] != VHOST:
                notes.append(f"permissions of {p['user']!r} on vhost {p['vhost']!r} not applied: "
                             "cmq's broker serves the one vhost '/'")  # fmt: skip
                continue
            granted[p["user"]] = Permissions.of(p["configure"], p["write"], p["read"], what=what)
        table: dict[str, _User] = {}
        for i, u in enumerate(users):
            what = f"users file {where!r} users[{i}]"
            if not isinstance(u, dict) or not isinstance(u.get("name"), str) or not u["name"]:
                raise ConfigError(f"{what}: expected an object with a 'name'")
            name = u["name"]
            if name in table:
                raise ConfigError(f"{what}: user {name!r} appears twice")
            table[name] = _User(*_secret(u, f"{what} ({name!r})"), granted.get(name), _tags(u.get("tags"), what),
                                name in _LOOPBACK_USERS)  # fmt: skip
        for user in granted.keys() - table.keys():
            notes.append(f"permissions of {user!r} not applied: no such user")
        made = cls({})
        made._users = table
        made.notes = notes
        return made

    def check(self, user: str, password: str, peer_host: str) -> str | None:
        """None when ``user`` may log in with ``password`` from ``peer_host``, else why not."""
        u = self._users.get(user)
        if u is None or not u.password_is(password):
            return "bad credentials"
        if u.loopback_only and not _is_loopback(peer_host):
            return f"user {user!r} can only log in via localhost"
        return None

    def check_console(self, user: str, password: str, peer_host: str) -> str | None:
        """As :meth:`check`, for the console: a definitions file's user also needs the ``administrator`` tag."""
        why = self.check(user, password, peer_host)
        if why is None and not self._users[user].tags & _CONSOLE_TAGS:
            return f"user {user!r} is not tagged administrator"
        return why

    def permissions(self, user: str) -> Permissions | None:
        """What ``user`` may do in ``/``; None: it may not open ``/`` (or is unknown)."""
        u = self._users.get(user)
        return None if u is None else u.permissions


def _passwords(text: str, where: str) -> dict[str, str]:
    """cmq's users file: ``name:password`` a line (the password is all after the first colon)."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, password = line.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"users file {where!r} line {n}: expected name:password")
        out[name] = password
    if not out:
        raise ConfigError(f"users file {where!r} has no users")
    return out


def hash_password(password: str, algorithm: str = _DEFAULT_HASH, *, salt: bytes | None = None) -> str:
    """``password`` as a definitions file's ``password_hash``: RabbitMQ's scheme
    (a random 4-byte salt, then the digest of salt and password, base64-coded),
    which :meth:`Users.check` and RabbitMQ's import both accept.

    Raises:
        ConfigError: an unknown ``algorithm``, a ``salt`` not of 4 bytes, or
            an empty password (a passwordless user has ``password_hash`` "").
    """
    hashing = _HASHES.get(algorithm)
    if hashing is None:
        raise ConfigError(f"unknown hashing algorithm {algorithm!r} (known: {', '.join(_HASHES)})")
    if not password:
        raise ConfigError('an empty password: a user who may not log in with one has "password_hash": ""')
    salt = os.urandom(4) if salt is None else salt
    if len(salt) != 4:
        raise ConfigError(f"the salt must be 4 bytes, not {len(salt)}")
    digest = hashing(salt + password.encode("utf-8", "surrogatepass")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def _secret(u: Mapping[str, Any], what: str) -> tuple[bytes, Callable[..., Any] | None]:
    password, digest = u.get("password"), u.get("password_hash")
    if password is not None and digest is not None:
        raise ConfigError(f"{what}: give 'password' or 'password_hash', not both")
    if password is not None:
        if not isinstance(password, str):
            raise ConfigError(f"{what}: 'password' must be a string")
        return password.encode("utf-8", "surrogatepass"), None
    if not isinstance(digest, str):
        raise ConfigError(f"{what}: expected 'password_hash' (as rabbitmqctl export_definitions writes it)")
    algorithm = u.get("hashing_algorithm") or _DEFAULT_HASH
    hashing = _HASHES.get(algorithm) if isinstance(algorithm, str) else None
    if hashing is None:
        known = ", ".join(_HASHES)
        raise ConfigError(f"{what}: unknown hashing_algorithm {algorithm!r} (known: {known})")
    try:
        secret = base64.b64decode(digest, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{what}: 'password_hash' is not base64") from None
    if secret and len(secret) != 4 + hashing().digest_size:
        raise ConfigError(f"{what}: 'password_hash' has {len(secret)} bytes, expected a 4-byte salt and "
                          f"a {hashing().digest_size}-byte {algorithm.rsplit('_', 1)[-1]} digest")  # fmt: skip
    return secret, hashing


def _tags(tags: Any, what: str) -> frozenset[str]:
    if tags is None:
        return frozenset()
    if isinstance(tags, str):  # older exports: "administrator,management"
        return frozenset(t.strip() for t in tags.split(",") if t.strip())
    if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
        return frozenset(tags)
    raise ConfigError(f"{what}: 'tags' must be a list of strings")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False
