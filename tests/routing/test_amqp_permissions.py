"""Users and permissions on the broker's AMQP listener: RabbitMQ's definitions, its
password hashes, and its access-control table, held to RabbitMQ's own answers.

The parity tests run the same pika code against a cmq broker given a
definitions file and against the RabbitMQ at 127.0.0.1:5672, where the same
user is made with ``rabbitmqctl`` (skipped when either is missing, or when
not root) and deleted afterwards.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pika = pytest.importorskip("pika", reason="pika is not installed: pip install 'pycmq[test]'")
pytest.importorskip("pamqp", reason="pamqp is not installed: pip install 'pycmq[broker]'")

from cmq import ConfigError  # noqa: E402
from cmq.routing import Broker, BrokerConfig  # noqa: E402
from cmq.routing._users import EVERYTHING, HASHING_ALGORITHMS, Permissions, Users, hash_password  # noqa: E402
from tests.routing.test_amqp_rabbitmq_parity import RABBITMQ, _rabbitmq_up  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(60)

#: What `rabbitmqctl export_definitions` wrote for guest/guest on RabbitMQ 3.10.8
#: (rabbit_password_hashing_sha256): a vector from outside cmq.
GUEST_SHA256 = "Ttx5xY9djiBA7vuQjfCmXSGELnyK7+7aTogf20dDatnB3QRm"

#: The restricted user of the parity tests: may configure app.*, write to
#: app.* (and to the default exchange's empty name, which RabbitMQ does not
#: check under that name), read app.r*.
PERMS = {"configure": r"^app\.", "write": r"^app\.|^$", "read": r"^app\.r"}


def rabbit_hash(password: str, algorithm: Callable[..., Any] = hashlib.sha256, salt: bytes = b"salt") -> str:
    return base64.b64encode(salt + algorithm(salt + password.encode()).digest()).decode()


def write_definitions(path: Path, users: list[dict[str, Any]], permissions: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"rabbit_version": "3.10.8", "users": users, "permissions": permissions}))
    return path


# -- the users file -----------------------------------------------------------------


def test_rabbitmq_hash_of_guest_logs_guest_in_from_loopback_only(tmp_path: Path) -> None:
    users = Users.load(write_definitions(tmp_path / "d.json", [
        {"name": "guest", "password_hash": GUEST_SHA256, "hashing_algorithm": "rabbit_password_hashing_sha256",
         "tags": ["administrator"]},
    ], [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]))  # fmt: skip
    assert users.check("guest", "guest", "127.0.0.1") is None
    assert users.check("guest", "guesT", "127.0.0.1") == "bad credentials"
    assert "localhost" in (users.check("guest", "guest", "192.0.2.7") or "")
    assert users.permissions("guest") == EVERYTHING


@pytest.mark.parametrize(
    "algorithm, hashing",
    [
        ("rabbit_password_hashing_sha512", hashlib.sha512),
        ("rabbit_password_hashing_md5", hashlib.md5),
        (None, hashlib.sha256),
    ],
)
def test_each_rabbitmq_hashing_algorithm(tmp_path: Path, algorithm: str | None, hashing: Any) -> None:
    user: dict[str, Any] = {"name": "ann", "password_hash": rabbit_hash("pa:ss wörd", hashing), "tags": "management"}
    if algorithm is not None:
        user["hashing_algorithm"] = algorithm
    users = Users.load(write_definitions(tmp_path / "d.json", [user], []))
    assert users.check("ann", "pa:ss wörd", "192.0.2.7") is None  # any address: only guest is held to loopback
    assert users.check("ann", "pa:ss word", "192.0.2.7") == "bad credentials"


def test_a_user_without_permissions_on_the_vhost_logs_in_but_may_not_open_it(tmp_path: Path) -> None:
    users = Users.load(write_definitions(tmp_path / "d.json", [{"name": "ann", "password": "pw"}], [
        {"user": "ann", "vhost": "other", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "ghost", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
    ]))  # fmt: skip
    assert users.check("ann", "pw", "127.0.0.1") is None
    assert users.permissions("ann") is None
    assert users.permissions("nobody") is None
    assert any("'other'" in n for n in users.notes)
    assert any("'ghost'" in n and "no such user" in n for n in users.notes)


def test_a_passwordless_user_never_logs_in(tmp_path: Path) -> None:
    users = Users.load(write_definitions(tmp_path / "d.json", [{"name": "cert", "password_hash": ""}], []))
    assert users.check("cert", "", "127.0.0.1") == "bad credentials"


def test_the_console_wants_an_administrator_from_definitions_and_anyone_from_cmqs_file(tmp_path: Path) -> None:
    defs = Users.load(write_definitions(tmp_path / "d.json", [
        {"name": "admin", "password": "a", "tags": ["administrator"]},
        {"name": "app", "password": "b", "tags": ["management"]},
    ], []))  # fmt: skip
    assert defs.check_console("admin", "a", "127.0.0.1") is None
    assert "administrator" in (defs.check_console("app", "b", "127.0.0.1") or "")
    assert defs.check_console("app", "wrong", "127.0.0.1") == "bad credentials"
    plain = tmp_path / "users"
    plain.write_text("bob:pw\n")
    assert Users.load(plain).check_console("bob", "pw", "127.0.0.1") is None
    assert Users.load(plain).permissions("bob") == EVERYTHING


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("{}", "no users"),
        ('{"users": []}', "no users"),
        ('{"users": [{"name": "a", "password": "p"}], "permissions": {}}', "must be a list"),
        ('{"users": [{"password": "p"}]}', "'name'"),
        ('{"users": [{"name": "a"}]}', "password_hash"),
        ('{"users": [{"name": "a", "password": "p", "password_hash": ""}]}', "not both"),
        ('{"users": [{"name": "a", "password_hash": "!!"}]}', "base64"),
        ('{"users": [{"name": "a", "password_hash": "AAAA"}]}', "4-byte salt"),
        ('{"users": [{"name": "a", "password_hash": "AAAA", "hashing_algorithm": "bcrypt"}]}', "unknown hashing"),
        ('{"users": [{"name": "a", "password": "p"}, {"name": "a", "password": "q"}]}', "twice"),
        ('{"users": [{"name": "a", "password": "p", "tags": 3}]}', "tags"),
        ('{"users": [{"name": "a", "password": "p"}], "permissions": [{"user": "a", "vhost": "/"}]}',
         "configure, write and read"),
        ('{"users": [{"name": "a", "password": "p"}], "permissions": [{"user": "a", "vhost": "/", '
         '"configure": "(", "write": "", "read": ""}]}', "configure: not a regular expression"),
    ],
)  # fmt: skip
def test_a_bad_definitions_file_is_refused_with_the_reason(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "d.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=r"d\.json") as info:
        Users.load(path)
    assert message in str(info.value)


def test_permissions_match_anywhere_and_empty_matches_only_the_empty_name() -> None:
    p = Permissions.of("app", "", "^r.*x$")
    assert p.allows("configure", "my.app.q") and not p.allows("configure", "ap")
    assert p.allows("write", "") and not p.allows("write", "a")
    assert p.allows("read", "r1x") and not p.allows("read", "r1xy")
    assert EVERYTHING.everything and not p.everything


# -- on the wire, against RabbitMQ's answers ------------------------------------------


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module", params=["cmq", "rabbitmq"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """(address, user): a broker where ``user`` (password "pw") has PERMS,
    guest has everything, and ``user + "-none"`` has no permissions on /."""
    user = f"cmq-perm-{secrets.token_hex(4)}"
    if request.param == "rabbitmq":
        if not _rabbitmq_up():
            pytest.skip("no RabbitMQ on 127.0.0.1:5672")
        if shutil.which("rabbitmqctl") is None or os.geteuid() != 0:
            pytest.skip("making RabbitMQ users needs rabbitmqctl, as root")
        _rabbitmqctl("add_user", user, "pw")
        _rabbitmqctl("add_user", user + "-none", "pw")
        try:
            _rabbitmqctl("set_permissions", "-p", "/", user, PERMS["configure"], PERMS["write"], PERMS["read"])
            yield RABBITMQ, user
        finally:
            _rabbitmqctl("delete_user", user)
            _rabbitmqctl("delete_user", user + "-none")
        return
    path = write_definitions(tmp_path_factory.mktemp("defs") / "definitions.json", [
        {"name": "guest", "password_hash": GUEST_SHA256, "tags": ["administrator"]},
        {"name": user, "password_hash": rabbit_hash("pw"), "tags": []},
        {"name": user + "-none", "password": "pw"},
    ], [
        {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": user, "vhost": "/", **PERMS},
    ])  # fmt: skip
    with Broker(config=BrokerConfig(consumer_timeout=60.0), amqp_port=0, users=Users.load(path)).start() as b:
        yield b.amqp_address, user


def _connect(address: Any, user: str, password: str = "pw") -> Any:
    params = pika.ConnectionParameters(*address, credentials=pika.PlainCredentials(user, password))
    return pika.BlockingConnection(params)


@pytest.fixture
def as_guest(server: tuple[Any, str]) -> Iterator[Any]:
    conn = _connect(server[0], "guest", "guest")
    yield conn.channel()
    if conn.is_open:
        conn.close()


def attempt(server: tuple[Any, str], action: Callable[[Any], Any]) -> str:
    """"ok", or the reply code and text a channel was closed with, for ``action``
    on a fresh channel of the restricted user (publishes confirmed)."""
    conn = _connect(*server)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        action(ch)
        return "ok"
    except pika.exceptions.ChannelClosedByBroker as exc:
        return f"{exc.reply_code} {exc.reply_text}".replace(server[1], "USER")
    finally:
        if conn.is_open:
            conn.close()


def refused(kind: str, name: str) -> str:
    return f"403 ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user 'USER'"


def test_configure_covers_declare_and_delete(server: tuple[Any, str], as_guest: Any) -> None:
    tag = secrets.token_hex(3)
    other = f"other.{tag}"
    as_guest.queue_declare(other)
    as_guest.exchange_declare(other, "fanout")
    try:
        assert attempt(server, lambda ch: ch.queue_declare(f"app.{tag}", auto_delete=True)) == "ok"
        assert attempt(server, lambda ch: ch.queue_declare(f"nope.{tag}")) == refused("queue", f"nope.{tag}")
        assert attempt(server, lambda ch: ch.queue_declare(other, passive=True)) == "ok"  # passive: no permission
        assert attempt(server, lambda ch: ch.queue_delete(other)) == refused("queue", other)
        assert attempt(server, lambda ch: ch.exchange_declare(f"app.{tag}", "fanout", auto_delete=True)) == "ok"
        assert attempt(server, lambda ch: ch.exchange_declare(f"x.{tag}", "fanout")) == refused("exchange", f"x.{tag}")
        assert attempt(server, lambda ch: ch.exchange_delete(other)) == refused("exchange", other)
    finally:
        as_guest.queue_delete(other)
        as_guest.exchange_delete(other)


def test_a_server_named_queue_is_checked_under_the_name_it_would_get(server: tuple[Any, str]) -> None:
    got = attempt(server, lambda ch: ch.queue_declare("", exclusive=True))
    assert got.startswith("403 ACCESS_REFUSED - access to queue 'amq.gen-")
    assert got.endswith("' in vhost '/' refused for user 'USER'")


def test_write_covers_publish_and_the_default_exchange_is_amq_default(server: tuple[Any, str],
                                                                       as_guest: Any) -> None:  # fmt: skip
    tag = secrets.token_hex(3)
    as_guest.exchange_declare(f"app.{tag}", "fanout")
    try:
        assert attempt(server, lambda ch: ch.basic_publish(f"app.{tag}", "k", b"m")) == "ok"
        assert attempt(server, lambda ch: ch.basic_publish("amq.direct", "k", b"m")) == refused("exchange", "amq.direct")
        # '^$' in the write pattern does not open the default exchange: its name there is amq.default.
        assert attempt(server, lambda ch: ch.basic_publish("", "k", b"m")) == refused("exchange", "amq.default")
    finally:
        as_guest.exchange_delete(f"app.{tag}")


def test_read_covers_get_consume_purge_and_the_source_of_a_binding(server: tuple[Any, str], as_guest: Any) -> None:
    tag = secrets.token_hex(3)
    readable, writable = f"app.r{tag}", f"app.w{tag}"
    for q in (readable, writable):
        as_guest.queue_declare(q)
    try:
        assert attempt(server, lambda ch: ch.basic_get(readable)) == "ok"
        assert attempt(server, lambda ch: ch.basic_get(writable)) == refused("queue", writable)
        assert attempt(server, lambda ch: ch.basic_consume(writable, lambda *a: None)) == refused("queue", writable)
        assert attempt(server, lambda ch: ch.queue_purge(writable)) == refused("queue", writable)
        assert attempt(server, lambda ch: ch.queue_purge(readable)) == "ok"
        # queue.bind: write on the queue, then read on the exchange.
        assert attempt(server, lambda ch: ch.queue_bind(writable, "amq.direct", "k")) == refused("exchange", "amq.direct")
        assert attempt(server, lambda ch: ch.queue_bind("other", "amq.direct", "k")) == refused("queue", "other")
    finally:
        for q in (readable, writable):
            as_guest.queue_delete(q)


def test_a_new_queue_with_a_dead_letter_exchange_needs_read_on_it_and_write_there(server: tuple[Any, str]) -> None:
    tag = secrets.token_hex(3)
    dl = {"x-dead-letter-exchange": f"app.dlx{tag}"}
    assert attempt(server, lambda ch: ch.queue_declare(f"app.q{tag}", arguments=dl)) == refused("queue", f"app.q{tag}")
    ok = attempt(server, lambda ch: ch.queue_declare(f"app.r{tag}", auto_delete=True, exclusive=True, arguments=dl))
    assert ok == "ok"
    other = {"x-dead-letter-exchange": f"other{tag}"}
    got = attempt(server, lambda ch: ch.queue_declare(f"app.r{tag}", exclusive=True, arguments=other))
    assert got == refused("exchange", f"other{tag}")


def test_a_user_without_permissions_on_the_vhost_is_refused_at_open(server: tuple[Any, str]) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        _connect(server[0], server[1] + "-none")
    assert "530" in str(info.value)
    assert f"access to vhost '/' refused for user '{server[1]}-none'" in str(info.value)


# -- the command line -------------------------------------------------------------------


@contextlib.contextmanager
def cmq_broker(users: Path) -> Iterator[subprocess.Popen[str]]:
    """``cmq broker --amqp-port 0 --users USERS`` in a process of its own, killed on leaving."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cmq", "broker", "--port", "0", "--in-memory", "--amqp-port", "0",
                             "--users", str(users)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        yield proc
    finally:
        proc.kill()
        proc.wait()


