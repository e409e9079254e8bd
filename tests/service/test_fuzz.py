"""No request of any shape gets a 5xx or a traceback.

Hypothesis builds request bodies and headers for both protocols (JSON with
``X-Amz-Target``, and query-protocol forms) from the service's own parameter
names, with values chosen to break naive parsing: integers as strings that
are not integers (``"--5"``, ``"²"``, thousands of digits), receipt handles
with sequence numbers past 2^63, odd types, odd Unicode. Every reply from a
live node, on every store, must be below 500 and free of tracebacks, and the
node's metrics must never have counted an internal error.
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmq.service.protocol import ACTIONS, UNSUPPORTED_ACTIONS
from tests.service.conftest import unique
from tests.service.helpers import Node

_NAMES = [
    "QueueUrl",
    "QueueName",
    "MessageBody",
    "ReceiptHandle",
    "VisibilityTimeout",
    "DelaySeconds",
    "MaxNumberOfMessages",
    "WaitTimeSeconds",
    "MaxResults",
    "NextToken",
    "QueueNamePrefix",
    "MessageGroupId",
    "MessageDeduplicationId",
    "Attributes",
    "AttributeNames",
    "MessageAttributeNames",
    "MessageAttributes",
    "MessageSystemAttributes",
    "Entries",
    "Id",
    "Tags",
    "TagKeys",
    "tags",
    "Label",
    "AWSAccountIds",
    "Actions",
    "SourceArn",
    "DestinationArn",
    "MaxNumberOfMessagesPerSecond",
    "TaskHandle",
]
_ATTRIBUTES = [
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "VisibilityTimeout",
    "RedrivePolicy",
    "ConsistencyK",
    "FifoQueue",
    "Policy",
    "All",
]


def _handle(seq: str) -> str:
    raw = f"QUEUE\n{seq}\ntoken".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_TRICKY = st.sampled_from(
    [
        "--5",
        "²",
        "٣",
        "1" * 5000,
        "-0",
        "1e3",
        "NaN",
        "",
        "\x00",
        "\ud7ff\ue000",
        "9" * 19,
        str(2**63),
        str(2**64),
        '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:QUEUE", '
        '"maxReceiveCount": 1e999}',
        '{"deadLetterTargetArn": 5, "maxReceiveCount": "²"}',
        "",
        _handle(str(2**63)),
        _handle(str(2**64 + 5)),
        _handle("--5"),
        _handle("²"),
        _handle("1" * 5000),
        _handle("-1"),
    ]
)
_SCALARS = st.one_of(
    _TRICKY,
    st.text(max_size=30),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(_NAMES + _ATTRIBUTES), st.text(max_size=8)), inner, max_size=4
        ),
    ),
    max_leaves=12,
)
_ACTIONS = st.one_of(st.sampled_from(sorted(ACTIONS | UNSUPPORTED_ACTIONS)), st.text(max_size=20))
_HEADER_VALUE = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40
)
_EXTRA_HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "X-Amz-Target",
            "Content-Type",
            "Authorization",
            "X-Amz-Date",
            "Origin",
            "Sec-Fetch-Site",
            "X-Amz-Content-SHA256",
            "Host",
            "Expect",
            "Transfer-Encoding",
        ]
    ),
    _HEADER_VALUE,
    max_size=3,
)


def _fill(value: Any, url: str, name: str) -> Any:
    """Put the live queue's URL and name where the generated value says QUEUE."""
    if isinstance(value, str):
        if value == "QUEUE":
            return url
        if "QUEUE" in value:
            return value.replace("QUEUE", name)
        return value
    if isinstance(value, list):
        return [_fill(v, url, name) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, url, name) for k, v in value.items()}
    return value


@st.composite
def _json_request(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    action = draw(_ACTIONS)
    params: dict[str, Any] = draw(st.dictionaries(st.sampled_from(_NAMES), _VALUES, max_size=5))
    if draw(st.booleans()):
        params["QueueUrl"] = "QUEUE"
    if draw(st.booleans()):
        raw = draw(st.binary(max_size=64))
    else:
        raw = json.dumps(params, allow_nan=True).encode()
    headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}
    headers.update(draw(_EXTRA_HEADERS))
    return headers, raw


_FORM_KEYS = st.one_of(
    st.sampled_from(_NAMES),
    st.builds(
        lambda group, index, field: f"{group}.{index}.{field}",
        st.sampled_from(
            [
                "Attribute",
                "MessageAttribute",
                "Tag",
                "SendMessageBatchRequestEntry",
                "DeleteMessageBatchRequestEntry",
                "ChangeMessageVisibilityBatchRequestEntry",
            ]
        ),
        st.sampled_from(["1", "2", "²", "٣", "0", "1" * 5000, "-1"]),
        st.sampled_from(
            [
                "Name",
                "Value",
                "Id",
                "MessageBody",
                "ReceiptHandle",
                "Key",
                "Value.DataType",
                "Value.StringValue",
                "VisibilityTimeout",
                "DelaySeconds",
            ]
        ),
    ),
    st.builds(
        lambda n, i: f"{n}.{i}",
        st.sampled_from(["AttributeName", "TagKey", "AWSAccountId", "ActionName"]),
        st.sampled_from(["1", "²", "1" * 5000]),
    ),
)


