"""The HTTP edge: origins, Host names, header bounds, request deadlines, SigV4
authentication and start-up failures, against live `cmq serve` processes."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from cmq.service import errors
from cmq.service.edge import EdgePolicy, host_name, is_loopback
from cmq.service.sigv4 import load_keys, verify
from tests.service.conftest import unique
from tests.service.helpers import REPO, Node, wait_until

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
JSON = {"Content-Type": "application/x-amz-json-1.0"}


@pytest.fixture(scope="module")
def edge_node() -> Iterator[Node]:
    n = Node("memory:", "--allow-host", "sqs.internal", "--request-timeout", "1")
    try:
        yield n
    finally:
        n.stop()


def _exists(node: Node, name: str) -> bool:
    status, _, _ = node.sqs("GetQueueUrl", {"QueueName": name})
    return status == 200


# -- cross-origin requests ----------------------------------------------------


def test_cross_origin_form_post_cannot_delete_a_queue(edge_node: Node) -> None:
    name = unique("victim")
    edge_node.client().create_queue(QueueName=name)
    body = urlencode({"Action": "DeleteQueue"}).encode()
    for extra in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": f"http://127.0.0.1:{edge_node.port + 1}", "Sec-Fetch-Site": "same-site"},
    ):
        status, _, reply = edge_node.raw("POST", f"/000000000000/{name}", body, {**FORM, **extra})
        assert status == 403, extra
        assert b"<Code>AccessDenied</Code>" in reply
    assert _exists(edge_node, name)


def test_cross_origin_json_request_refused(edge_node: Node) -> None:
    name = unique("victim")
    url = edge_node.client().create_queue(QueueName=name)["QueueUrl"]
    status, headers, _ = edge_node.raw(
        "POST",
        "/",
        b'{"QueueUrl": "%s"}' % url.encode(),
        {**JSON, "X-Amz-Target": "AmazonSQS.PurgeQueue", "Origin": "http://evil.example"},
    )
    assert status == 403
    assert headers["x-amzn-query-error"] == "AccessDenied;Sender"


def test_same_origin_request_accepted(edge_node: Node) -> None:
    host = f"127.0.0.1:{edge_node.port}"
    status, _, _ = edge_node.raw(
        "POST",
        "/",
        b"{}",
        {
            **JSON,
            "X-Amz-Target": "AmazonSQS.ListQueues",
            "Origin": f"http://{host}",
            "Sec-Fetch-Site": "same-origin",
        },
    )
    assert status == 200


# -- Host names (DNS rebinding) ---------------------------------------------------


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("evil.example", False),
        ("evil.example:9324", False),
        ("localhost.evil.example", False),
        ("localhost", True),
        ("LOCALHOST:1234", True),
        ("app.localhost", True),
        ("127.0.0.1", True),
        ("[::1]:80", True),
        ("10.1.2.3", True),
        ("sqs.internal", True),
    ],
)
def test_host_header_checked(edge_node: Node, host: str, ok: bool) -> None:
    status, _, _ = edge_node.raw("GET", "/health", b"", {"Host": host})
    assert status == (200 if ok else 403)
    status, _, _ = edge_node.raw(
        "POST", "/", b"{}", {**JSON, "X-Amz-Target": "AmazonSQS.ListQueues", "Host": host}
    )
    assert status == (200 if ok else 403)


def test_host_name_parsing() -> None:
    assert host_name("Example.COM.:80") == "example.com"
    assert host_name("[::1]:9324") == "::1"
    assert host_name("::1") == "::1"
    assert is_loopback("127.0.0.7") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.0.1") and not is_loopback("nonsense")


# -- header bounds and deadlines ----------------------------------------------------


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, then read until the server closes (or 30 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before everything was sent: the reply is still there
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return out
            if not chunk:
                return out
            out += chunk


def test_huge_header_refused_and_node_keeps_serving(edge_node: Node) -> None:
    stop = threading.Event()
    health: list[int] = []

    def probe() -> None:
        while not stop.is_set():
            health.append(edge_node.raw("GET", "/health", b"", {})[0])

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    try:
        reply = _exchange(
            edge_node.port,
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (8 << 20) + b"\r\n\r\n",
        )
        assert reply.startswith(b"HTTP/1.1 431 ")
        many = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
        reply = _exchange(
            edge_node.port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + many + b"\r\n"
        )
        assert reply.startswith(b"HTTP/1.1 431 ")
        wait_until(lambda: len(health) > 3)
    finally:
        stop.set()
        t.join(timeout=30)
    assert set(health) == {200}


def test_unfinished_requests_are_timed_out(edge_node: Node) -> None:
    # (the node runs with --request-timeout 1)
    assert _exchange(edge_node.port, b"").startswith(b"HTTP/1.1 408 ")  # never starts
    assert _exchange(edge_node.port, b"GET /health HTTP/1.1\r\nHost: x").startswith(
        b"HTTP/1.1 408 "
    )
    # Head complete, body never finished: the connection is closed.
    reply = _exchange(
        edge_node.port,
        b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.ListQueues\r\n"
        b"Content-Type: application/x-amz-json-1.0\r\nContent-Length: 100\r\n\r\n{",
    )
    assert b" 200 " not in reply
    assert edge_node.healthy()


# -- SigV4 -------------------------------------------------------------------------


KEYS = {"AKIDEXAMPLE": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "other": "s3cr3t"}


def _signed(url: str, body: bytes, headers: dict[str, str], key: str, secret: str) -> AWSRequest:
    """A request signed by botocore's own SigV4 signer."""
    req = AWSRequest(method="POST", url=url, data=body, headers=headers)
    SigV4Auth(Credentials(key, secret), "sqs", "us-east-1").add_auth(req)
    return req


