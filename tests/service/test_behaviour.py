"""The behavioural suite: every SQS action through boto3, on every store."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

from cmq.service.protocol import md5_of_message_attributes
from tests.service.conftest import unique
from tests.service.helpers import Node, wait_until


def _error_code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def _drain(sqs: Any, url: str, **kw: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, **kw).get("Messages", [])
        if not got:
            return out
        out += got


# -- queues -------------------------------------------------------------------


def test_create_get_list_delete_queue(sqs: Any, node: Node) -> None:
    name = unique("lifecycle")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{node.url}/000000000000/{name}"  # built from the Host header
    assert sqs.create_queue(QueueName=name)["QueueUrl"] == url  # idempotent
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix=name)["QueueUrls"]
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=name)
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=name)


def test_list_queues_pages(sqs: Any) -> None:
    prefix = unique("page")
    for i in range(3):
        sqs.create_queue(QueueName=f"{prefix}-{i}")
    first = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2)
    assert len(first["QueueUrls"]) == 2
    rest = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2, NextToken=first["NextToken"])
    assert [u.rsplit("/", 1)[1] for u in first["QueueUrls"] + rest["QueueUrls"]] == [
        f"{prefix}-{i}" for i in range(3)
    ]


def test_create_queue_with_other_attributes_conflicts(sqs: Any) -> None:
    name = unique()
    sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "10"})
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "20"})


@pytest.mark.parametrize(
    ("name", "attributes", "code"),
    [
        ("bad name!", {}, "InvalidParameterValue"),
        ("x" * 81, {}, "InvalidParameterValue"),
        ("ok", {"VisibilityTimeout": "99999"}, "InvalidAttributeValue"),
        ("ok", {"ConsistencyK": "0"}, "InvalidAttributeValue"),
        ("ok", {"ReceiveMode": "lockfree"}, "InvalidAttributeValue"),
        ("ok.fifo", {"FifoQueue": "true", "ReceiveMode": "lock-free"}, "InvalidAttributeValue"),
        ("ok", {"NoSuchAttribute": "1"}, "InvalidAttributeName"),
        # AWS: a FIFO queue's name must end in .fifo; a bad policy is a parameter error.
        ("ok", {"FifoQueue": "true"}, "InvalidParameterValue"),
        ("ok.fifo", {}, "InvalidParameterValue"),
        ("ok", {"FifoQueue": "yes"}, "InvalidAttributeValue"),
        ("ok", {"ContentBasedDeduplication": "true"}, "InvalidAttributeName"),
        ("ok", {"DeduplicationScope": "queue"}, "InvalidAttributeName"),
        ("ok", {"MaximumMessageSize": "1048577"}, "InvalidAttributeValue"),
        ("ok", {"MessageRetentionPeriod": "59"}, "InvalidAttributeValue"),
        ("ok", {"Policy": "not json"}, "InvalidAttributeValue"),
        ("ok", {"Policy": '{"a": "\u0000"}\u0000'}, "InvalidAttributeValue"),
        ("ok", {"RedrivePolicy": "not json"}, "InvalidParameterValue"),
    ],
)
def test_create_queue_validates(sqs: Any, name: str, attributes: dict[str, str], code: str) -> None:
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName=name, Attributes=attributes)
    assert _error_code(exc) == code
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_queue_attributes(sqs: Any, queue: str) -> None:
    sqs.set_queue_attributes(
        QueueUrl=queue, Attributes={"VisibilityTimeout": "45", "ConsistencyK": "3"}
    )
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["ConsistencyK"] == "3"
    assert attrs["ReceiveMode"] == "atomic"  # the default
    assert attrs["QueueArn"].endswith(":" + queue.rsplit("/", 1)[1])
    assert attrs["ApproximateNumberOfMessages"] == "0"
    one = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ConsistencyK"])
    assert one["Attributes"] == {"ConsistencyK": "3"}
    with pytest.raises(ClientError) as exc:
        sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["Bogus"])
    assert _error_code(exc) == "InvalidAttributeName"
    with pytest.raises(ClientError) as exc:
        sqs.set_queue_attributes(QueueUrl=queue, Attributes={"DelaySeconds": "901"})
    assert _error_code(exc) == "InvalidAttributeValue"


def test_missing_queue_errors(sqs: Any, node: Node) -> None:
    url = f"{node.url}/000000000000/{unique('gone')}"
    for call in (
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x"),
        lambda: sqs.receive_message(QueueUrl=url),
        lambda: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]),
        lambda: sqs.purge_queue(QueueUrl=url),
        lambda: sqs.delete_queue(QueueUrl=url),
    ):
        with pytest.raises(sqs.exceptions.QueueDoesNotExist):
            call()


# -- messages -------------------------------------------------------------------


def test_send_receive_delete_with_digests(sqs: Any, queue: str) -> None:
    attrs = {
        "s": {"DataType": "String", "StringValue": "héllo"},
        "n": {"DataType": "Number", "StringValue": "-12.5e3"},
        "b": {"DataType": "Binary", "BinaryValue": b"\x00\xffdata"},
        "c": {"DataType": "String.custom", "StringValue": "x"},
    }
    body = "body ✓ \U0001f600"
    sent = sqs.send_message(QueueUrl=queue, MessageBody=body, MessageAttributes=attrs)
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    wire = {
        k: (
            {"DataType": v["DataType"], "BinaryValue": base64.b64encode(v["BinaryValue"]).decode()}
            if "BinaryValue" in v
            else v
        )
        for k, v in attrs.items()
    }
    assert sent["MD5OfMessageAttributes"] == md5_of_message_attributes(wire)
    got = sqs.receive_message(
        QueueUrl=queue, MessageAttributeNames=["All"], AttributeNames=["All"]
    )["Messages"]
    assert len(got) == 1
    msg = got[0]
    assert msg["MessageId"] == sent["MessageId"]
    assert msg["Body"] == body
    assert msg["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert msg["MessageAttributes"] == attrs
    assert msg["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert msg["Attributes"]["ApproximateReceiveCount"] == "1"
    assert int(msg["Attributes"]["SentTimestamp"]) > 0
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)


def test_message_attribute_md5_matches_moto() -> None:
    """Cross-check our MD5 of message attributes against moto's independent code."""
    moto_models = pytest.importorskip("moto.sqs.models")
    attrs = {
        "a": {"DataType": "String", "StringValue": "1"},
        "z": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\x01\x02").decode()},
        "m": {"DataType": "Number.int", "StringValue": "3"},
    }
    theirs = moto_models.Message(message_id="x", body="b")
    theirs.message_attributes = {
        k: ({**v, "BinaryValue": base64.b64decode(v["BinaryValue"])} if "BinaryValue" in v else v)
        for k, v in attrs.items()
    }
    assert theirs.attribute_md5 == md5_of_message_attributes(attrs)