@st.composite
def _form_request(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    pairs = [("Action", draw(_ACTIONS)), ("Version", "2012-11-05")]
    for _ in range(draw(st.integers(0, 6))):
        pairs.append((draw(_FORM_KEYS), draw(st.one_of(_TRICKY, st.text(max_size=20)))))
    if draw(st.booleans()):
        pairs.append(("QueueUrl", "QUEUE"))
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    headers.update({k: v for k, v in draw(_EXTRA_HEADERS).items() if k != "X-Amz-Target"})
    return headers, urlencode(pairs).encode()


_INT = st.one_of(_TRICKY, st.integers(min_value=-(2**70), max_value=2**70), st.floats())
_ENTRY_ID = st.one_of(st.sampled_from(["a", "b", "c"]), st.text(max_size=4))
#: Well-formed requests of each action, with integer-like and handle-like
#: fields drawn from the tricky values: they reach the deep parsing.
_TEMPLATES: dict[str, Any] = {
    "SendMessage": st.fixed_dictionaries(
        {"QueueUrl": st.just("QUEUE"), "MessageBody": st.just("x"), "DelaySeconds": _INT}
    ),
    "ReceiveMessage": st.fixed_dictionaries(
        {
            "QueueUrl": st.just("QUEUE"),
            "MaxNumberOfMessages": _INT,
            "VisibilityTimeout": _INT,
            "WaitTimeSeconds": st.one_of(_TRICKY, st.just(0)),
        }
    ),
    "ChangeMessageVisibility": st.fixed_dictionaries(
        {"QueueUrl": st.just("QUEUE"), "ReceiptHandle": _TRICKY, "VisibilityTimeout": _INT}
    ),
    "DeleteMessage": st.fixed_dictionaries(
        {"QueueUrl": st.just("QUEUE"), "ReceiptHandle": _TRICKY}
    ),
    "ChangeMessageVisibilityBatch": st.fixed_dictionaries(
        {
            "QueueUrl": st.just("QUEUE"),
            "Entries": st.lists(
                st.fixed_dictionaries(
                    {"Id": _ENTRY_ID, "ReceiptHandle": _TRICKY, "VisibilityTimeout": _INT}
                ),
                max_size=3,
            ),
        }
    ),
    "DeleteMessageBatch": st.fixed_dictionaries(
        {
            "QueueUrl": st.just("QUEUE"),
            "Entries": st.lists(
                st.fixed_dictionaries({"Id": _ENTRY_ID, "ReceiptHandle": _TRICKY}), max_size=3
            ),
        }
    ),
    "SendMessageBatch": st.fixed_dictionaries(
        {
            "QueueUrl": st.just("QUEUE"),
            "Entries": st.lists(
                st.fixed_dictionaries(
                    {"Id": _ENTRY_ID, "MessageBody": st.just("x"), "DelaySeconds": _INT}
                ),
                max_size=3,
            ),
        }
    ),
    "SetQueueAttributes": st.fixed_dictionaries(
        {
            "QueueUrl": st.just("QUEUE"),
            "Attributes": st.dictionaries(st.sampled_from(_ATTRIBUTES), _TRICKY, max_size=2),
        }
    ),
    "ListQueues": st.fixed_dictionaries({"MaxResults": _INT}),
}


def _flatten(action: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """The query-protocol form of a JSON request built from a template."""
    pairs = [("Action", action), ("Version", "2012-11-05")]
    for key, value in params.items():
        if key == "Entries":
            for i, entry in enumerate(value, 1):
                pairs += [(f"{action}RequestEntry.{i}.{k}", str(v)) for k, v in entry.items()]
        elif key == "Attributes":
            for i, (k, v) in enumerate(value.items(), 1):
                pairs += [(f"Attribute.{i}.Name", k), (f"Attribute.{i}.Value", str(v))]
        else:
            pairs.append((key, str(value)))
    return pairs


@st.composite
def _templated(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    action = draw(st.sampled_from(sorted(_TEMPLATES)))
    params = draw(_TEMPLATES[action])
    if draw(st.booleans()):
        return {"Content-Type": "application/x-www-form-urlencoded"}, urlencode(
            _flatten(action, params)
        ).encode()
    headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}
    return headers, json.dumps(params, allow_nan=True).encode()


@pytest.fixture
def target(node: Node) -> tuple[Node, str, str]:
    sqs = node.client()
    name = unique("fuzz")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(5)]
    )
    return node, url, name


def _check(
    node: Node, url: str, name: str, headers: dict[str, str], body: bytes, chunked: bool = False
) -> None:
    body = body.replace(b"QUEUE", url.encode()).replace(b"QUEUE", name.encode())
    body = body.replace(b"QUEUE", name.encode())
    if "Host" in headers and not headers["Host"].strip():
        headers = {k: v for k, v in headers.items() if k != "Host"}
    if any(k.lower() in ("content-length", "transfer-encoding") for k in headers):
        chunked = False  # the drawn framing headers are the request's own
    try:
        status, _, reply = node.raw("POST", "/", body, headers, chunked=chunked)
    except ValueError:
        return  # http.client refused to send the header (e.g. Expect/Transfer-Encoding combos)
    assert status < 500, (status, headers, body[:300], reply[:500])
    assert b"Traceback" not in reply


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    request=st.one_of(_templated(), _json_request(), _form_request()),
    # A chunked body goes through ASGI, a Content-Length one is answered
    # directly by the connection: both ways are held to the property.
    chunked=st.booleans(),
)
def test_no_request_gets_a_5xx(
    target: tuple[Node, str, str], request: tuple[dict[str, str], bytes], chunked: bool
) -> None:
    node, url, name = target
    headers, body = request
    _check(node, url, name, headers, body, chunked)


def test_no_internal_error_was_counted(node: Node) -> None:
    _, _, metrics = node.raw("GET", "/metrics", b"", {})
    assert b"InternalError" not in metrics