def _verify(req: AWSRequest, now: float | None = None) -> str:
    prepared = req.prepare()
    parts = urlsplit(prepared.url)
    return verify(
        method=prepared.method,
        raw_path=parts.path,
        query=parts.query,
        headers=[
            (k.lower(), v if isinstance(v, str) else v.decode())
            for k, v in prepared.headers.items()
        ]
        + [("host", parts.netloc)],
        body=prepared.body or b"",
        keys=KEYS,
        now=time.time() if now is None else now,
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9324/",
        "http://localhost:9324/000000000000/q-1",
        "http://localhost/000000000000/a%20b/./c/../d",
        "http://localhost:9324/?b=2&a=1&a=0",
    ],
)
def test_sigv4_verifies_botocores_signatures(url: str) -> None:
    body = b'{"QueueName": "x"}'
    headers = {"X-Amz-Target": "AmazonSQS.CreateQueue", **JSON}
    assert _verify(_signed(url, body, headers, "AKIDEXAMPLE", KEYS["AKIDEXAMPLE"])) == "AKIDEXAMPLE"
    with pytest.raises(errors.SignatureDoesNotMatch):
        _verify(_signed(url, body, headers, "other", "wrong"))
    with pytest.raises(errors.InvalidClientTokenId):
        _verify(_signed(url, body, headers, "nobody", "x"))
    tampered = _signed(url, body, headers, "other", "s3cr3t")
    tampered.data = b'{"QueueName": "y"}'
    with pytest.raises(errors.SignatureDoesNotMatch):
        _verify(tampered)


def test_sigv4_refuses_stale_and_malformed() -> None:
    req = _signed("http://localhost/", b"{}", dict(JSON), "other", "s3cr3t")
    with pytest.raises(errors.RequestExpired):
        _verify(req, now=time.time() + 3600)
    base = dict(method="POST", raw_path="/", query="", body=b"", keys=KEYS, now=time.time())
    with pytest.raises(errors.MissingAuthenticationToken):
        verify(headers=[("host", "localhost")], **base)  # type: ignore[arg-type]
    for bad in ("Basic abc", "AWS4-HMAC-SHA256 Credential=x", "AWS4-HMAC-SHA256 garbage"):
        with pytest.raises(errors.IncompleteSignature):
            verify(headers=[("host", "h"), ("authorization", bad)], **base)  # type: ignore[arg-type]


def test_load_keys() -> None:
    assert load_keys("# keys\n\nA B\n  C   D  \n", "f") == {"A": "B", "C": "D"}
    for bad in ("", "# only a comment", "A B C", "lonely"):
        with pytest.raises(ValueError):
            load_keys(bad, "f")


def test_unauthenticated_clients_only_on_loopback() -> None:
    common: dict[str, Any] = dict(
        method="POST", raw_path=b"/", query=b"", headers=[], body=b"", now=0.0
    )
    EdgePolicy().check_client(client="127.0.0.1", **common)
    EdgePolicy().check_client(client="::1", **common)
    with pytest.raises(errors.AccessDenied):
        EdgePolicy().check_client(client="192.0.2.7", **common)
    with pytest.raises(errors.AccessDenied):
        EdgePolicy().check_client(client=None, **common)
    EdgePolicy(allow_remote_unsigned=True).check_client(client="192.0.2.7", **common)


