"""Fidelity with AWS: the actions added to the API, and error codes and texts as
AWS answers them (texts as recorded from AWS in LocalStack's snapshot tests and
AWS's API reference), through boto3 on every store."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import urlencode

import pytest
from botocore.exceptions import ClientError

from tests.service.conftest import unique
from tests.service.helpers import Node, wait_until

NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"


def _error(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    err = exc.value.response["Error"]
    return str(err["Code"]), str(err["Message"])


def _arn(sqs: Any, url: str) -> str:
    return str(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
    )


def _form(node: Node, params: dict[str, str]) -> tuple[int, ET.Element]:
    status, _, body = node.raw(
        "POST",
        "/",
        urlencode({**params, "Version": "2012-11-05"}).encode(),
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    return status, ET.fromstring(body)


# -- tags ---------------------------------------------------------------------------


def test_tags(sqs: Any, node: Node) -> None:
    url = sqs.create_queue(QueueName=unique("tags"), tags={"team": "a", "env": "dev"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "dev"}
    sqs.tag_queue(QueueUrl=url, Tags={"env": "prod", "cost": "42"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "prod", "cost": "42"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team", "absent"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "prod", "cost": "42"}
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert not any("tag" in k.lower() for k in attrs)
    # The query protocol: Tag.N.Key/Value in, <Tag><Key/><Value/></Tag> out.
    status, _ = _form(
        node, {"Action": "TagQueue", "QueueUrl": url, "Tag.1.Key": "q", "Tag.1.Value": "v"}
    )
    assert status == 200
    status, root = _form(node, {"Action": "ListQueueTags", "QueueUrl": url})
    tags = {t.findtext(NS + "Key"): t.findtext(NS + "Value") for t in root.iter(NS + "Tag")}
    assert tags == {"env": "prod", "cost": "42", "q": "v"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["env", "cost", "q"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    with pytest.raises(ClientError) as exc:
        sqs.tag_queue(QueueUrl=url, Tags={f"k{i}": "v" for i in range(51)})
    assert _error(exc)[0] == "InvalidParameterValue"


# -- permissions -------------------------------------------------------------------


def test_add_and_remove_permission(sqs: Any, queue: str) -> None:
    sqs.add_permission(
        QueueUrl=queue,
        Label="AliceSend",
        AWSAccountIds=["111122223333"],
        Actions=["SendMessage", "ReceiveMessage"],
    )
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["Policy"])["Attributes"]["Policy"]
    )
    [statement] = policy["Statement"]
    assert statement["Sid"] == "AliceSend"
    assert statement["Principal"] == {"AWS": ["arn:aws:iam::111122223333:root"]}
    assert statement["Action"] == ["SQS:SendMessage", "SQS:ReceiveMessage"]
    assert statement["Resource"] == _arn(sqs, queue)
    with pytest.raises(ClientError) as exc:
        sqs.add_permission(
            QueueUrl=queue, Label="AliceSend", AWSAccountIds=["1"], Actions=["SendMessage"]
        )
    assert _error(exc) == (
        "InvalidParameterValue",
        "Value AliceSend for parameter Label is invalid. Reason: Already exists.",
    )
    with pytest.raises(ClientError) as exc:
        sqs.add_permission(QueueUrl=queue, Label="x", AWSAccountIds=["1"], Actions=["A"] * 8)
    assert _error(exc) == ("OverLimit", "8 Actions were found, maximum allowed is 7.")
    sqs.remove_permission(QueueUrl=queue, Label="AliceSend")
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["Policy"])
    with pytest.raises(ClientError) as exc:
        sqs.remove_permission(QueueUrl=queue, Label="AliceSend")
    assert _error(exc) == (
        "InvalidParameterValue",
        "Value AliceSend for parameter Label is invalid. Reason: can't find label.",
    )


# -- attributes --------------------------------------------------------------------


def test_message_size_defaults_to_one_mebibyte(sqs: Any, queue: str) -> None:
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["MaximumMessageSize"])
    assert attrs["Attributes"]["MaximumMessageSize"] == "1048576"
    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"MaximumMessageSize": "1024"})
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=queue, MessageBody="x" * 1025)
    assert _error(exc) == (
        "InvalidParameterValue",
        "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
    )
    got = sqs.send_message_batch(QueueUrl=queue, Entries=[{"Id": "a", "MessageBody": "x" * 1025}])
    assert got["Failed"] == [
        {
            "Id": "a",
            "SenderFault": True,
            "Code": "InvalidParameterValue",
            "Message": "One or more parameters cannot be validated. Reason: Message must be "
            "shorter than 1024 bytes.",
        }
    ]


def test_empty_redrive_policy_removes_it(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName=unique("dlq"))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": _arn(sqs, dlq), "maxReceiveCount": 1})
    src = sqs.create_queue(QueueName=unique("src"), Attributes={"RedrivePolicy": policy})[
        "QueueUrl"
    ]
    sqs.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": ""})
    attrs = sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["All"])["Attributes"]
    assert "RedrivePolicy" not in attrs
    sqs.send_message(QueueUrl=src, MessageBody="stays")
    for _ in range(3):  # over the old maxReceiveCount: no longer dead-lettered
        assert sqs.receive_message(QueueUrl=src, VisibilityTimeout=0)["Messages"]


def test_policy_with_nul_is_refused_and_xml_stays_readable(
    sqs: Any, node: Node, queue: str
) -> None:
    bad = '{"Statement": [], "x": "\x00"}'
    with pytest.raises(ClientError) as exc:
        sqs.set_queue_attributes(QueueUrl=queue, Attributes={"Policy": bad})
    assert _error(exc) == ("InvalidAttributeValue", "Invalid value for the parameter Policy.")
    for name in ("Policy", "Bogus\x00Name"):
        status, root = _form(
            node,
            {
                "Action": "SetQueueAttributes",
                "QueueUrl": queue,
                "Attribute.1.Name": name,
                "Attribute.1.Value": bad,
            },
        )
        assert status == 400
        assert root.findtext(f"{NS}Error/{NS}Code") in (
            "InvalidAttributeValue",
            "InvalidAttributeName",
        )
    # A NUL escaped inside the JSON is six ASCII characters: kept, and valid XML.
    escaped = '{"Statement": [], "x": "\\u0000"}'
    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"Policy": escaped})
    status, root = _form(
        node, {"Action": "GetQueueAttributes", "QueueUrl": queue, "AttributeName.1": "Policy"}
    )
    assert status == 200
    assert root.findtext(f".//{NS}Value") == escaped


@pytest.mark.parametrize(
    ("attributes", "code", "message"),
    [
        ({"FifoQueue": "true"}, "InvalidAttributeName", "Unknown Attribute FifoQueue."),
        (
            {"ContentBasedDeduplication": "true"},
            "InvalidAttributeName",
            "Unknown Attribute ContentBasedDeduplication.",
        ),
        (
            {"FifoThroughputLimit": "perQueue"},
            "InvalidAttributeName",
            "You can specify the FifoThroughputLimit only when FifoQueue is set to true.",
        ),
        (
            {"MessageRetentionPeriod": "1209601"},
            "InvalidAttributeValue",
            "Invalid value for the parameter MessageRetentionPeriod.",
        ),
        (
            {"MaximumMessageSize": "1023"},
            "InvalidAttributeValue",
            "Invalid value for the parameter MaximumMessageSize.",
        ),
        ({"Bogus": "1"}, "InvalidAttributeName", "Unknown Attribute Bogus."),
    ],
)
def test_attribute_errors(
    sqs: Any, queue: str, attributes: dict[str, str], code: str, message: str
) -> None:
    with pytest.raises(ClientError) as exc:
        sqs.set_queue_attributes(QueueUrl=queue, Attributes=attributes)
    assert _error(exc) == (code, message)


def test_fifo_errors(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique("f") + ".fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    cases: list[tuple[Any, tuple[str, str]]] = [
        (
            lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": "false"}),
            (
                "InvalidAttributeValue",
                "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not "
                "supported.",
            ),
        ),
        (
            lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d"),
            ("MissingParameter", "The request must contain the parameter MessageGroupId."),
        ),
        (
            lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g"),
            (
                "InvalidParameterValue",
                "The queue should either have ContentBasedDeduplication enabled or "
                "MessageDeduplicationId provided explicitly",
            ),
        ),
        (
            lambda: sqs.send_message(
                QueueUrl=url,
                MessageBody="x",
                MessageGroupId="group 123",
                MessageDeduplicationId="d",
            ),
            (
                "InvalidParameterValue",
                "Value group 123 for parameter MessageGroupId is invalid. Reason: MessageGroupId "
                "can only include alphanumeric and punctuation characters. 1 to 128 in length.",
            ),
        ),
        (
            lambda: sqs.send_message(
                QueueUrl=url,
                MessageBody="x",
                MessageGroupId="g",
                MessageDeduplicationId="d",
                DelaySeconds=2,
            ),
            (
                "InvalidParameterValue",
                "Value 2 for parameter DelaySeconds is invalid. Reason: The request include "
                "parameter that is not valid for this queue type.",
            ),
        ),
        (
            lambda: sqs.send_message_batch(
                QueueUrl=url,
                Entries=[{"Id": "a", "MessageBody": "x", "MessageDeduplicationId": "d"}],
            ),
            ("InvalidParameterValue", "The request must contain the parameter MessageGroupId."),
        ),
    ]
    for call, expected in cases:
        with pytest.raises(ClientError) as exc:
            call()
        assert _error(exc) == expected


def test_request_errors(sqs: Any, queue: str) -> None:
    name = queue.rsplit("/", 1)[1]
    cases: list[tuple[Any, tuple[str, str]]] = [
        (
            lambda: sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=11),
            (
                "InvalidParameterValue",
                "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 "
                "and 10, if provided.",
            ),
        ),
        (
            lambda: sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=21),
            (
                "InvalidParameterValue",
                "Value 21 for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= "
                "20, if provided.",
            ),
        ),
        (
            lambda: sqs.send_message_batch(
                QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(20)]
            ),
            (
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                "Maximum number of entries per request are 10. You have sent 20.",
            ),
        ),
        (
            lambda: sqs.send_message_batch(
                QueueUrl=queue,
                Entries=[
                    {"Id": "a", "MessageBody": "x" * 600_000},
                    {"Id": "b", "MessageBody": "y" * 448_577},
                ],
            ),
            (
                "AWS.SimpleQueueService.BatchRequestTooLong",
                "Batch requests cannot be longer than 1048576 bytes. You have sent 1048577 bytes.",
            ),
        ),
        (
            lambda: sqs.send_message_batch(
                QueueUrl=queue, Entries=[{"Id": "a", "MessageBody": "x"}] * 2
            ),
            ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", "Id a repeated."),
        ),
        (
            lambda: sqs.delete_message_batch(QueueUrl=queue, Entries=[]),
            (
                "AWS.SimpleQueueService.EmptyBatchRequest",
                "There should be at least one DeleteMessageBatchRequestEntry in the request.",
            ),
        ),
        (
            lambda: sqs.delete_message(QueueUrl=queue, ReceiptHandle="garbage"),
            (
                "ReceiptHandleIsInvalid",
                'The input receipt handle "garbage" is not a valid receipt handle.',
            ),
        ),
        (
            lambda: sqs.create_queue(QueueName=name, Attributes={"DelaySeconds": "5"}),
            (
                "QueueAlreadyExists",
                "A queue already exists with the same name and a different value for attribute "
                "DelaySeconds",
            ),
        ),
        (
            lambda: sqs.send_message(
                QueueUrl=queue,
                MessageBody="x",
                MessageAttributes={"e": {"DataType": "String", "StringValue": ""}},
            ),
            (
                "InvalidParameterValue",
                "Message (user) attribute 'e' must contain a non-empty value of type 'String'.",
            ),
        ),
    ]
    for call, expected in cases:
        with pytest.raises(ClientError) as exc:
            call()
        assert _error(exc) == expected


# -- queue URLs ----------------------------------------------------------------------


def test_queue_url_host_and_account_are_checked(sqs: Any, node: Node, queue: str) -> None:
    name = queue.rsplit("/", 1)[1]
    for wrong in (
        f"{node.url}/123456789012/{name}",  # another account
        f"http://evil.example/000000000000/{name}",  # a host this node does not serve
        f"{node.url}/{name}",  # no account
        f"{node.url}/000000000000/{name}/extra",
    ):
        with pytest.raises(ClientError) as exc:
            sqs.send_message(QueueUrl=wrong, MessageBody="x")
        assert _error(exc) == (
            "AWS.SimpleQueueService.NonExistentQueue",
            "The specified queue does not exist.",
        )
    for right in (f"http://localhost:{node.port}/000000000000/{name}", f"/000000000000/{name}"):
        sqs.send_message(QueueUrl=right, MessageBody="x")


# -- dead-letter queues ----------------------------------------------------------------


def _dead_letter(sqs: Any, src: str, bodies: list[str]) -> None:
    """Send ``bodies`` to ``src`` (maxReceiveCount 1) and receive until all are dead-lettered."""
    for body in bodies:
        sqs.send_message(QueueUrl=src, MessageBody=body)

    def drained() -> bool:
        sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10, VisibilityTimeout=0)
        counts = sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["All"])["Attributes"]
        return (
            counts["ApproximateNumberOfMessages"]
            == counts["ApproximateNumberOfMessagesNotVisible"]
            == "0"
        )

    wait_until(drained)


def _redrive_pair(sqs: Any) -> tuple[str, str, str]:
    dlq = sqs.create_queue(QueueName=unique("dlq"))["QueueUrl"]
    arn = _arn(sqs, dlq)
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})
    src = sqs.create_queue(QueueName=unique("src"), Attributes={"RedrivePolicy": policy})[
        "QueueUrl"
    ]
    return dlq, arn, src


def test_list_dead_letter_source_queues(sqs: Any) -> None:
    dlq, arn, src = _redrive_pair(sqs)
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 3})
    other = sqs.create_queue(QueueName=unique("src2"), Attributes={"RedrivePolicy": policy})[
        "QueueUrl"
    ]
    got = sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"]
    assert sorted(got) == sorted([src, other])
    page = sqs.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=1)
    assert len(page["queueUrls"]) == 1
    rest = sqs.list_dead_letter_source_queues(QueueUrl=dlq, NextToken=page["NextToken"])
    assert sorted(page["queueUrls"] + rest["queueUrls"]) == sorted([src, other])
    assert sqs.list_dead_letter_source_queues(QueueUrl=src)["queueUrls"] == []


def test_message_move_task_back_to_source(sqs: Any) -> None:
    dlq, arn, src = _redrive_pair(sqs)
    _dead_letter(sqs, src, [f"m{i}" for i in range(15)])
    dead = sqs.receive_message(QueueUrl=dlq, AttributeNames=["All"], VisibilityTimeout=0)
    assert dead["Messages"][0]["Attributes"]["DeadLetterQueueSourceArn"] == _arn(sqs, src)
    handle = sqs.start_message_move_task(SourceArn=arn)["TaskHandle"]

    def finished() -> dict[str, Any] | None:
        [task] = sqs.list_message_move_tasks(SourceArn=arn)["Results"]
        return task if task["Status"] != "RUNNING" else None

    task = wait_until(finished)
    assert task["Status"] == "COMPLETED"
    assert (
        task["ApproximateNumberOfMessagesMoved"] == task["ApproximateNumberOfMessagesToMove"] == 15
    )
    assert "TaskHandle" not in task
    bodies = set()
    while got := sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10).get("Messages"):
        for m in got:
            bodies.add(m["Body"])
            sqs.delete_message(QueueUrl=src, ReceiptHandle=m["ReceiptHandle"])
    assert bodies == {f"m{i}" for i in range(15)}
    with pytest.raises(ClientError) as exc:
        sqs.cancel_message_move_task(TaskHandle=handle)
    assert _error(exc)[0] == "InvalidParameterValue"


def test_message_move_task_to_destination_and_errors(sqs: Any) -> None:
    _, arn, src = _redrive_pair(sqs)
    dest = sqs.create_queue(QueueName=unique("dest"))["QueueUrl"]
    _dead_letter(sqs, src, ["a", "b"])
    sqs.start_message_move_task(
        SourceArn=arn, DestinationArn=_arn(sqs, dest), MaxNumberOfMessagesPerSecond=100
    )
    wait_until(
        lambda: sqs.list_message_move_tasks(SourceArn=arn)["Results"][0]["Status"] == "COMPLETED"
    )
    got = sqs.receive_message(QueueUrl=dest, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == ["a", "b"]
    with pytest.raises(ClientError) as exc:
        sqs.start_message_move_task(SourceArn=_arn(sqs, src))
    assert _error(exc) == (
        "InvalidParameterValue",
        "Source queue must be configured as a Dead Letter Queue.",
    )
    with pytest.raises(ClientError) as exc:
        sqs.start_message_move_task(SourceArn=arn + "-gone")
    assert _error(exc) == (
        "ResourceNotFoundException",
        "The resource that you specified for the SourceArn parameter doesn't exist.",
    )
    with pytest.raises(ClientError) as exc:
        sqs.cancel_message_move_task(TaskHandle="not a handle")
    assert _error(exc) == ("InvalidParameterValue", "Value for parameter TaskHandle is invalid.")


def test_message_move_task_cancel(sqs: Any) -> None:
    _, arn, src = _redrive_pair(sqs)
    _dead_letter(sqs, src, [f"m{i}" for i in range(6)])
    handle = sqs.start_message_move_task(SourceArn=arn, MaxNumberOfMessagesPerSecond=1)[
        "TaskHandle"
    ]
    moved = sqs.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    assert 0 <= moved < 6
    task = wait_until(
        lambda: next(
            (
                t
                for t in sqs.list_message_move_tasks(SourceArn=arn, MaxResults=10)["Results"]
                if t["Status"] == "CANCELLED"
            ),
            None,
        )
    )
    assert task["ApproximateNumberOfMessagesMoved"] < 6


def test_deleted_dead_letter_queue_never_hides_a_message(sqs: Any) -> None:
    """Over maxReceiveCount with the dead-letter queue deleted, the message is
    delivered as usual (as SQS does), on every store; it used to be received
    and held back on every call, invisible and never returned."""
    dlq, _, src = _redrive_pair(sqs)
    sent = sqs.send_message(QueueUrl=src, MessageBody="keep me")["MessageId"]
    first = sqs.receive_message(QueueUrl=src, VisibilityTimeout=0)["Messages"]
    assert first[0]["MessageId"] == sent
    sqs.delete_queue(QueueUrl=dlq)
    for count in (2, 3):
        got = sqs.receive_message(QueueUrl=src, VisibilityTimeout=0, AttributeNames=["All"])
        [msg] = got["Messages"]
        assert msg["MessageId"] == sent
        assert msg["Attributes"]["ApproximateReceiveCount"] == str(count)
    msg = sqs.receive_message(QueueUrl=src, VisibilityTimeout=60)["Messages"][0]
    sqs.delete_message(QueueUrl=src, ReceiptHandle=msg["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["All"])["Attributes"]
    assert (
        attrs["ApproximateNumberOfMessages"]
        == attrs["ApproximateNumberOfMessagesNotVisible"]
        == "0"
    )
