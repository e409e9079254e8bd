"""Helpers of the service tests: live `cmq serve` processes and polling."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
from botocore.config import Config

T = TypeVar("T")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_until(pred: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``pred`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        pause.wait(interval)


class Node:
    """One `cmq serve` subprocess on a free port, stopped by PID."""

    def __init__(self, store: str, *args: str) -> None:
        self.store = store
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cmq", "serve", "--port", "0", "--store", store, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise AssertionError(f"cmq serve did not start: {line!r} {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
        self.url = line.split()[-1]
        self.port = int(self.url.rsplit(":", 1)[1])
        wait_until(self.healthy, timeout=20)

    def healthy(self) -> bool:
        try:
            status, _, _ = self.raw("GET", "/health", b"", {})
        except OSError:
            return False
        return status == 200

    def client(self, retries: int = 1) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            config=Config(retries={"max_attempts": retries, "mode": "standard"}),
        )

    def raw(
        self, method: str, path: str, body: bytes, headers: dict[str, str], *, chunked: bool = False
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on a new connection; ``chunked`` sends the body with
        chunked transfer encoding (which the node answers through ASGI rather
        than directly, see cmq.service.connection)."""
        if chunked:
            return self._chunked(method, path, body, headers)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def _chunked(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        # Head and chunked body in one write: a node refusing the head closes
        # the connection, and a body sent after that would meet a reset.
        head = [f"{method} {path} HTTP/1.1"]
        if not any(k.lower() == "host" for k in headers):
            head.append(f"Host: 127.0.0.1:{self.port}")
        for k, v in headers.items():
            if not re.fullmatch(r"[^:\s][^:\r\n]*", k) or re.search(r"[\r\n]", v):
                raise ValueError(f"invalid header {k!r}: {v!r}")  # as http.client refuses
            head.append(f"{k}: {v}")
        head.append("Transfer-Encoding: chunked")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        data += (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(data)
            resp = http.client.HTTPResponse(s, method=method)
            resp.begin()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()

    def sqs(
        self, action: str, params: dict[str, Any] | bytes
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        body = params if isinstance(params, bytes) else json.dumps(params).encode()
        status, headers, data = self.raw(
            "POST",
            "/",
            body,
            {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"},
        )
        return status, json.loads(data) if data else {}, headers

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._close_pipes()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