@pytest.fixture(scope="module")
def auth_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    path = tmp_path_factory.mktemp("auth") / "keys"
    path.write_text("".join(f"{k} {v}\n" for k, v in KEYS.items()))
    n = Node("memory:", "--auth", str(path))
    try:
        yield n
    finally:
        n.stop()


def _client(node: Node, key: str, secret: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=node.url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


def test_auth_file_requires_valid_signatures(auth_node: Node) -> None:
    good = _client(auth_node, "AKIDEXAMPLE", KEYS["AKIDEXAMPLE"])
    url = good.create_queue(QueueName=unique("signed"))["QueueUrl"]
    good.send_message(QueueUrl=url, MessageBody="hello")
    assert _client(auth_node, "other", "s3cr3t").receive_message(QueueUrl=url)["Messages"]
    for key, secret, code in (
        ("AKIDEXAMPLE", "wrong", "SignatureDoesNotMatch"),
        ("unknown", "x", "InvalidClientTokenId"),
    ):
        with pytest.raises(ClientError) as exc:
            _client(auth_node, key, secret).list_queues()
        assert exc.value.response["Error"]["Code"] == code
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    status, _, headers = auth_node.sqs("ListQueues", {})
    assert status == 403
    assert headers["x-amzn-query-error"].startswith("MissingAuthenticationToken;")


def test_auth_file_query_protocol(auth_node: Node) -> None:
    url = f"{auth_node.url}/"
    body = urlencode({"Action": "ListQueues", "Version": "2012-11-05"}).encode()
    req = _signed(url, body, dict(FORM), "other", "s3cr3t").prepare()
    status, _, reply = auth_node.raw("POST", "/", body, dict(req.headers.items()))
    assert status == 200, reply
    req = _signed(url, body, dict(FORM), "other", "nope").prepare()
    status, _, reply = auth_node.raw("POST", "/", body, dict(req.headers.items()))
    assert status == 403
    assert b"<Code>SignatureDoesNotMatch</Code>" in reply


# -- start-up failures ----------------------------------------------------------


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmq", "serve", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_port_in_use_is_one_line(edge_node: Node) -> None:
    done = _serve("--port", str(edge_node.port), "--store", "memory:")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"cmq serve: error: cannot listen on 127.0.0.1:{edge_node.port}: the port is in use"
    ]


def test_store_that_cannot_open_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = _serve("--port", "0", "--store", f"sqlite:{blocker}/sub/db.sqlite3")
    assert done.returncode == 1
    assert "listening" not in done.stdout
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("cmq serve: error: ") and "Traceback" not in line


def test_bad_auth_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "keys"
    bad.write_text("only-one-field\n")
    for path in (bad, tmp_path / "missing"):
        done = _serve("--port", "0", "--store", "memory:", "--auth", str(path))
        assert done.returncode == 1
        assert done.stdout == ""
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("cmq serve: error: ") and str(path) in line


# -- one write per response ---------------------------------------------------------


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Cycle:
    response_started = False


def test_a_response_head_waits_for_its_body_and_goes_out_in_one_write() -> None:
    from cmq.service.connection import _OneWrite

    transport, cycle = _Transport(), _Cycle()
    w = _OneWrite(transport, cycle)  # type: ignore[arg-type]
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the response: at once
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    cycle.response_started = True
    w.write(b"HEAD\r\n\r\n")
    assert len(transport.writes) == 1  # held
    w.write(b"body")
    w.write(b"more")
    assert transport.writes[1:] == [b"HEAD\r\n\r\nbody", b"more"]
    assert not w.is_closing()  # everything else is the transport's

    transport, cycle = _Transport(), _Cycle()
    w = _OneWrite(transport, cycle)  # type: ignore[arg-type]
    cycle.response_started = True
    w.write(b"HEAD\r\n\r\n")
    w.close()  # a head with no body (the app failed) still leaves, first
    assert transport.writes == [b"HEAD\r\n\r\n"] and transport.closed


