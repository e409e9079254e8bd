"""The SQS JSON protocol, sans-IO: bytes and headers in, bytes and headers out.

Requests are ``POST /`` with ``X-Amz-Target: AmazonSQS.<Action>`` and a JSON
object body (``Content-Type: application/x-amz-json-1.0``). Replies are JSON;
errors carry ``__type`` and ``message`` in the body and the classic query
code in the ``x-amzn-query-error`` header (``<code>;Sender``), which botocore
(SQS being ``awsQueryCompatible``) maps back to ``QueueDoesNotExist`` and the
other modelled errors.

This module also computes the MD5 digests exactly as SQS does, since SDKs for
Java, .NET and PHP verify them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cmq.service.errors import InvalidAction, SerializationError, SqsError

__all__ = [
    "ACTIONS",
    "CONTENT_TYPE",
    "Request",
    "compact_json",
    "decode_request",
    "encode_error",
    "encode_result",
    "md5_of_body",
    "md5_of_message_attributes",
]

CONTENT_TYPE = "application/x-amz-json-1.0"
_TARGET_PREFIX = "AmazonSQS."
_CONTENT_TYPE_HEADER = (b"content-type", CONTENT_TYPE.encode())

#: ``json.dumps(obj, separators=(",", ":"))``, without building a new
#: encoder for every call as ``json.dumps`` does when given an option (that
#: construction cost more than encoding a small reply).
compact_json = json.JSONEncoder(separators=(",", ":")).encode

#: The actions this service implements: the whole SQS API of botocore's model.
ACTIONS = frozenset(
    {
        "AddPermission",
        "CancelMessageMoveTask",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
        "CreateQueue",
        "DeleteMessage",
        "DeleteMessageBatch",
        "DeleteQueue",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "ListMessageMoveTasks",
        "ListQueueTags",
        "ListQueues",
        "PurgeQueue",
        "ReceiveMessage",
        "RemovePermission",
        "SendMessage",
        "SendMessageBatch",
        "SetQueueAttributes",
        "StartMessageMoveTask",
        "TagQueue",
        "UntagQueue",
    }
)

#: Actions of the SQS API that this service answers with UnsupportedOperation.
UNSUPPORTED_ACTIONS: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """A decoded request: the action and its JSON parameters."""

    action: str
    params: Mapping[str, Any]


def decode_request(target: str | None, body: bytes) -> Request:
    """Decode one request.

    Raises InvalidAction for a missing or unknown target and
    SerializationError for a body that is not a JSON object.
    """
    if not target or not target.startswith(_TARGET_PREFIX):
        raise InvalidAction(
            "Missing or malformed X-Amz-Target header; expected AmazonSQS.<Action>."
        )
    action = target[len(_TARGET_PREFIX) :]
    if action not in ACTIONS and action not in UNSUPPORTED_ACTIONS:
        raise InvalidAction(f"Unknown operation {action[:64]!r}.")
    try:
        params = json.loads(body) if body.strip() else {}
    except (ValueError, RecursionError) as exc:
        # UnicodeDecodeError is a ValueError; RecursionError from deeply
        # nested input must not escape as a 500.
        raise SerializationError(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(params, dict):
        raise SerializationError("The request body must be a JSON object.")
    return Request(action=action, params=params)


def encode_result(result: Mapping[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and body of a successful reply."""
    body = compact_json(result).encode()
    return 200, _headers(body), body


def encode_error(error: SqsError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and body of an error reply, in the SQS error shape."""
    body = compact_json(
        {"__type": f"com.amazonaws.sqs#{error.type_name}", "message": error.message}
    ).encode()
    fault = "Sender" if error.sender_fault else "Receiver"
    headers = _headers(body)
    headers.append((b"x-amzn-query-error", f"{error.query_code};{fault}".encode()))
    return error.status, headers, body


def _headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [_CONTENT_TYPE_HEADER, (b"content-length", b"%d" % len(body))]


def md5_of_body(body: str) -> str:
    """MD5 hex digest of a message body (UTF-8), as SQS returns it."""
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def md5_of_message_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str:
    """MD5 of message attributes in SQS's encoding.

    Names sorted; for each: length-prefixed name, length-prefixed data type,
    a transport byte (1 string, 2 binary) and the length-prefixed value;
    lengths are 4-byte big-endian. Binary values arrive base64-encoded.
    """
    h = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        attr = attributes[name]
        data_type = str(attr["DataType"])
        _put(h, name.encode())
        _put(h, data_type.encode())
        if data_type.startswith("Binary"):
            h.update(b"\x02")
            _put(h, base64.b64decode(attr["BinaryValue"]))
        else:
            h.update(b"\x01")
            _put(h, str(attr["StringValue"]).encode())
    return h.hexdigest()


def _put(h: Any, data: bytes) -> None:
    h.update(struct.pack(">I", len(data)))
    h.update(data)
