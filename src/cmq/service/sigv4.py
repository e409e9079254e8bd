"""AWS Signature Version 4 verification of a request, sans-IO.

The server recomputes the signature the client's SDK made (``Authorization:
AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/SERVICE/aws4_request,
SignedHeaders=..., Signature=...`` with an ``X-Amz-Date`` header) from the
secret it holds for the access key, and compares. The canonical request is
built exactly as botocore builds it: method, the path (URI-encoded once more,
as for every service but S3), the sorted query, the signed headers (lower
case, values with runs of spaces folded), the list of signed headers, and the
SHA-256 of the body (or ``X-Amz-Content-SHA256`` when the client sent one).

Errors are the ones AWS answers with (API reference, "Common Errors"):
``MissingAuthenticationToken`` (no signature), ``IncompleteSignature`` (a
malformed one), ``InvalidClientTokenId`` (unknown key), ``SignatureDoesNotMatch``
and ``RequestExpired`` (a date more than 15 minutes from the server's clock).
Presigned URLs (signature in the query string) are not accepted.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from urllib.parse import quote

from cmq.service import errors

__all__ = ["MAX_SKEW_SECONDS", "load_keys", "verify"]

#: AWS refuses a request whose X-Amz-Date is this far from its clock.
MAX_SKEW_SECONDS = 15 * 60

_ALGORITHM = "AWS4-HMAC-SHA256"
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=([0-9a-f]{64})"
)
_DATE = re.compile(r"\d{8}T\d{6}Z")


def load_keys(text: str, source: str) -> dict[str, str]:
    """Parse an auth file: one ``ACCESS_KEY_ID SECRET_ACCESS_KEY`` pair a line.

    Blank lines and lines starting with ``#`` are skipped. Raises ValueError
    naming ``source`` and the line for anything else.
    """
    keys: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(
                f"{source}:{number}: expected 'ACCESS_KEY_ID SECRET_ACCESS_KEY', "
                f"found {len(parts)} fields"
            )
        keys[parts[0]] = parts[1]
    if not keys:
        raise ValueError(f"{source}: no access key pairs")
    return keys


def _trim(value: str) -> str:
    return " ".join(value.split())


def _canonical_path(raw_path: str) -> str:
    """The path as botocore signs it: dot segments and empty segments removed
    from the path as sent (already URI-encoded), then URI-encoded once more."""
    if not raw_path:
        return "/"
    out: list[str] = []
    for part in raw_path.split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part and part != ".":
            out.append(part)
    path = ("/" if raw_path[0] == "/" else "") + "/".join(out)
    if raw_path[-1] == "/" and out:
        path += "/"
    return quote(path, safe="/~")


def _canonical_query(query: str) -> str:
    if not query:
        return ""
    pairs = [pair.partition("=") for pair in query.split("&")]
    return "&".join(f"{k}={v}" for k, _, v in sorted(pairs))


def verify(
    *,
    method: str,
    raw_path: str,
    query: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    keys: Mapping[str, str],
    now: float,
) -> str:
    """Check the request's SigV4 signature; return the access key id that made it.

    ``headers`` are (lower-case name, value) pairs as received; ``now`` is
    the server's Unix time. Raises an SqsError subclass (see module doc).
    """
    auth = [v for k, v in headers if k == "authorization"]
    if not auth:
        if "X-Amz-Signature=" in query or "Signature=" in query:
            raise errors.IncompleteSignature(
                "Presigned requests (a signature in the query string) are not supported."
            )
        raise errors.MissingAuthenticationToken("Request is missing Authentication Token")
    if len(auth) != 1 or not auth[0].startswith(_ALGORITHM):
        raise errors.IncompleteSignature(
            "Authorization header requires the AWS4-HMAC-SHA256 algorithm."
        )
    m = _AUTH.fullmatch(auth[0].strip())
    if m is None:
        raise errors.IncompleteSignature(
            "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' "
            "parameters."
        )
    credential, signed, signature = m.groups()
    scope = credential.split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        raise errors.IncompleteSignature(
            f"Credential should be scoped to a valid region, not {credential[:200]!r}."
        )
    key_id, day, region, service = scope[:4]
    secret = keys.get(key_id)
    if secret is None:
        raise errors.InvalidClientTokenId("The security token included in the request is invalid.")
    dates = [v for k, v in headers if k == "x-amz-date"]
    if len(dates) != 1 or not _DATE.fullmatch(dates[0]):
        raise errors.IncompleteSignature(
            "Authorization header requires an X-Amz-Date header of the form YYYYMMDDTHHMMSSZ."
        )
    amz_date = dates[0]
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError as exc:
        raise errors.IncompleteSignature(f"X-Amz-Date {amz_date!r} is not a date.") from exc
    if abs(when - now) > MAX_SKEW_SECONDS:
        raise errors.RequestExpired(
            f"Request has expired: X-Amz-Date {amz_date} is more than 15 minutes from the "
            "server's time."
        )
    if day != amz_date[:8]:
        raise errors.SignatureDoesNotMatch("Credential should be scoped to the date of X-Amz-Date.")
    names = signed.split(";")
    if "host" not in names or names != sorted(set(names)):
        raise errors.IncompleteSignature("SignedHeaders must be sorted, distinct and include host.")
    values: dict[str, list[str]] = {}
    for k, v in headers:
        values.setdefault(k, []).append(v)
    missing = [n for n in names if n not in values]
    if missing:
        raise errors.SignatureDoesNotMatch(
            f"The request signature we calculated does not match the signature you provided: "
            f"signed header {missing[0]!r} is absent."
        )
    canonical_headers = "".join(f"{n}:{','.join(_trim(v) for v in values[n])}\n" for n in names)
    content_sha = values.get("x-amz-content-sha256")
    payload = content_sha[0] if content_sha else hashlib.sha256(body).hexdigest()
    if (
        content_sha
        and payload != "UNSIGNED-PAYLOAD"
        and payload != hashlib.sha256(body).hexdigest()
    ):
        raise errors.SignatureDoesNotMatch(
            "The provided X-Amz-Content-SHA256 does not match the body."
        )
    canonical = "\n".join(
        [
            method.upper(),
            _canonical_path(raw_path),
            _canonical_query(query),
            canonical_headers,
            signed,
            payload,
        ]
    )
    scope_text = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        [_ALGORITHM, amz_date, scope_text, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{secret}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise errors.SignatureDoesNotMatch(
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method. Consult the service "
            "documentation for details."
        )
    return key_id