def test_replies_are_whole_with_expect_continue_keep_alive_and_close(edge_node: Node) -> None:
    body = b'{"QueueName": "one-write"}'
    head = (
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Amz-Target: AmazonSQS.CreateQueue\r\n"
        "Content-Type: application/x-amz-json-1.0\r\n"
        f"Content-Length: {len(body)}\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", edge_node.port), timeout=30) as s:
        s.sendall(head + b"Expect: 100-continue\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body)
        first = b""
        while b"one-write" not in first:
            first += s.recv(65536)
        s.sendall(head + b"Connection: close\r\n\r\n" + body)
        second = b""
        while chunk := s.recv(65536):
            second += chunk
    for reply in (first, second):
        assert reply.startswith(b"HTTP/1.1 200 ")
        assert reply.endswith(b'/one-write"}')


def _replies(s: socket.socket, count: int) -> list[bytes]:
    """Read ``count`` whole HTTP replies (each with a Content-Length)."""
    data, out = b"", []
    while len(out) < count:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            if len(rest) >= length:
                out.append(head + sep + rest[:length])
                data = rest[length:]
                continue
        chunk = s.recv(65536)
        assert chunk, f"connection closed after {len(out)} replies"
        data += chunk
    return out


def _request(action: str, body: bytes, *extra: str) -> bytes:
    head = (
        f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Amz-Target: AmazonSQS.{action}\r\n"
        "Content-Type: application/x-amz-json-1.0\r\n" + "".join(f"{h}\r\n" for h in extra)
    )
    if not any(h.lower().startswith("transfer-encoding") for h in extra):
        head += f"Content-Length: {len(body)}\r\n"
        return (head + "\r\n").encode() + body
    return (head + "\r\n").encode() + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def _without_date(reply: bytes) -> bytes:
    return b"\r\n".join(x for x in reply.split(b"\r\n") if not x.lower().startswith(b"date:"))


def test_direct_and_asgi_answers_are_the_same_bytes(edge_node: Node) -> None:
    # A Content-Length body is answered directly; a chunked one goes through
    # ASGI (as large bodies and Expect: 100-continue do): the same bytes.
    name = unique("same-bytes")
    body = json_body = f'{{"QueueName": "{name}"}}'.encode()
    with socket.create_connection(("127.0.0.1", edge_node.port), timeout=30) as s:
        for action, payload in (
            ("CreateQueue", body),
            ("GetQueueUrl", json_body),
            ("GetQueueUrl", b'{"QueueName": "no-such-queue-anywhere"}'),
            ("NoSuchAction", b"{}"),
            ("GetQueueUrl", b"{not json"),
        ):
            s.sendall(_request(action, payload))
            [direct] = _replies(s, 1)
            s.sendall(_request(action, payload, "Transfer-Encoding: chunked"))
            [asgi] = _replies(s, 1)
            assert _without_date(direct) == _without_date(asgi), action


def test_pipelined_requests_are_answered_in_order(edge_node: Node) -> None:
    name = unique("pipelined")
    create = _request("CreateQueue", f'{{"QueueName": "{name}"}}'.encode())
    url = f"http://127.0.0.1/000000000000/{name}"
    send = _request("SendMessage", f'{{"QueueUrl": "{url}", "MessageBody": "x"}}'.encode())
    chunked = _request("GetQueueUrl", f'{{"QueueName": "{name}"}}'.encode(),
                       "Transfer-Encoding: chunked")  # fmt: skip
    listing = _request("ListQueues", f'{{"QueueNamePrefix": "{name}"}}'.encode(),
                       "Transfer-Encoding: chunked")  # fmt: skip
    with socket.create_connection(("127.0.0.1", edge_node.port), timeout=30) as s:
        # Direct, direct, ASGI, direct, ASGI, direct: all in one segment.
        s.sendall(create + send + chunked + send + listing + send)
        replies = _replies(s, 6)
    assert all(r.startswith(b"HTTP/1.1 200 ") for r in replies), replies
    assert replies[0].endswith(f'/{name}"}}'.encode())
    assert b"MD5OfMessageBody" in replies[1] and b"MD5OfMessageBody" in replies[3]
    assert replies[2].endswith(f'/{name}"}}'.encode())
    assert replies[4].endswith(f'/{name}"]}}'.encode())
    assert b"MD5OfMessageBody" in replies[5]


def test_a_direct_answer_to_connection_close_closes(edge_node: Node) -> None:
    request = _request("ListQueues", b"{}", "Connection: close")
    with socket.create_connection(("127.0.0.1", edge_node.port), timeout=30) as s:
        s.sendall(request)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nconnection: close\r\n" in reply