def test_receive_attribute_name_filters(sqs: Any, queue: str) -> None:
    sqs.send_message(
        QueueUrl=queue,
        MessageBody="x",
        MessageAttributes={
            "app.one": {"DataType": "String", "StringValue": "1"},
            "app.two": {"DataType": "String", "StringValue": "2"},
            "other": {"DataType": "String", "StringValue": "3"},
        },
    )
    msg = sqs.receive_message(QueueUrl=queue, MessageAttributeNames=["app.*"], VisibilityTimeout=0)[
        "Messages"
    ][0]
    assert set(msg["MessageAttributes"]) == {"app.one", "app.two"}
    msg = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)["Messages"][0]
    assert "MessageAttributes" not in msg
    assert "Attributes" not in msg
    msg = sqs.receive_message(
        QueueUrl=queue, MessageSystemAttributeNames=["ApproximateReceiveCount"]
    )["Messages"][0]
    assert msg["Attributes"] == {"ApproximateReceiveCount": "3"}


def test_batches(sqs: Any, queue: str) -> None:
    result = sqs.send_message_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": "a", "MessageBody": "one"},
            {"Id": "b", "MessageBody": "two", "DelaySeconds": 0},
            {"Id": "bad", "MessageBody": "x\x00y"},
        ],
    )
    assert {e["Id"] for e in result["Successful"]} == {"a", "b"}
    [failed] = result["Failed"]
    assert failed["Id"] == "bad" and failed["SenderFault"] is True
    assert failed["Code"] == "InvalidMessageContents"
    got = _drain(sqs, queue)
    assert sorted(m["Body"] for m in got) == ["one", "two"]
    deleted = sqs.delete_message_batch(
        QueueUrl=queue,
        Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
        + [{"Id": "junk", "ReceiptHandle": "not-a-handle"}],
    )
    assert {e["Id"] for e in deleted["Successful"]} == {"d0", "d1"}
    assert deleted["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    counts = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert (
        counts["ApproximateNumberOfMessages"]
        == counts["ApproximateNumberOfMessagesNotVisible"]
        == "0"
    )


