"""The XML documents S3 and Azure Blob answer with (listings, errors), read without trusting them.

A listing or an error never declares a document type or entities: one that does is refused before the
parser sees it, so no entity is expanded from a tenant-chosen store's answer.
"""

from __future__ import annotations

import contextlib
from xml.etree import ElementTree

from .errors import UNAVAILABLE, SourceError

#: the largest listing page read (S3 and Azure pages hold at most 1,000 and 5,000 entries)
MAX_PAGE = 16 << 20


def _declares(body: bytes) -> bool:
    return b"<!DOCTYPE" in body or b"<!ENTITY" in body


def document(body: bytes, what: str, kind: str) -> ElementTree.Element:
    """The parsed document; SourceError (the store is unavailable) when it is not ``kind``."""
    if _declares(body):
        raise SourceError(UNAVAILABLE, f"{what}: the store's answer is not {kind}")
    try:
        return ElementTree.fromstring(body)
    except ElementTree.ParseError:
        raise SourceError(UNAVAILABLE, f"{what}: the store's answer is not {kind}") from None


def error_fields(body: bytes, *names: str) -> dict[str, str]:
    """The named top-level fields of an error document ("" for each missing one, or for no document)."""
    found = dict.fromkeys(names, "")
    if body and not _declares(body):
        with contextlib.suppress(ElementTree.ParseError):
            root = ElementTree.fromstring(body)
            found = {name: root.findtext(name) or "" for name in names}
    return found
