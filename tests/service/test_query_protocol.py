"""The classic query protocol (form in, XML out) of older SDKs, on every store."""

from __future__ import annotations

import base64
import hashlib
import xml.etree.ElementTree as ET
from urllib.parse import urlencode

import pytest

from cmq.service.query_protocol import decode_form
from tests.service.conftest import unique
from tests.service.helpers import Node

NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"


def call(node: Node, params: dict[str, str], path: str = "/") -> tuple[int, ET.Element]:
    status, headers, body = node.raw(
        "POST",
        path,
        urlencode({**params, "Version": "2012-11-05"}).encode(),
        {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
    )
    assert headers["content-type"] == "text/xml"
    return status, ET.fromstring(body)


def text(root: ET.Element, path: str) -> list[str]:
    return [e.text or "" for e in root.iter(NS + path)]


def test_decode_form_unflattens() -> None:
    body = urlencode(
        {
            "Action": "SendMessageBatch",
            "SendMessageBatchRequestEntry.1.Id": "a",
            "SendMessageBatchRequestEntry.1.MessageBody": "x",
            "SendMessageBatchRequestEntry.1.MessageAttribute.1.Name": "n",
            "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType": "String",
            "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue": "v",
            "SendMessageBatchRequestEntry.2.Id": "b",
            "SendMessageBatchRequestEntry.2.MessageBody": "y",
            "AttributeName.2": "B",
            "AttributeName.1": "A",
        }
    ).encode()
    req = decode_form(body, "/000000000000/q")
    assert req.action == "SendMessageBatch"
    assert req.params["QueueUrl"] == "/000000000000/q"
    assert req.params["AttributeNames"] == ["A", "B"]
    assert req.params["Entries"] == [
        {
            "Id": "a",
            "MessageBody": "x",
            "MessageAttributes": {"n": {"DataType": "String", "StringValue": "v"}},
        },
        {"Id": "b", "MessageBody": "y"},
    ]


def test_query_protocol_round_trip(node: Node) -> None:
    name = unique("xml")
    status, root = call(
        node,
        {
            "Action": "CreateQueue",
            "QueueName": name,
            "Attribute.1.Name": "VisibilityTimeout",
            "Attribute.1.Value": "40",
        },
    )
    assert status == 200
    [url] = text(root, "QueueUrl")
    assert url.endswith("/" + name)
    _, root = call(
        node, {"Action": "GetQueueAttributes", "QueueUrl": url, "AttributeName.1": "All"}
    )
    attrs = dict(zip(text(root, "Name"), text(root, "Value"), strict=True))
    assert attrs["VisibilityTimeout"] == "40"
    binary = base64.b64encode(b"\x00\x01").decode()
    _, root = call(
        node,
        {
            "Action": "SendMessage",
            "QueueUrl": url,
            "MessageBody": "héllo <&>",
            "MessageAttribute.1.Name": "b",
            "MessageAttribute.1.Value.DataType": "Binary",
            "MessageAttribute.1.Value.BinaryValue": binary,
        },
    )
    assert text(root, "MD5OfMessageBody") == [hashlib.md5("héllo <&>".encode()).hexdigest()]
    _, root = call(
        node,
        {
            "Action": "SendMessageBatch",
            "QueueUrl": url,
            "SendMessageBatchRequestEntry.1.Id": "one",
            "SendMessageBatchRequestEntry.1.MessageBody": "batched",
        },
    )
    assert text(root, "Id") == ["one"]
    _, root = call(
        node,
        {
            "Action": "ReceiveMessage",
            "QueueUrl": url,
            "MaxNumberOfMessages": "10",
            "AttributeName.1": "All",
            "MessageAttributeName.1": "All",
        },
    )
    assert sorted(text(root, "Body")) == ["batched", "héllo <&>"]
    assert text(root, "BinaryValue") == [binary]
    handles = text(root, "ReceiptHandle")
    # Path addressing (boto 2 style): the queue is the request path.
    path = "/" + url.split("/", 3)[3]
    status, _ = call(node, {"Action": "DeleteMessage", "ReceiptHandle": handles[0]}, path=path)
    assert status == 200
    _, root = call(
        node,
        {
            "Action": "DeleteMessageBatch",
            "QueueUrl": url,
            "DeleteMessageBatchRequestEntry.1.Id": "d",
            "DeleteMessageBatchRequestEntry.1.ReceiptHandle": handles[1],
            "DeleteMessageBatchRequestEntry.2.Id": "bad",
            "DeleteMessageBatchRequestEntry.2.ReceiptHandle": "junk",
        },
    )
    assert text(root, "Code") == ["ReceiptHandleIsInvalid"]
    _, root = call(node, {"Action": "ListQueues", "QueueNamePrefix": name})
    assert text(root, "QueueUrl") == [url]
    status, _ = call(node, {"Action": "DeleteQueue", "QueueUrl": url})
    assert status == 200


@pytest.mark.parametrize(
    ("params", "code"),
    [
        (
            {"Action": "GetQueueUrl", "QueueName": "nope-" + "x" * 10},
            "AWS.SimpleQueueService.NonExistentQueue",
        ),
        ({"Action": "Bogus"}, "UnknownOperationException"),
        ({"Action": "CreateQueue", "QueueName": "bad name"}, "InvalidParameterValue"),
    ],
)
def test_query_protocol_errors(node: Node, params: dict[str, str], code: str) -> None:
    status, root = call(node, params)
    assert status == 400
    assert text(root, "Code") == [code]
    assert text(root, "Type") == ["Sender"]
