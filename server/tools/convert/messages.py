"""How ``kubeinfer convert`` talks back: the one error type (its message says what to change) and progress
lines on stderr."""

from __future__ import annotations

import sys


class ConvertError(ValueError):
    """Bad arguments or an unusable model; the message says what to change."""


def say(message: str) -> None:
    """A progress line on stderr (stdout carries the results)."""
    print(message, file=sys.stderr, flush=True)
