"""Errors of the queue service, as SQS names them.

Every error the service answers with is a :class:`SqsError`, a
:class:`cmq.CmqError` (the one error tree of cmq), carrying what the SQS JSON
protocol needs to put on the wire: the modelled shape name (``__type``), the
classic query-protocol code (the ``x-amzn-query-error`` header, which botocore
maps back to its usual error codes), the HTTP status and whether the sender
is at fault. The operations and stores raise these; only the HTTP edge turns
them into responses, and it turns any other exception into a 500
``InternalError`` without losing the service.

:class:`StoreUnavailable` is the one store failure a caller may retry: the
backing store (SQLite file, Redis Cluster) refused or timed out. The original
exception is chained as ``__cause__``.
"""

from __future__ import annotations

from cmq._errors import CmqError

__all__ = [
    "AccessDenied",
    "BatchEntryIdsNotDistinct",
    "BatchRequestTooLong",
    "EmptyBatchRequest",
    "IncompleteSignature",
    "InvalidAction",
    "InvalidAttributeName",
    "InvalidAttributeValue",
    "InvalidBatchEntryId",
    "InvalidClientTokenId",
    "InvalidMessageContents",
    "InvalidParameterValue",
    "MessageNotInflight",
    "MissingAuthenticationToken",
    "MissingParameter",
    "OverLimit",
    "QueueDoesNotExist",
    "QueueNameExists",
    "ReceiptHandleIsInvalid",
    "RequestExpired",
    "RequestTooLarge",
    "ResourceNotFoundException",
    "SerializationError",
    "SignatureDoesNotMatch",
    "SqsError",
    "StoreUnavailable",
    "TooManyEntriesInBatchRequest",
    "UnsupportedOperation",
]


class SqsError(CmqError):
    """An error the service reports to its client in the SQS error shape.

    Class attributes give the wire form; subclasses only set them.
    """

    #: Modelled shape name; sent as ``__type: com.amazonaws.sqs#<type_name>``.
    type_name = "InternalError"
    #: Classic query-protocol code; sent in ``x-amzn-query-error``.
    query_code = "InternalError"
    status = 500
    sender_fault = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _SenderError(SqsError):
    status = 400
    sender_fault = True


class InvalidParameterValue(_SenderError):
    """A parameter has a value outside what SQS accepts."""

    type_name = query_code = "InvalidParameterValue"


class MissingParameter(_SenderError):
    """A required parameter is absent."""

    type_name = query_code = "MissingParameter"


class SerializationError(_SenderError):
    """The request body is not JSON of the shape the action expects."""

    type_name = query_code = "SerializationException"


class InvalidAction(_SenderError):
    """The ``X-Amz-Target`` names no action this service knows."""

    type_name = query_code = "UnknownOperationException"


class RequestTooLarge(_SenderError):
    """The HTTP request body is over the service's hard limit."""

    type_name = query_code = "RequestEntityTooLarge"
    status = 413


class QueueDoesNotExist(_SenderError):
    """The queue named by a URL or name does not exist."""

    type_name = "QueueDoesNotExist"
    query_code = "AWS.SimpleQueueService.NonExistentQueue"


class QueueNameExists(_SenderError):
    """CreateQueue on an existing name with different attributes."""

    type_name = "QueueNameExists"
    query_code = "QueueAlreadyExists"


class InvalidAttributeName(_SenderError):
    """An attribute name that SQS does not define."""

    type_name = query_code = "InvalidAttributeName"


class InvalidAttributeValue(_SenderError):
    """A queue attribute value out of range or of the wrong form."""

    type_name = query_code = "InvalidAttributeValue"


class InvalidMessageContents(_SenderError):
    """A message body with characters SQS does not allow."""

    type_name = query_code = "InvalidMessageContents"


class ReceiptHandleIsInvalid(_SenderError):
    """A receipt handle that this service did not issue for this queue."""

    type_name = query_code = "ReceiptHandleIsInvalid"


class MessageNotInflight(_SenderError):
    """ChangeMessageVisibility on a message that is not in flight."""

    type_name = "MessageNotInflight"
    query_code = "AWS.SimpleQueueService.MessageNotInflight"


class TooManyEntriesInBatchRequest(_SenderError):
    """More than 10 entries in a batch."""

    type_name = "TooManyEntriesInBatchRequest"
    query_code = "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"


class EmptyBatchRequest(_SenderError):
    """A batch with no entries."""

    type_name = "EmptyBatchRequest"
    query_code = "AWS.SimpleQueueService.EmptyBatchRequest"


class BatchEntryIdsNotDistinct(_SenderError):
    """Two entries of a batch share an ``Id``."""

    type_name = "BatchEntryIdsNotDistinct"
    query_code = "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"


class InvalidBatchEntryId(_SenderError):
    """A batch entry ``Id`` that is empty, too long or has bad characters."""

    type_name = "InvalidBatchEntryId"
    query_code = "AWS.SimpleQueueService.InvalidBatchEntryId"


class BatchRequestTooLong(_SenderError):
    """A SendMessageBatch whose bodies add up to more than the limit."""

    type_name = "BatchRequestTooLong"
    query_code = "AWS.SimpleQueueService.BatchRequestTooLong"


class UnsupportedOperation(_SenderError):
    """An action that SQS defines but this service does not implement."""

    type_name = "UnsupportedOperation"
    query_code = "AWS.SimpleQueueService.UnsupportedOperation"


class AccessDenied(_SenderError):
    """The edge refused the request: another origin, an unknown Host, or an
    unauthenticated client that is not on loopback."""

    type_name = query_code = "AccessDenied"
    status = 403


class MissingAuthenticationToken(_SenderError):
    """Auth is on and the request carries no signature."""

    type_name = query_code = "MissingAuthenticationToken"
    status = 403


class IncompleteSignature(_SenderError):
    """A SigV4 signature that is malformed."""

    type_name = query_code = "IncompleteSignature"


class InvalidClientTokenId(_SenderError):
    """A SigV4 signature by an access key the server does not know."""

    type_name = query_code = "InvalidClientTokenId"
    status = 403


class SignatureDoesNotMatch(_SenderError):
    """A SigV4 signature that does not verify."""

    type_name = query_code = "SignatureDoesNotMatch"
    status = 403


class RequestExpired(_SenderError):
    """A signed request whose date is more than 15 minutes from the server's."""

    type_name = query_code = "RequestExpired"


class OverLimit(_SenderError):
    """An action would pass a limit (AddPermission's actions, the node's bounds)."""

    type_name = query_code = "OverLimit"
    status = 403


class ResourceNotFoundException(_SenderError):
    """A message move task, or the queue an ARN names, does not exist."""

    type_name = query_code = "ResourceNotFoundException"


class StoreUnavailable(SqsError):
    """The backing store failed or timed out; the request may be retried.

    The store's own exception is chained as ``__cause__``.
    """

    type_name = query_code = "ServiceUnavailable"
    status = 503
