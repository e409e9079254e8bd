"""Bad input is the client's fault: always a 4xx, and in a batch only its own entry fails."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import urlencode

import pytest

from cmq.service import errors
from cmq.service.params import parse_int, parse_receipt_handle
from tests.service.helpers import Node

NOT_INTEGERS = ["--5", "²", "٣", "1" * 5000, "5.0", "", "0x10", "1_000"]


def _handle(name: str, seq: str) -> str:
    return base64.urlsafe_b64encode(f"{name}\n{seq}\ntoken".encode()).decode().rstrip("=")


def test_parse_int() -> None:
    assert parse_int(" 42 ") == 42 and parse_int("-0") == 0
    for text in NOT_INTEGERS:
        assert parse_int(text) is None


def test_receipt_handle_sequence_bounds() -> None:
    assert parse_receipt_handle("q", _handle("q", str(2**63 - 1)))[0] == 2**63 - 1
    for seq in (str(2**63), str(2**64), "-1", "²", "1" * 5000):
        with pytest.raises(errors.ReceiptHandleIsInvalid):
            parse_receipt_handle("q", _handle("q", seq))


@pytest.mark.parametrize("text", NOT_INTEGERS)
def test_integer_strings_that_are_not_integers(node: Node, queue: str, text: str) -> None:
    for action, params in (
        ("ReceiveMessage", {"QueueUrl": queue, "MaxNumberOfMessages": text}),
        ("SendMessage", {"QueueUrl": queue, "MessageBody": "x", "DelaySeconds": text}),
        ("ListQueues", {"MaxResults": text}),
        ("SetQueueAttributes", {"QueueUrl": queue, "Attributes": {"VisibilityTimeout": text}}),
    ):
        status, body, _ = node.sqs(action, params)
        assert status == 400, (action, body)
        assert body["__type"].rsplit("#", 1)[1] in (
            "InvalidParameterValue",
            "InvalidAttributeValue",
        )
    # The same through the query protocol.
    form = urlencode({"Action": "ReceiveMessage", "QueueUrl": queue, "WaitTimeSeconds": text})
    status, _, reply = node.raw(
        "POST", "/", form.encode(), {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert status == 400 and b"InvalidParameterValue" in reply


def test_huge_receipt_sequence_is_an_invalid_handle(sqs: Any, queue: str) -> None:
    name = queue.rsplit("/", 1)[1]
    for seq in (str(2**63), str(2**64 + 1)):
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=_handle(name, seq))
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
            sqs.change_message_visibility(
                QueueUrl=queue, ReceiptHandle=_handle(name, seq), VisibilityTimeout=5
            )


def test_in_a_batch_only_the_bad_entry_fails(node: Node, sqs: Any, queue: str) -> None:
    name = queue.rsplit("/", 1)[1]
    sqs.send_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(2)]
    )
    got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=60)
    good = [m["ReceiptHandle"] for m in got["Messages"]]
    assert len(good) == 2
    status, body, _ = node.sqs(
        "ChangeMessageVisibilityBatch",
        {
            "QueueUrl": queue,
            "Entries": [
                {"Id": "ok", "ReceiptHandle": good[0], "VisibilityTimeout": 0},
                {"Id": "badint", "ReceiptHandle": good[1], "VisibilityTimeout": "--5"},
                {
                    "Id": "bighandle",
                    "ReceiptHandle": _handle(name, str(2**63)),
                    "VisibilityTimeout": 1,
                },
            ],
        },
    )
    assert status == 200
    assert [e["Id"] for e in body["Successful"]] == ["ok"]
    assert {e["Id"]: e["Code"] for e in body["Failed"]} == {
        "badint": "InvalidParameterValue",
        "bighandle": "ReceiptHandleIsInvalid",
    }
    status, body, _ = node.sqs(
        "SendMessageBatch",
        {
            "QueueUrl": queue,
            "Entries": [
                {"Id": "ok", "MessageBody": "fine"},
                {"Id": "bad", "MessageBody": "x", "DelaySeconds": "²"},
            ],
        },
    )
    assert status == 200
    assert [e["Id"] for e in body["Successful"]] == ["ok"]
    assert [e["Id"] for e in body["Failed"]] == ["bad"]
    status, body, _ = node.sqs(
        "DeleteMessageBatch",
        {
            "QueueUrl": queue,
            "Entries": [
                {"Id": "ok", "ReceiptHandle": good[1]},
                {"Id": "bad", "ReceiptHandle": _handle(name, str(2**64))},
            ],
        },
    )
    assert status == 200
    assert [e["Id"] for e in body["Successful"]] == ["ok"]
    assert [e["Code"] for e in body["Failed"]] == ["ReceiptHandleIsInvalid"]
