"""The classic SQS query protocol, sans-IO: form in, XML out.

SDKs released before SQS moved to JSON (late 2023) send
``application/x-www-form-urlencoded`` bodies such as
``Action=SendMessage&QueueUrl=...&MessageAttribute.1.Name=a&...`` and read
XML replies in the ``2012-11-05`` namespace. This module maps such a request
onto the JSON parameters that :class:`~cmq.service.operations.QueueService`
takes, and its JSON result back onto the query protocol's XML, so both
protocols share every line of the queue logic.

Flattened names map as SQS defines them: ``Attribute.N.Name/Value`` is the
``Attributes`` map, ``AttributeName.N`` the ``AttributeNames`` list,
``MessageAttribute.N.Name`` with ``.Value.DataType`` / ``.Value.StringValue``
/ ``.Value.BinaryValue`` the ``MessageAttributes`` map, and
``<Action>RequestEntry.N.<field>`` the batch ``Entries``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from cmq.service.errors import InvalidAction, SerializationError, SqsError
from cmq.service.protocol import ACTIONS, UNSUPPORTED_ACTIONS, Request

__all__ = ["FORM_CONTENT_TYPE", "decode_form", "encode_xml_error", "encode_xml_result"]

FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
_NS = "http://queue.amazonaws.com/doc/2012-11-05/"
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
}
# Indexes are ASCII digits, at most 9 of them ("\d" alone also matches "²",
# which int() refuses); anything else is an unknown parameter name.
_ENTRY = re.compile(r"(\w+BatchRequestEntry)\.([0-9]{1,9})\.(.+)", re.ASCII | re.DOTALL)
_INDEXED = re.compile(r"(\w+?)\.([0-9]{1,9})\.(.+)", re.ASCII | re.DOTALL)
_INDEX = re.compile(r"[0-9]{1,9}", re.ASCII)


def decode_form(body: bytes, path: str) -> Request:
    """Decode a query-protocol request; ``path`` may carry the queue URL's path.

    Raises SerializationError for a body that is not a form and InvalidAction
    for a missing or unknown ``Action``.
    """
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except (UnicodeDecodeError, ValueError) as exc:
        raise SerializationError(f"The request body is not a valid form: {exc}") from exc
    flat = dict(pairs)
    action = flat.pop("Action", "")
    flat.pop("Version", None)
    if action not in ACTIONS and action not in UNSUPPORTED_ACTIONS:
        raise InvalidAction(f"Unknown or missing Action {action[:64]!r}.")
    params = _unflatten(flat)
    if action == "TagQueue" and "tags" in params:
        params["Tags"] = params.pop("tags")  # Tag.N.Key/Value: CreateQueue's tags, TagQueue's Tags
    if "QueueUrl" not in params and path.strip("/"):
        # Old SDKs (boto 2) address the queue by the request path.
        params["QueueUrl"] = path
    return Request(action=action, params=params)


def _unflatten(flat: Mapping[str, str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    lists: dict[str, dict[int, str]] = {}
    entries: dict[int, dict[str, str]] = {}
    groups: dict[str, dict[int, dict[str, str]]] = {}
    for key, value in flat.items():
        m = _ENTRY.fullmatch(key)
        if m:
            entries.setdefault(int(m.group(2)), {})[m.group(3)] = value
            continue
        m = _INDEXED.fullmatch(key)
        if m:
            groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = value
            continue
        name, dot, index = key.rpartition(".")
        if dot and _INDEX.fullmatch(index) and name in _LISTS:
            lists.setdefault(_LISTS[name], {})[int(index)] = value
            continue
        params[key] = value
    for name, indexed in lists.items():
        params[name] = [indexed[i] for i in sorted(indexed)]
    for group, items in groups.items():
        ordered = [items[i] for i in sorted(items)]
        if group == "Attribute":
            params["Attributes"] = {i.get("Name", ""): i.get("Value", "") for i in ordered}
        elif group in ("MessageAttribute", "MessageSystemAttribute"):
            params[group + "s"] = _attributes(ordered)
        elif group == "Tag":
            params["tags"] = {i.get("Key", ""): i.get("Value", "") for i in ordered}
    if entries:
        params["Entries"] = [_unflatten(entries[i]) for i in sorted(entries)]
    return params


def _attributes(items: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for item in items:
        value = {k.removeprefix("Value."): v for k, v in item.items() if k.startswith("Value.")}
        out[item.get("Name", "")] = value
    return out


def encode_xml_result(
    action: str, result: Mapping[str, Any]
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and XML body of a successful query-protocol reply."""
    inner = "".join(_element(action, key, value) for key, value in result.items())
    body = (
        f'<?xml version="1.0"?><{action}Response xmlns="{_NS}">'
        + (f"<{action}Result>{inner}</{action}Result>" if result else "")
        + f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
        f"</{action}Response>"
    ).encode()
    return 200, _headers(body), body


def encode_xml_error(error: SqsError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and XML body of an error, in the query protocol's shape."""
    fault = "Sender" if error.sender_fault else "Receiver"
    body = (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{_NS}"><Error><Type>{fault}</Type>'
        f"<Code>{_text(error.query_code)}</Code><Message>{_text(error.message)}</Message>"
        f"<Detail/></Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
    ).encode()
    return error.status, _headers(body), body


def _headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"text/xml"), (b"content-length", str(len(body)).encode())]


def _element(action: str, key: str, value: Any) -> str:
    if key in ("QueueUrls", "queueUrls"):
        return "".join(f"<QueueUrl>{_text(u)}</QueueUrl>" for u in value)
    if key == "Tags":
        return "".join(
            f"<Tag><Key>{_text(k)}</Key><Value>{_text(v)}</Value></Tag>" for k, v in value.items()
        )
    if key == "Results":
        return "".join(
            "<ListMessageMoveTasksResultEntry>"
            + "".join(_element(action, k, v) for k, v in e.items())
            + "</ListMessageMoveTasksResultEntry>"
            for e in value
        )
    if key == "Attributes":
        return "".join(
            f"<Attribute><Name>{_text(k)}</Name><Value>{_text(v)}</Value></Attribute>"
            for k, v in value.items()
        )
    if key == "MessageAttributes":
        return "".join(
            f"<MessageAttribute><Name>{_text(k)}</Name><Value>"
            + "".join(f"<{f}>{_text(str(x))}</{f}>" for f, x in v.items())
            + "</Value></MessageAttribute>"
            for k, v in value.items()
        )
    if key == "Messages":
        return "".join(
            "<Message>" + "".join(_element(action, k, v) for k, v in m.items()) + "</Message>"
            for m in value
        )
    if key in ("Successful", "Failed"):
        tag = f"{action}ResultEntry" if key == "Successful" else "BatchResultErrorEntry"
        return "".join(
            f"<{tag}>" + "".join(_element(action, k, v) for k, v in e.items()) + f"</{tag}>"
            for e in value
        )
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return f"<{key}>{_text(text)}</{key}>"


#: Characters XML 1.0 cannot carry at all, not even as character references.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    """XML text of ``value``. Input validation keeps such characters out of
    everything stored; an error message may still echo one from a request,
    and it becomes U+FFFD rather than a reply no XML parser can read."""
    return escape(_NOT_XML.sub("\ufffd", value))