def amqp_address(proc: subprocess.Popen[str]) -> tuple[str, int]:
    """The AMQP address from the broker's first line ("... AMQP 0-9-1 on HOST:PORT")."""
    assert proc.stdout is not None
    return "127.0.0.1", int(proc.stdout.readline().rsplit(":", 1)[-1])


def test_cmq_broker_reads_definitions_and_says_what_it_does_not_apply(tmp_path: Path) -> None:
    path = write_definitions(tmp_path / "definitions.json", [{"name": "ann", "password": "pw"}], [
        {"user": "ann", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "ann", "vhost": "staging", "configure": ".*", "write": ".*", "read": ".*"},
    ])  # fmt: skip
    with cmq_broker(path) as proc:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert "definitions.json" in first and "'staging'" in first and "not applied" in first
        conn = _connect(amqp_address(proc), "ann")
        conn.channel().queue_declare("anything", auto_delete=True)
        conn.close()
    bad = tmp_path / "bad.json"
    bad.write_text('{"users": [{"name": "ann", "password_hash": "AAAA"}]}')
    done = subprocess.run([sys.executable, "-m", "cmq", "broker", "--port", "0", "--in-memory", "--amqp-port", "0",
                           "--users", str(bad)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "bad.json" in done.stderr and "4-byte salt" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_broker_console_lets_in_administrators_only(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="the console needs the console extra: pip install 'pycmq[console]'")
    import base64 as b64
    import urllib.error
    import urllib.request

    from cmq.console import BrokerHttp

    users = Users.load(write_definitions(tmp_path / "d.json", [
        {"name": "admin", "password_hash": rabbit_hash("a"), "tags": ["administrator"]},
        {"name": "app", "password_hash": rabbit_hash("b"), "tags": ["management"]},
    ], []))  # fmt: skip

    def status(http: Any, user: str, password: str) -> int:
        auth = b64.b64encode(f"{user}:{password}".encode()).decode()
        url = f"http://127.0.0.1:{http.address[1]}/console/api/overview"
        req = urllib.request.Request(url, headers={"Authorization": f"Basic {auth}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    with Broker(port=0).start() as b:
        http = BrokerHttp(b, users=users).start()
        try:
            assert status(http, "admin", "a") == 200
            assert status(http, "app", "b") == 401
            assert status(http, "admin", "b") == 401
        finally:
            http.close()


# -- hash-password ----------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", HASHING_ALGORITHMS)
def test_hash_password_writes_what_users_accepts(tmp_path: Path, algorithm: str) -> None:
    one, two = hash_password("pa:ss wörd", algorithm), hash_password("pa:ss wörd", algorithm)
    assert one != two  # salted
    users = Users.load(write_definitions(tmp_path / "d.json", [
        {"name": "a", "password_hash": one, "hashing_algorithm": algorithm},
        {"name": "b", "password_hash": two, "hashing_algorithm": algorithm},
    ], []))  # fmt: skip
    assert users.check("a", "pa:ss wörd", "192.0.2.7") is None and users.check("b", "pa:ss wörd", "::1") is None
    assert users.check("a", "pa:ss word", "127.0.0.1") == "bad credentials"
    # RabbitMQ's own export of guest/guest, rebuilt from its salt.
    assert hash_password("guest", salt=base64.b64decode(GUEST_SHA256)[:4]) == GUEST_SHA256


def test_hash_password_refuses_what_it_cannot_hash() -> None:
    with pytest.raises(ConfigError, match="empty password"):
        hash_password("")
    with pytest.raises(ConfigError, match="unknown hashing algorithm"):
        hash_password("x", "bcrypt")
    with pytest.raises(ConfigError, match="4 bytes"):
        hash_password("x", salt=b"12345")


def _logs_in(user: str, password: str) -> bool:
    try:
        _connect(RABBITMQ, user, password).close()
    except pika.exceptions.ProbableAuthenticationError:
        return False
    return True


def test_cmq_broker_hash_password_reads_stdin_and_rabbitmq_takes_its_hash() -> None:
    done = subprocess.run([sys.executable, "-m", "cmq", "broker", "hash-password", "--algorithm", "sha512"],
                          input="s3cret-pw\n", capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    digest = done.stdout.strip()
    assert len(base64.b64decode(digest)) == 4 + 64
    empty = subprocess.run([sys.executable, "-m", "cmq", "broker", "hash-password"], input="\n",
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert empty.returncode != 0 and "empty password" in empty.stderr and "Traceback" not in empty.stderr
    if not _rabbitmq_up() or shutil.which("rabbitmqctl") is None or os.geteuid() != 0:
        pytest.skip("checking the hash against RabbitMQ needs it on 5672 and rabbitmqctl, as root")
    user = f"cmq-hash-{secrets.token_hex(4)}"
    path = Path(f"/tmp/{user}.json")
    path.write_text(json.dumps({
        "users": [{"name": user, "password_hash": digest, "tags": [], "hashing_algorithm": "rabbit_password_hashing_sha512"}],
        "permissions": [{"user": user, "vhost": "/", "configure": "", "write": "", "read": ""}],
    }))  # fmt: skip
    try:
        _rabbitmqctl("import_definitions", str(path))
        # RabbitMQ finishes the import in the background: wait for the login to work.
        assert wait_until(lambda: _logs_in(user, "s3cret-pw"), 30), "RabbitMQ never took the cmq-made hash"
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            _connect(RABBITMQ, user, "s3cret-px")
    finally:
        path.unlink()
        subprocess.run(["rabbitmqctl", "delete_user", user], capture_output=True, timeout=60)


def test_sighup_reloads_the_users_file_for_new_logins_and_keeps_it_when_bad(tmp_path: Path) -> None:
    path = write_definitions(tmp_path / "definitions.json", [{"name": "ann", "password": "pw"}],
                             [{"user": "ann", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}])  # fmt: skip
    with cmq_broker(path) as proc:
        assert proc.stderr is not None
        address = amqp_address(proc)
        ann = _connect(address, "ann")
        ann_channel = ann.channel()
        write_definitions(path, [{"name": "bob", "password": "pw2"}],
                          [{"user": "bob", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}])  # fmt: skip
        proc.send_signal(signal.SIGHUP)
        assert "reloaded, 1 user(s)" in proc.stderr.readline()
        _connect(address, "bob", "pw2").close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            _connect(address, "ann")
        ann_channel.queue_declare("still-open", auto_delete=True)  # logged in before: kept
        ann.close()
        path.write_text("{broken")
        proc.send_signal(signal.SIGHUP)
        line = proc.stderr.readline()
        assert "not reloaded" in line and "not valid JSON" in line
        _connect(address, "bob", "pw2").close()


def test_reload_needs_a_file() -> None:
    with pytest.raises(ConfigError, match="not read from a file"):
        Users.default().reload()
