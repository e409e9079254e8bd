"""Parsing and validating SQS request parameters.

Each function takes the decoded JSON parameters of one request (or of one
batch entry) and returns a typed value, or raises the
:class:`~cmq.service.errors.SqsError` that SQS would answer with, whose
message says what was wrong. Nothing here touches a store or a clock.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any

from cmq.service import errors

__all__ = [
    "BAD_BODY_CHAR",
    "MAX_BATCH",
    "MAX_MESSAGE_ATTRIBUTES",
    "MAX_SEQ",
    "attr_wanted",
    "attributes_size",
    "entries",
    "failure",
    "fifo_seq",
    "get_int",
    "get_str",
    "message_attributes",
    "opt_int",
    "opt_str",
    "parse_int",
    "parse_receipt_handle",
    "receipt_handle",
    "str_list",
    "str_map",
]

#: Entries per batch request and message attributes per message (SQS limits).
MAX_BATCH = 10
MAX_MESSAGE_ATTRIBUTES = 10

_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ATTR_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[!-~]{1,250})?")
#: Characters SQS does not allow in a body or string attribute (outside XML 1.0's).
BAD_BODY_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)
#: An integer as a string: ASCII digits only (``str.isdigit`` also accepts
#: "²" and other digits ``int`` refuses), and no more than any SQS integer needs.
_INTEGER = re.compile(r"-?[0-9]{1,19}", re.ASCII)
#: Receipt handle sequence numbers are SQLite INTEGERs (signed 64-bit).
MAX_SEQ = 2**63 - 1


def parse_int(text: str) -> int | None:
    """The integer ``text`` spells in ASCII digits, or None."""
    text = text.strip()
    return int(text) if _INTEGER.fullmatch(text) else None


def get_str(p: Mapping[str, Any], key: str) -> str:
    value = p.get(key)
    if value is None:
        raise errors.MissingParameter(f"The request must contain the parameter {key}.")
    if not isinstance(value, str):
        raise errors.InvalidParameterValue(f"Value for parameter {key} must be a string.")
    return value


def opt_str(p: Mapping[str, Any], key: str) -> str | None:
    return None if p.get(key) is None else get_str(p, key)


def get_int(p: Mapping[str, Any], key: str, lo: int, hi: int, *, reason: str = "") -> int:
    value = p.get(key)
    if value is None:
        raise errors.MissingParameter(f"The request must contain the parameter {key}.")
    if isinstance(value, str):
        value = parse_int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidParameterValue(
            f"Value {str(p.get(key))[:50]} for parameter {key} is invalid. Reason: Must be an "
            "integer."
        )
    if not lo <= value <= hi:
        raise errors.InvalidParameterValue(
            f"Value {value} for parameter {key} is invalid. Reason: "
            + (reason or f"Must be between {lo} and {hi}, if provided.")
        )
    return value


def opt_int(p: Mapping[str, Any], key: str, lo: int, hi: int, *, reason: str = "") -> int | None:
    return None if p.get(key) is None else get_int(p, key, lo, hi, reason=reason)


def str_list(p: Mapping[str, Any], key: str) -> list[str] | None:
    value = p.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise errors.InvalidParameterValue(f"Value for parameter {key} must be a list of strings.")
    return value


def str_map(p: Mapping[str, Any], key: str) -> dict[str, str]:
    value = p.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise errors.InvalidParameterValue(
            f"Value for parameter {key} must be a map of strings to strings."
        )
    return value


def entries(p: Mapping[str, Any], action: str) -> list[dict[str, Any]]:
    """The entries of a batch ``action`` (e.g. ``SendMessageBatch``), checked as SQS does."""
    entries = p.get("Entries")
    if entries is None or entries == []:
        raise errors.EmptyBatchRequest(
            f"There should be at least one {action}RequestEntry in the request."
        )
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise errors.InvalidParameterValue("Value for parameter Entries must be a list of objects.")
    if len(entries) > MAX_BATCH:
        raise errors.TooManyEntriesInBatchRequest(
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}."
        )
    ids = []
    for e in entries:
        entry_id = e.get("Id")
        if not isinstance(entry_id, str) or not _BATCH_ID.fullmatch(entry_id):
            raise errors.InvalidBatchEntryId(
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long."
            )
        ids.append(entry_id)
    seen: set[str] = set()
    for entry_id in ids:
        if entry_id in seen:
            raise errors.BatchEntryIdsNotDistinct(f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def failure(entry_id: str, exc: errors.SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": exc.sender_fault,
        "Code": exc.query_code,
        "Message": exc.message,
    }


def message_attributes(p: Mapping[str, Any], key: str) -> dict[str, dict[str, str]]:
    value = p.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise errors.InvalidParameterValue(f"Value for parameter {key} must be a map.")
    if len(value) > MAX_MESSAGE_ATTRIBUTES:
        raise errors.InvalidParameterValue(
            f"Number of message attributes [{len(value)}] exceeds the allowed maximum "
            f"[{MAX_MESSAGE_ATTRIBUTES}]."
        )
    out: dict[str, dict[str, str]] = {}
    for name, attr in value.items():
        if (
            not _ATTR_NAME.fullmatch(name)
            or ".." in name
            or name.startswith(".")
            or name.endswith(".")
            or name.lower().startswith(("aws.", "amazon."))
        ):
            raise errors.InvalidParameterValue(f"Message attribute name {name[:300]!r} is invalid.")
        if not isinstance(attr, dict):
            raise errors.InvalidParameterValue(f"Message attribute {name!r} must be an object.")
        data_type = attr.get("DataType")
        if not isinstance(data_type, str) or not _DATA_TYPE.fullmatch(data_type):
            raise errors.InvalidParameterValue(
                f"The message attribute {name!r} has an invalid DataType; use String, Number "
                "or Binary, optionally with a .custom suffix."
            )
        if data_type.startswith("Binary"):
            raw = attr.get("BinaryValue")
            if not isinstance(raw, str):
                raise errors.InvalidParameterValue(
                    f"The message attribute {name!r} of type Binary needs a BinaryValue."
                )
            try:
                base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise errors.InvalidParameterValue(
                    f"The BinaryValue of message attribute {name!r} is not base64."
                ) from exc
            out[name] = {"DataType": data_type, "BinaryValue": raw}
        else:
            text = attr.get("StringValue")
            if not isinstance(text, str) or not text:
                raise errors.InvalidParameterValue(
                    f"Message (user) attribute '{name}' must contain a non-empty value of type "
                    f"'{data_type.partition('.')[0]}'."
                )
            if BAD_BODY_CHAR.search(text):
                raise errors.InvalidParameterValue(
                    f"The message attribute {name!r} has characters SQS does not allow."
                )
            if data_type.startswith("Number") and not (
                _NUMBER.fullmatch(text) and len(text.lstrip("+-")) <= 40
            ):
                raise errors.InvalidParameterValue(
                    f"The message attribute {name!r} of type Number has the non-numeric "
                    f"value {text[:50]!r}."
                )
            out[name] = {"DataType": data_type, "StringValue": text}
    return out


def attributes_size(attrs: Mapping[str, Mapping[str, str]]) -> int:
    size = 0
    for name, attr in attrs.items():
        size += len(name.encode()) + len(attr["DataType"].encode())
        if "BinaryValue" in attr:
            size += len(base64.b64decode(attr["BinaryValue"]))
        else:
            size += len(attr["StringValue"].encode())
    return size


def attr_wanted(name: str, wanted: Sequence[str]) -> bool:
    for w in wanted:
        if w in ("All", ".*") or w == name:
            return True
        if w.endswith(".*") and name.startswith(w[:-1]):
            return True
    return False


def fifo_seq(seq: int) -> str:
    return f"{seq:020d}"


def receipt_handle(name: str, seq: int, token: str) -> str:
    raw = f"{name}\n{seq}\n{token}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_receipt_handle(name: str, handle: str) -> tuple[int, str]:
    """Sequence number and token of a receipt handle. Raises ReceiptHandleIsInvalid."""
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
        queue, seq_text, token = raw.split("\n")
        seq = parse_int(seq_text) if seq_text.isascii() else None
        if queue != name or not token or seq is None or not 0 <= seq <= MAX_SEQ:
            raise ValueError("handle of another queue")
        return seq, token
    except (ValueError, binascii.Error) as exc:
        raise errors.ReceiptHandleIsInvalid(
            f'The input receipt handle "{handle[:1000]}" is not a valid receipt handle.'
        ) from exc