@pytest.mark.parametrize(
    ("entries", "code"),
    [
        ([], "AWS.SimpleQueueService.EmptyBatchRequest"),
        (
            [{"Id": str(i), "MessageBody": "x"} for i in range(11)],
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        ),
        (
            [{"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}],
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        ),
        ([{"Id": "bad id!", "MessageBody": "x"}], "AWS.SimpleQueueService.InvalidBatchEntryId"),
        (
            [{"Id": "a", "MessageBody": "x" * 800_000}, {"Id": "b", "MessageBody": "x" * 300_000}],
            "AWS.SimpleQueueService.BatchRequestTooLong",
        ),
    ],
)
def test_batch_request_errors(sqs: Any, queue: str, entries: list[Any], code: str) -> None:
    with pytest.raises(ClientError) as exc:
        sqs.send_message_batch(QueueUrl=queue, Entries=entries)
    assert _error_code(exc) == code


def test_message_limits(sqs: Any, queue: str) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="x" * 1_048_576)  # exactly the limit (1 MiB)
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=queue, MessageBody="x" * 1_048_577)
    assert _error_code(exc) == "InvalidParameterValue"
    assert exc.value.response["Error"]["Message"] == (
        "One or more parameters are invalid. Reason: Message must be shorter than 1048576 bytes."
    )
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=queue, MessageBody="bad \ufffe")
    assert _error_code(exc) == "InvalidMessageContents"
    with pytest.raises(ClientError) as exc:
        sqs.send_message(
            QueueUrl=queue,
            MessageBody="x",
            MessageAttributes={"n": {"DataType": "Number", "StringValue": "abc"}},
        )
    assert _error_code(exc) == "InvalidParameterValue"
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=queue, MessageBody="x", DelaySeconds=901)
    assert _error_code(exc) == "InvalidParameterValue"
    with pytest.raises(ClientError) as exc:
        sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=11)
    assert _error_code(exc) == "InvalidParameterValue"
    with pytest.raises(ClientError) as exc:
        sqs.delete_message(QueueUrl=queue, ReceiptHandle="garbage")
    assert _error_code(exc) == "ReceiptHandleIsInvalid"


def test_visibility_timeout_and_receive_count(sqs: Any, queue: str) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="v")
    first = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=60, AttributeNames=["All"])
    assert first["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "1"
    assert "Messages" not in sqs.receive_message(QueueUrl=queue)  # in flight
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"
    handle = first["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=handle, VisibilityTimeout=0)
    again = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=1, AttributeNames=["All"])
    msg = again["Messages"][0]
    assert msg["Attributes"]["ApproximateReceiveCount"] == "2"
    # The old handle is stale now: its receive is no longer in flight.
    with pytest.raises(ClientError) as exc:
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=handle, VisibilityTimeout=5)
    assert _error_code(exc) == "AWS.SimpleQueueService.MessageNotInflight"
    # Deleting with the stale handle succeeds but keeps the message, as in SQS.
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=handle)
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert (
        int(attrs["ApproximateNumberOfMessages"])
        + int(attrs["ApproximateNumberOfMessagesNotVisible"])
        == 1
    )
    # After its 1 s visibility timeout the message comes back by itself.
    back = wait_until(
        lambda: sqs.receive_message(QueueUrl=queue, AttributeNames=["All"]).get("Messages"),
        timeout=10,
    )
    assert back[0]["Attributes"]["ApproximateReceiveCount"] == "3"


def test_change_visibility_batch(sqs: Any, queue: str) -> None:
    sqs.send_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(3)]
    )
    got = _drain(sqs, queue, VisibilityTimeout=60)
    assert len(got) == 3
    result = sqs.change_message_visibility_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": f"e{i}", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(got)
        ]
        + [{"Id": "junk", "ReceiptHandle": "x", "VisibilityTimeout": 0}],
    )
    assert len(result["Successful"]) == 3
    assert result["Failed"][0]["Id"] == "junk"
    assert len(_drain(sqs, queue)) == 3


