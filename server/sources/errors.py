"""What a source can do wrong, as a reason a status condition shows and a message that says what to fix.

Messages carry the store's own reason in words (an S3 error code, a registry's error code, an HTTP status),
never a credential, a signature or a pre-signed URL: whatever reaches a message may end in a status, an
event or a log line that the namespace's users read.
"""

from __future__ import annotations

#: the credentials were refused (or none were given where the store needs them)
UNAUTHORIZED = "SourceUnauthorized"
#: the bucket, object, repository, tag or revision does not exist
NOT_FOUND = "SourceNotFound"
#: over a limit, known from a listing or a manifest before the first byte, or counted while streaming
TOO_LARGE = "SourceTooLarge"
#: the egress guard refused an address or host (a tenant-chosen endpoint like any URL)
REFUSED = "SourceRefused"
#: the store is down or broke off: retried with backoff
UNAVAILABLE = "SourceUnavailable"
#: the URI, a listing or a manifest is not usable (bad form, a path that leaves the version folder)
INVALID = "SourceInvalid"
#: nothing pins the content (no sha256 given, no checksum, version or digest from the store)
CHECKSUM_REQUIRED = "ChecksumRequired"
#: the bytes do not match what pins them
CHECKSUM_MISMATCH = "ChecksumMismatch"

#: the caller stopped wanting it (the model was deleted or changed meanwhile)
CANCELLED = "Cancelled"

#: reasons that may go away by themselves: the operator retries them with backoff
TEMPORARY = frozenset({UNAVAILABLE})


class SourceError(Exception):
    """A source that cannot be had; ``reason`` is one of the names above, ``message`` says what to fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def printable(text: str, limit: int = 200) -> str:
    """A store's words for a message: one line, printable, at most ``limit`` characters."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[:limit] + "..."