def test_purge(sqs: Any, queue: str) -> None:
    sqs.send_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(5)]
    )
    sqs.purge_queue(QueueUrl=queue)
    assert _drain(sqs, queue) == []


def test_delay_seconds(sqs: Any, queue: str) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="later", DelaySeconds=1)
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesDelayed"] == "1"
    assert "Messages" not in sqs.receive_message(QueueUrl=queue)
    got = wait_until(lambda: sqs.receive_message(QueueUrl=queue).get("Messages"), timeout=10)
    assert got[0]["Body"] == "later"


def test_queue_delay_seconds(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique("delayq"), Attributes={"DelaySeconds": "1"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="d")
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    wait_until(lambda: sqs.receive_message(QueueUrl=url).get("Messages"), timeout=10)


def test_long_poll_wakes_on_send(node: Node, queue: str) -> None:
    receiver, sender = node.client(), node.client()
    result: dict[str, Any] = {}

    def poll() -> None:
        result.update(receiver.receive_message(QueueUrl=queue, WaitTimeSeconds=15))

    t = threading.Thread(target=poll)
    t.start()
    sender.send_message(QueueUrl=queue, MessageBody="wake")
    t.join(timeout=20)
    assert not t.is_alive()
    assert result["Messages"][0]["Body"] == "wake"


def test_long_poll_returns_empty_after_wait(sqs: Any, queue: str) -> None:
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)


# -- order: the consistency hint K ------------------------------------------------


def _receive_order(sqs: Any, url: str, n: int) -> list[int]:
    order = []
    for _ in range(n):
        msg = sqs.receive_message(QueueUrl=url)["Messages"][0]
        order.append(int(msg["Body"]))
        sqs.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
    return order


def _send_numbers(sqs: Any, url: str, n: int) -> None:
    for start in range(0, n, 10):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "MessageBody": str(i)} for i in range(start, min(n, start + 10))
            ],
        )


def test_k1_is_in_order(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique("k1"), Attributes={"ConsistencyK": "1"})["QueueUrl"]
    _send_numbers(sqs, url, 30)
    assert _receive_order(sqs, url, 30) == list(range(30))
    _send_numbers(sqs, url, 10)
    batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [int(m["Body"]) for m in batch] == list(range(10))


def test_large_k_is_not_in_order(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique("kn"), Attributes={"ConsistencyK": "1000"})["QueueUrl"]
    _send_numbers(sqs, url, 30)
    order = _receive_order(sqs, url, 30)
    assert sorted(order) == list(range(30))
    # 30! orderings: a random pick matching the sequence is beyond chance.
    assert order != list(range(30))


def test_lock_free_queue_delivers_every_message_in_order_to_one_receiver(sqs: Any) -> None:
    # One receiver never races itself: lock-free with K=1 is in order, each once.
    url = sqs.create_queue(
        QueueName=unique("lf"), Attributes={"ReceiveMode": "lock-free", "ConsistencyK": "1"}
    )["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ReceiveMode"])
    assert attrs["Attributes"] == {"ReceiveMode": "lock-free"}
    _send_numbers(sqs, url, 20)
    assert _receive_order(sqs, url, 20) == list(range(20))
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ReceiveMode": "atomic"})
    with pytest.raises(ClientError) as exc:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"ReceiveMode": "Lock-Free"})
    assert _error_code(exc) == "InvalidAttributeValue"


def test_k_bounds_the_window(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique("k3"), Attributes={"ConsistencyK": "3"})["QueueUrl"]
    _send_numbers(sqs, url, 30)
    seen: set[int] = set()
    for value in _receive_order(sqs, url, 30):
        # Each pick is among the first 3 messages still in the queue.
        assert sorted(set(range(30)) - seen)[:3].count(value) == 1
        seen.add(value)


# -- dead-letter queues ----------------------------------------------------------


def test_redrive_to_dead_letter_queue(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName=unique("dlq"))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    src = sqs.create_queue(
        QueueName=unique("src"),
        Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2})
        },
    )["QueueUrl"]
    sent = sqs.send_message(QueueUrl=src, MessageBody="poison")
    for count in (1, 2):
        msg = sqs.receive_message(QueueUrl=src, VisibilityTimeout=0, AttributeNames=["All"])
        assert msg["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == str(count)
    assert "Messages" not in sqs.receive_message(QueueUrl=src)  # third receive: moved
    dead = sqs.receive_message(QueueUrl=dlq)["Messages"]
    assert dead[0]["MessageId"] == sent["MessageId"]
    assert dead[0]["Body"] == "poison"
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["RedrivePolicy"])["Attributes"][
            "RedrivePolicy"
        ]
    )
    assert policy["maxReceiveCount"] == 2
    with pytest.raises(ClientError) as exc:
        sqs.set_queue_attributes(
            QueueUrl=src,
            Attributes={
                "RedrivePolicy": json.dumps(
                    {"deadLetterTargetArn": arn + "x", "maxReceiveCount": 2}
                )
            },
        )
    assert _error_code(exc) == "InvalidParameterValue"
    assert exc.value.response["Error"]["Message"].endswith(
        "for parameter RedrivePolicy is invalid. Reason: Dead letter target does not exist."
    )


# -- FIFO -----------------------------------------------------------------------------


def test_fifo_group_order_and_blocking(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique("f") + ".fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    for i, group in enumerate("aabba"):
        r = sqs.send_message(
            QueueUrl=url,
            MessageBody=f"{group}{i}",
            MessageGroupId=group,
            MessageDeduplicationId=f"d{i}",
        )
        assert r["SequenceNumber"].isdigit()
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, AttributeNames=["All"])
    assert [m["Body"] for m in first["Messages"]] == ["a0", "a1"]
    assert first["Messages"][0]["Attributes"]["MessageGroupId"] == "a"
    # Group a is blocked while a0 and a1 are in flight; b is free.
    second = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    assert [m["Body"] for m in second["Messages"]] == ["b2", "b3"]
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    for m in first["Messages"]:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url)["Messages"]] == ["a4"]


def test_fifo_deduplication(sqs: Any) -> None:
    url = sqs.create_queue(
        QueueName=unique("d") + ".fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    one = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    two = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    assert one["MessageId"] == two["MessageId"]
    three = sqs.send_message(
        QueueUrl=url, MessageBody="same", MessageGroupId="g", MessageDeduplicationId="explicit"
    )
    assert three["MessageId"] != one["MessageId"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])
    assert len(got["Messages"]) == 2
    assert got["Messages"][1]["Attributes"]["MessageDeduplicationId"] == "explicit"


def test_fifo_validation(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique("v") + ".fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert _error_code(exc) == "MissingParameter"
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert _error_code(exc) == "InvalidParameterValue"  # no dedup id, no content dedup
    with pytest.raises(ClientError) as exc:
        sqs.send_message(
            QueueUrl=url,
            MessageBody="x",
            MessageGroupId="g",
            MessageDeduplicationId="d",
            DelaySeconds=1,
        )
    assert _error_code(exc) == "InvalidParameterValue"


# -- the HTTP edge and metrics ------------------------------------------------------


def test_error_shape_on_the_wire(node: Node) -> None:
    status, body, headers = node.sqs("GetQueueUrl", {"QueueName": unique("nope")})
    assert status == 400
    assert body["__type"] == "com.amazonaws.sqs#QueueDoesNotExist"
    assert "does not exist" in body["message"]
    assert headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    status, body, _ = node.sqs("NoSuchAction", {})
    assert status == 400 and "Unknown operation" in body["message"]
    status, body, _ = node.sqs("TagQueue", {"QueueUrl": "x", "Tags": {}})
    assert status == 400 and body["__type"].endswith("QueueDoesNotExist")


def test_metrics(node: Node, sqs: Any, queue: str) -> None:
    sqs.send_message(QueueUrl=queue, MessageBody="m")
    status, _, body = node.raw("GET", "/metrics", b"", {})
    assert status == 200
    text = body.decode()
    name = queue.rsplit("/", 1)[1]
    assert f'cmq_queue_messages{{queue="{name}"}} 1' in text
    assert 'cmq_sqs_requests_total{action="SendMessage"}' in text
    assert 'cmq_sqs_request_seconds_bucket{action="SendMessage",le="+Inf"}' in text
    assert "cmq_sqs_errors_total" in text
